"""The critical path goes inside a span that waited on more than one thing (vLLM's
`vllm.engine_core.init`: the executor's wait for its workers, then the KV cache set-up, then time
of its own), and keeps an import with nested imports as one step."""

from __future__ import annotations

import io
import itertools

from finding_runs import MS, T0, Builder
from rich.console import Console

from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import RunModel
from starttrace.views.html import PHASE_COLORS, environment, render_page
from starttrace.views.json import to_json
from starttrace.views.terminal import render_report


def _vllm_like(kv_last_rank: int = 1) -> RunModel:
    b = Builder(["/venv/bin/vllm", "serve", "m"])
    api = b.proc(100, 1, "api_server", "root", None, 0, 10_000)
    big = b.span(api, "import big", 10, 90)
    b.span(api, "import big.sub", 20, 80, big)
    launch = b.span(api, "process.launch", 100, 110, phase="launch", child_pid=101, start_method="spawn")
    init = b.span(api, "vllm.async_llm.init", 100, 9_000, phase="engine_init")
    b.span(api, "vllm.wait_for_engine_core", 110, 8_990, init, phase="engine_init")
    b.span(api, "vllm.api_server.build_app", 9_000, 9_500, phase="api_server")
    eng = b.proc(101, 100, "engine_core", "spawn", launch, 105, 10_000)
    b.span(eng, "process.bootstrap", 110, 2_000, phase="bootstrap")
    core = b.span(eng, "vllm.engine_core.init", 2_000, 8_985, phase="engine_init")
    executor = b.span(eng, "vllm.executor.init", 2_010, 6_000, core, phase="executor_init")
    wait = b.span(eng, "vllm.executor.wait_for_workers", 2_020, 6_000, executor, phase="executor_init")
    b.span(eng, "vllm.engine_core.init_kv_caches", 6_000, 7_000, core, phase="kv_cache")
    # 7_000 .. 8_985: the engine core's own work inside its init (no span of its own)
    for r in range(2):
        fork = b.span(eng, "process.launch", 2_030 + 10 * r, 2_040 + 10 * r, wait, phase="launch", child_pid=110 + r)
        w = b.proc(110 + r, 101, "worker", "spawn", fork, 2_040 + 10 * r, 10_000, rank=r, world_size=2)
        booted = 4_000 + 500 * r  # rank 1 boots slower
        b.span(w, "process.bootstrap", 2_050 + 10 * r, booted, phase="bootstrap")
        b.span(w, "vllm.model_load", booted, 5_900 + 90 * r, phase="model_load")  # rank 1 loaded last
        loop = b.span(w, "vllm.worker.busy_loop", 5_990, 10_000, phase="idle")
        kv_end = 6_990 if r == kv_last_rank else 6_890
        b.span(w, "vllm.kv_cache.allocate", 6_010, kv_end, loop, phase="kv_cache")
    return build_model(b.build(ready_at=9_600))


def test_the_path_goes_inside_the_engine_core_init() -> None:
    m = _vllm_like()
    steps = [(m.lanes[st.lane].label, st.name, st.kind) for st in m.critical_path]
    assert ("engine_core pid 101", "vllm.engine_core.init", "span") not in steps, "not one 7 s step"
    own = [st for st in m.critical_path if st.name == "vllm.engine_core.init"]
    assert ("self", T0 + 7_000 * MS, T0 + 8_985 * MS) in [(st.kind, st.start, st.end) for st in own]
    assert {st.kind for st in own} == {"self"}
    assert ("engine_core pid 101", "vllm.engine_core.init_kv_caches", "wait") in steps
    for name in ("vllm.kv_cache.allocate", "vllm.model_load", "process.bootstrap"):  # the slowest rank
        assert ("worker rank 1 pid 111", name, "span") in steps
    assert not any(label.startswith("worker rank 0") for label, _, _ in steps)
    assert ("api_server pid 100", "vllm.api_server.build_app", "span") in steps
    starts = [st.start for st in m.critical_path]
    assert starts == sorted(starts)
    # the steps tile the run's start to its ready: no overlap, no hole
    assert m.critical_path[0].start == m.t0
    assert all(a.end == b.start for a, b in itertools.pairwise(m.critical_path))
    assert m.critical_path[-1].end == m.ready_ns
    for a, b in itertools.pairwise(m.critical_path):
        assert a.end <= b.start, (a, b)  # steps never overlap


def test_an_import_stays_one_step() -> None:
    steps = [(st.name, st.kind) for st in _vllm_like().critical_path]
    assert ("import big", "span") in steps
    assert not any(name == "import big.sub" for name, _ in steps)


def test_an_idle_rank_hands_the_path_back_to_the_engine_core() -> None:
    """Rank 0 finishes the KV cache last, but before it rank 0 sat idle (model loaded at 5.9 s)
    until the engine core's executor init ended (6.0 s), which waited for rank 1 (loaded at
    5.99 s): the path leaves rank 0 there and goes through rank 1's model load and bootstrap."""
    m = _vllm_like(kv_last_rank=0)
    steps = [(m.lanes[st.lane].label, st.name, st.kind) for st in m.critical_path]
    assert ("worker rank 0 pid 110", "vllm.kv_cache.allocate", "span") in steps
    assert ("worker rank 0 pid 110", "vllm.model_load", "span") not in steps
    assert ("worker rank 0 pid 110", "process.bootstrap", "span") not in steps
    assert ("worker rank 1 pid 111", "vllm.model_load", "span") in steps
    assert ("worker rank 1 pid 111", "process.bootstrap", "span") in steps
    for a, b in itertools.pairwise(m.critical_path):
        assert a.end <= b.start, (a, b)


def test_the_path_per_process_in_json_terminal_and_page() -> None:
    """Which process holds how much of the time to ready: the sums of its steps, most first, the
    same in the JSON, `starttrace report` and the page."""
    m = _vllm_like()
    expected: dict[str, float] = {}
    for st in m.critical_path:
        label = m.lanes[st.lane].label
        expected[label] = expected.get(label, 0.0) + (st.end - st.start) / 1e9
    doc = to_json(m, include_spans=False)
    rows = doc["critical_path_by_lane"]
    assert [r["label"] for r in rows] == sorted(expected, key=lambda k: -expected[k])
    for r in rows:
        assert abs(r["seconds"] - expected[r["label"]]) < 1e-6
    assert rows[0]["label"] == "worker rank 1 pid 111"  # bootstrap, model load and KV cache: 4.9 s

    out = io.StringIO()
    render_report(m, Console(file=out, width=80, force_terminal=False, color_system=None), full=True)
    text = out.getvalue()
    table = text[text.index("critical path per process") :]
    assert table.splitlines()[3].split()[:5] == ["worker", "rank", "1", "pid", "111"]
    assert f"{expected['worker rank 1 pid 111']:.3f}" in table

    page = render_page(environment(), "startup.html", run=doc, phase_colors=PHASE_COLORS)
    section = page[page.index('id="critical-path-by-process"') :]
    section = section[: section.index("</table>")]
    assert section.index("worker rank 1 pid 111") < section.index("engine_core pid 101")
