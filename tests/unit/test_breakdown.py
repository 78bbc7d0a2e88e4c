"""The exclusive breakdown of each process's time to ready (lane field `breakdown`) and the
critical path that adds up to time to ready: against a brute-force ground truth (the innermost
span at every instant) and on a vLLM-like run (busy loops serving startup calls, a helper
started after ready, a subprocess waited for)."""

from __future__ import annotations

import itertools
import random

from finding_runs import MS, T0, Builder
from hypothesis import given, settings
from hypothesis import strategies as st

from starttrace.analysis.breakdown import sweep, totals
from starttrace.analysis.critical_path import path_phases
from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import RunModel
from starttrace.views.json import to_json


def _nested(rng: random.Random, start: int, end: int, depth: int, out: list[tuple[int, int, int, str]]) -> None:
    """Properly nested spans inside [start, end] (one thread's stack)."""
    t = start
    while t < end and depth < 5:
        s = rng.randint(t, end)
        e = rng.randint(s, end)
        if e > s:
            out.append((s, e, depth, rng.choice(["import", "compile", "model_load", "idle"])))
            if rng.random() < 0.6:
                _nested(rng, s, e, depth + 1, out)
        t = e + rng.randint(0, 3)
        if rng.random() < 0.3:
            break


def _innermost_at(spans: list[tuple[int, int, int, str]], t: int) -> str:
    """Ground truth: of the spans open at instant t, the one that started last (the deeper on a
    tie); its phase (a busy loop's as `wait`), else unexplained."""
    open_at = [sp for sp in spans if sp[0] <= t < sp[1]]
    if not open_at:
        return "unexplained"
    phase = max(open_at, key=lambda sp: (sp[0], sp[2]))[3]
    return "wait" if phase == "idle" else phase


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32))
def test_the_timeline_is_the_innermost_span_at_every_instant(seed: int) -> None:
    rng = random.Random(seed)
    spans: list[tuple[int, int, int, str]] = []
    _nested(rng, 0, 200, 0, spans)
    low, high = rng.randint(0, 20), rng.randint(150, 220)
    clipped = [(max(s, low), min(e, high), d, ph) for s, e, d, ph in spans if min(e, high) > max(s, low)]
    timeline = sweep(clipped, low, high)
    # the segments tile the window
    assert timeline[0][0] == low and timeline[-1][1] == high
    assert all(a[1] == b[0] for a, b in itertools.pairwise(timeline))
    for a, b, label in timeline:
        for t in range(a, b):
            assert label == _innermost_at(spans, t), (t, label)
    assert sum(totals(timeline).values()) == high - low


def _vllm_like() -> RunModel:
    b = Builder(["/venv/bin/vllm", "serve", "m"])
    api = b.proc(100, 1, "api_server", "root", None, 0, 12_000)
    b.span(api, "import vllm", 10, 1_000)
    config = b.span(api, "vllm.create_engine_config", 1_000, 4_000, phase="config")
    b.span(api, "process.launch", 1_010, 1_020, config, phase="launch", child_pid=150, start_method="exec")
    b.span(api, "process.wait", 1_020, 3_500, config, phase="wait", child_pid=150)
    helper = b.proc(150, 100, "helper", "exec", None, 1_015, 3_490)
    b.span(helper, "import vllm.model_executor.models", 1_050, 2_000)
    # 2_000 .. 3_490: the helper's inspection, no span of its own; the API server waits till 3_500
    launch = b.span(api, "process.launch", 4_000, 4_010, phase="launch", child_pid=101, start_method="spawn")
    init = b.span(api, "vllm.async_llm.init", 4_000, 9_800, phase="engine_init")
    b.span(api, "vllm.wait_for_engine_core", 4_010, 9_790, init, phase="engine_init")
    b.span(api, "uvicorn.startup", 9_800, 9_900, phase="server_startup")
    eng = b.proc(101, 100, "engine_core", "spawn", launch, 4_005, 12_000)
    b.span(eng, "process.bootstrap", 4_010, 5_000, phase="bootstrap")
    core = b.span(eng, "vllm.engine_core.init", 5_000, 9_780, phase="engine_init")
    fork = b.span(eng, "process.launch", 5_010, 5_020, core, phase="launch", child_pid=110, start_method="spawn")
    b.span(eng, "vllm.engine_core.init_kv_caches", 7_000, 9_700, core, phase="kv_cache")
    w = b.proc(110, 101, "worker", "spawn", fork, 5_020, 12_000, rank=0, world_size=1)
    b.span(w, "process.bootstrap", 5_030, 6_000, phase="bootstrap")
    b.span(w, "import torch", 5_100, 5_900)
    load = b.span(w, "vllm.model_load", 6_000, 6_900, phase="model_load")
    b.span(w, "import safetensors", 6_100, 6_200, load)
    b.span(w, "weights.load", 6_300, 6_800, load, phase="model_load")
    loop = b.span(w, "vllm.worker.busy_loop", 6_950, 12_000, phase="idle")
    profile = b.span(w, "vllm.kv_cache.profile", 7_010, 9_000, loop, phase="kv_cache")
    graph = b.span(w, "compile.graph", 7_100, 8_500, profile, phase="compile")
    b.span(w, "process.wait", 7_200, 7_400, graph, phase="wait", child_pid=999)  # gcc: no lane, compile's work
    b.span(w, "vllm.kv_cache.allocate", 9_100, 9_690, loop, phase="kv_cache")
    b.span(w, "vllm.compile_or_warm_up", 11_000, 11_500, loop, phase="compile")  # after ready: not startup
    late = b.proc(160, 100, "helper", "exec", None, 10_500, 10_800)
    b.span(late, "import json", 10_510, 10_520)
    return build_model(b.build(ready_at=9_950))


