"""Start kinds, fingerprints, compare's causes and the CI gate on small real run tables: one
process that imports, compiles (a cache hit or miss per graph), loads weights (a page-cache share)
and becomes ready; `starttrace compare --max-regression` on their journals' models through the CLI."""

from __future__ import annotations

from typing import Any

import pytest

from starttrace.analysis.causes import GATE_PASS, GATE_REGRESSION, GATE_UNLIKE, causes, gate
from starttrace.analysis.compare import compare
from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import RunModel
from starttrace.analysis.start_kind import fingerprint, start_kind
from starttrace.run import Process, Run, Span, spans_table

S = 1_000_000_000
T0 = 1_760_000_000 * S


def one_start(
    run_id: str,
    imports_s: float = 5.0,
    compile_s: float = 30.0,
    load_s: float = 10.0,
    cache: tuple[str, ...] = ("miss", "miss"),
    page_cache: float = 1.0,
    tp: int = 2,
    vllm: str = "0.32.0",
    gap_s: float = 0.0,
) -> RunModel:
    """A vLLM-like start: imports, then one compile.graph per `cache` verdict, then two weight files."""
    res = {"service.name": "vllm", "service.version": vllm, "starttrace.start_method": "root", "host.name": "h"}
    t = T0
    rows: list[tuple[str, Span]] = []

    def span(name: str, seconds: float, phase: str, **attrs: Any) -> None:
        nonlocal t
        end = t + int(seconds * S)
        rows.append(("a", Span(f"s{len(rows)}", "p1", name, t, end, {"starttrace.phase": phase, **attrs})))
        t = end

    span("import vllm", imports_s, "import", **{"starttrace.import.module": "vllm"})
    span(
        "vllm.create_engine_config",
        0.5,
        "config",
        **{
            "vllm.model": "m",
            "vllm.tensor_parallel_size": tp,
            "vllm.dtype": "torch.float32",
            "vllm.max_model_len": 128,
            "starttrace.vllm.version": vllm,
            "starttrace.host.cpu_count": 32,
        },
    )
    for verdict in cache:
        span("compile.graph", compile_s / len(cache), "compile", **{"starttrace.compile.cache": verdict})
    for i in range(2):
        span(
            "weights.load",
            load_s / 2,
            "model_load",
            **{
                "starttrace.weights.file": f"/m/{i}.safetensors",
                "starttrace.weights.file_bytes": 1000,
                "starttrace.weights.page_cache_fraction": page_cache,
                "starttrace.weights.fs_type": "ext4",
                "starttrace.weights.format": "safetensors",
            },
        )
    t += int(gap_s * S)  # untraced time before ready
    rows.append(("a", Span("r", "p1", "ready", t, t, {"starttrace.phase": "ready"}, instant=True)))
    rows.insert(0, ("a", Span("p1", None, "process", T0, t, {"starttrace.phase": "process"})))
    run = Run(run_id, "ab" * 16, "", {}, [Process("a", 10, 1, None, res, "p1")], [], [], spans=spans_table(rows))
    run.service = "vllm"
    return build_model(run)


def test_start_kind_from_the_spans() -> None:
    cold = one_start("cold", page_cache=0.0)
    assert start_kind(None, cold) == {
        "compile_cache": "cold",
        "page_cache": "cold",
        "weights_source": "local",
        "weights_fs": "ext4",
        "plan_cache": "none",
    }
    assert start_kind(None, one_start("w", cache=("hit", "hit")))["compile_cache"] == "warm"
    assert start_kind(None, one_start("p", cache=("hit", "miss"), page_cache=0.5))["compile_cache"] == "partial"
    assert start_kind(None, one_start("p", page_cache=0.5))["page_cache"] == "partial"
    assert start_kind(None, one_start("n", cache=()))["compile_cache"] == "none"
    fp = fingerprint(None, cold)
    assert fp["config.tp"] == "2" and fp["config.max_model_len"] == "128" and fp["software.vllm"] == "0.32.0"
    assert fp["hardware.cpu.count"] == "32"


def test_causes_name_the_compile_cache_first_and_add_up() -> None:
    cold = one_start("cold", imports_s=6.0, compile_s=30.0, gap_s=0.2)
    warm = one_start("warm", imports_s=5.0, compile_s=3.0, cache=("hit", "hit"), gap_s=0.5)
    found = causes(cold, warm)
    top = found["causes"][0]
    assert (top["key"], top["from"], top["to"]) == ("kind.compile_cache", "cold", "warm")
    assert top["seconds"] == pytest.approx(-27.0, abs=1e-3)
    keys = [c["key"] for c in found["causes"]]
    assert keys.index("phase.import") > 0
    imp = found["causes"][keys.index("phase.import")]
    assert imp["seconds"] == pytest.approx(-1.0, abs=1e-3)
    assert found["change_s"] == pytest.approx(-27.7, abs=1e-3)
    assert found["unexplained_s"] == pytest.approx(0.3, abs=1e-3)  # the path's untraced gap grew
    explained = sum(c["seconds"] for c in found["causes"] if c["seconds"] is not None)
    assert explained + found["unexplained_s"] == pytest.approx(found["change_s"], abs=1e-5)
    cmp = compare(cold, warm).to_json()
    assert cmp["causes"] == found["causes"] and cmp["unexplained_s"] == found["unexplained_s"]
    assert cmp["start_kinds"]["a"]["compile_cache"] == "cold"


def test_configuration_and_software_differences_come_before_phases() -> None:
    a = one_start("a", load_s=10.0)
    b = one_start("b", load_s=15.0, tp=4, vllm="0.33.0")
    keys = [c["key"] for c in causes(a, b)["causes"]]
    assert keys[:3] == ["fingerprint.config.tp", "fingerprint.software.vllm", "phase.model_load"]
    page = causes(one_start("a", page_cache=0.0), one_start("b", page_cache=1.0, load_s=2.0))["causes"][0]
    assert (page["key"], page["from"], page["to"]) == ("kind.page_cache", "cold", "warm")
    assert page["seconds"] == pytest.approx(-8.0, abs=1e-3) and page["phases"] == ["model_load"]


def test_gate() -> None:
    base = one_start("base")
    assert gate(base, base, 0).code == GATE_PASS
    slower = one_start("slower", load_s=14.0)  # +4 s of 45.5 s: +8.8 %
    verdict = gate(base, slower, 5)
    assert verdict.code == GATE_REGRESSION and "phase.model_load" in verdict.message
    assert gate(base, slower, 10).code == GATE_PASS
    warm = one_start("warm", cache=("hit", "hit"), compile_s=3.0)
    refused = gate(base, warm, 5)
    assert refused.code == GATE_UNLIKE and "kind.compile_cache: cold -> warm" in refused.message
    assert gate(base, warm, 5, allow_unlike=True).code == GATE_PASS
    other_tp = gate(base, one_start("tp4", tp=4), 5)
    assert other_tp.code == GATE_UNLIKE and "fingerprint.config.tp: 2 -> 4" in other_tp.message
    assert gate(base, one_start("new", vllm="0.33.0"), 5).code == GATE_PASS  # software is what CI gates


def test_causes_in_the_text_report_and_on_the_compare_page() -> None:
    import io

    from rich.console import Console

    from starttrace.views.html import environment, render_page
    from starttrace.views.terminal import render_compare

    cold = one_start("cold<b>", compile_s=30.0)
    warm = one_start("warm", compile_s=3.0, cache=("hit", "hit"))
    cmp = compare(cold, warm)
    out = io.StringIO()
    render_compare(cmp, Console(file=out, width=140, color_system=None))
    text = out.getvalue()
    assert "why time to ready changed" in text
    line = next(ln for ln in text.splitlines() if "kind.compile_cache" in ln)
    assert "cold" in line and "warm" in line and "-27.000" in line
    page = render_page(environment(), "compare.html", cmp=cmp.to_json())
    assert 'id="cmp-causes"' in page and "kind.compile_cache" in page
    assert "cold<b>" not in page and "cold&lt;b&gt;" in page  # span data escaped