def test_each_process_breakdown_adds_up_to_its_time_to_ready() -> None:
    m = _vllm_like()
    doc = to_json(m)
    for lane, row in zip(m.lanes, doc["lanes"], strict=True):
        if lane.after_ready:
            assert lane.breakdown == {} and row["breakdown"] == {} and row["after_ready"] is True
            continue
        assert sum(lane.breakdown.values()) == lane.end - lane.start, lane.label
        assert abs(sum(row["breakdown"].values()) - (row["end_s"] - row["start_s"])) < 1e-5
    by_label = {ln.label: ln for ln in m.lanes}
    worker = by_label["worker rank 0 pid 110"]
    assert worker.end == T0 + 9_690 * MS  # ready: the end of its last startup call before the run's ready
    bd = {k: v / MS for k, v in worker.breakdown.items()}
    assert "idle" not in bd
    # the busy loop between startup calls is waiting, not idle: 6950-7010, 9000-9100
    assert bd["wait"] == 60 + 100
    assert bd["compile"] == 1_400  # inside the memory profile: the innermost span counts (its gcc wait too)
    assert bd["kv_cache"] == (9_000 - 7_010 - 1_400) + (9_690 - 9_100)
    assert bd["import"] == 800 + 100  # torch in bootstrap, safetensors in the model load
    assert bd["model_load"] == 900 - 100
    assert bd["bootstrap"] == 970 - 800
    late = by_label["helper pid 160"]
    assert late.after_ready and late.breakdown == {}
    assert not by_label["helper pid 150"].after_ready


def test_the_critical_path_follows_a_wait_into_the_subprocess() -> None:
    m = _vllm_like()
    path = m.critical_path
    assert path[0].start == m.t0 and path[-1].end == m.ready_ns
    assert all(a.end == b.start for a, b in itertools.pairwise(path)), "the steps tile start to ready"
    helper = next(ln.index for ln in m.lanes if ln.pid == 150)
    in_helper = [(st.name, st.kind) for st in path if st.lane == helper]
    assert ("import vllm.model_executor.models", "span") in in_helper
    # the helper's inspection (no span) is its own time on the path, not the API server's config
    assert sum(st.end - st.start for st in path if st.lane == helper) >= (3_490 - 1_050) * MS
    # from its last record to the wait's return: the helper exiting, on its own lane
    exiting = [(st.lane, st.kind, st.start, st.end) for st in path if st.name == "(exiting)"]
    assert exiting == [(helper, "gap", T0 + 3_490 * MS, T0 + 3_500 * MS)]
    config_self = sum(st.end - st.start for st in path if st.name == "vllm.create_engine_config")
    assert config_self == (4_000 - 3_500 + 1_010 - 1_000) * MS  # after the wait, and before the launch
    phases = path_phases(m)
    assert sum(phases.values()) == m.ready_ns - m.t0
    assert phases["compile"] == 1_400 * MS  # the worker's compile is on the path
    assert "idle" not in phases


def test_the_report_shows_breakdowns_and_folds_processes_started_after_ready() -> None:
    import io

    from rich.console import Console

    from starttrace.views.terminal import render_report

    m = _vllm_like()
    out = io.StringIO()
    render_report(m, Console(file=out, width=200, force_terminal=False, color_system=None), full=True)
    text = out.getvalue()
    assert "where each process's time to ready went" in text
    assert "after ready: 1 more process(es) (helper; pids 160), not part of time to ready" in text
    assert "helper pid 160" not in text  # folded: no row of its own
    assert "helper pid 150" in text
    assert any(line.strip() == "time to ready by phase" for line in text.splitlines())
    rows = [line for line in text.splitlines() if line.startswith("worker rank 0 pid 110")]
    assert rows, text
    # the worker's row in the breakdown table: its total, then its parts, which add up to it
    breakdown_row = next(r for r in rows if r.split()[5].replace(".", "").isdigit() and "%" not in r)
    numbers = [float(x) for x in breakdown_row.split()[5:]]
    assert abs(numbers[0] - sum(numbers[1:])) < 0.01, breakdown_row


def test_the_report_folds_children_that_are_not_python_into_one_note() -> None:
    import io

    from rich.console import Console

    from starttrace.views.terminal import render_report

    m = _vllm_like()
    not_python = "has no journal: not a Python process"
    m.problems = [
        f"pid 7 launched by worker rank 0 pid 110 (process.launch `uname -p`) {not_python} (uname)",
        f"pid 8 launched by worker rank 0 pid 110 (process.launch `g++ a.cpp`) {not_python} (g++)",
        f"pid 9 launched by worker rank 0 pid 110 (process.launch `g++ b.cpp`) {not_python} (g++)",
        "pid 10 launched by api_server pid 100 (process.launch) has no journal: killed by signal 9 before tracing",
    ]
    out = io.StringIO()
    render_report(m, Console(file=out, width=300, force_terminal=False, color_system=None))
    text = out.getvalue()
    assert "note: 3 children not Python, so not traced (expected): g++ x2, uname" in text
    assert "warning: pid 10 launched by api_server pid 100" in text  # a real problem stays a warning
    assert "pid 8 launched" not in text
