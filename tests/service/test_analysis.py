"""The waterfall model, advice, compare, terminal rendering, metrics (promtool) and retention."""

from __future__ import annotations

import io
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rich.console import Console
from st_service_helpers import flush
from synth_runs import SRun, make_run, to_protobuf, to_run

from starttrace.analysis.compare import compare
from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import RunModel
from starttrace.service.app import parse_retention
from starttrace.views.json import to_json
from starttrace.views.terminal import render_compare, render_report

PB = {"Content-Type": "application/x-protobuf"}


def model_of(run: SRun, now_ns: int | None = None) -> RunModel:
    return build_model(to_run(run), now_ns=now_ns)


def test_lanes_ranks_phases_coverage() -> None:
    m = model_of(make_run(ranks=4, imports_per_rank=50))
    assert [ln.role for ln in m.lanes] == ["api_server", "engine_core", "forkserver"] + ["worker"] * 4
    assert [ln.rank for ln in m.lanes[3:]] == [0, 1, 2, 3]
    assert m.status == "ready" and m.ready_ns is not None
    for ln in m.lanes[3:]:
        assert ln.ready_ns is not None and ln.ready_ns <= m.ready_ns
        assert ln.phases["cuda_init"] == pytest.approx(170_000_000)
        assert 0.9 < ln.coverage <= 1.0  # type: ignore[operator]
        assert len(ln.top_imports) == 5 and ln.top_imports[0][0] == "vllm.platforms.cuda"
    fs = m.lanes[2]
    assert fs.coverage is not None and fs.coverage < 0.5 and fs.gaps  # the idle forkserver shows its gap
    gap_total = sum(b - a for a, b in fs.gaps)
    assert gap_total <= fs.unexplained_ns


def test_critical_path_goes_through_last_rank() -> None:
    m = model_of(make_run(ranks=4, imports_per_rank=30))
    labels = [(m.lanes[st.lane].label, st.name) for st in m.critical_path]
    assert labels[0] == ("api_server pid 1000", "python.init")
    assert ("worker rank 3 pid 1103", "vllm.model_load") in labels  # the slowest rank (longest dist.init)
    assert not any(lab.startswith("worker rank 0") for lab, _ in labels)
    starts = [st.start for st in m.critical_path]
    assert starts == sorted(starts)
    assert m.critical_path[-1].end <= m.ready_ns  # type: ignore[operator]


def test_in_progress_open_time_grows() -> None:
    run = make_run(ranks=2, imports_per_rank=10, in_progress_rank=1)
    last = max(s.end for p in run.processes for s in p.spans)
    m1 = model_of(run, now_ns=last + 5_000_000_000)
    m2 = model_of(run, now_ns=last + 9_000_000_000)
    assert m1.status == "running"
    d1 = to_json(m1)["in_progress"]
    d2 = to_json(m2)["in_progress"]
    assert d1[0]["name"] == "vllm.model_load"
    assert d2[0]["open_s"] - d1[0]["open_s"] == pytest.approx(4.0)


def test_preload_advice_and_hotspots() -> None:
    m = model_of(make_run(ranks=4, imports_per_rank=30, common_imports=3))
    mods = {a["module"]: a for a in m.preload_advice}
    assert mods["vllm.common2"]["ranks"] == 4
    assert mods["vllm.common2"]["saving_per_rank_s"] == pytest.approx(0.04)
    assert "forkserver preload" in mods["vllm.common2"]["advice"]
    # preloaded in the forkserver: never advised
    assert "vllm.v1.engine.async_llm" not in mods
    hot = {h["module"]: h for h in m.hotspots}
    assert hot["vllm.platforms.cuda"]["ranks_paid"] == 4
    assert hot["vllm.platforms.cuda"]["cumulative_s"] == pytest.approx(0.8)
    assert hot["vllm.platforms.cuda"]["self_s"] == pytest.approx(0.8 - 4 * 0.17)


def test_cuda_audit_forkserver_chain() -> None:
    clean = model_of(make_run(ranks=2, imports_per_rank=10))
    assert clean.cuda_audit["clean"] and clean.cuda_audit["processes_with_cuda_init"] == 2
    dirty = model_of(make_run(ranks=2, imports_per_rank=10, cuda_in_forkserver=True))
    issues = dirty.cuda_audit["issues"]
    assert not dirty.cuda_audit["clean"] and len(issues) == 1
    issue = issues[0]
    assert issue["kind"] == "forkserver_cuda" and issue["role"] == "forkserver"
    assert issue["chain"] == [
        "forkserver.preload",
        "preload vllm.v1.engine.async_llm",
        "import vllm.platforms.cuda",
        "cuda.init",
    ]
    assert [f["child_pid"] for f in issue["forks"]] == [1100, 1101]


def test_compare_and_terminal() -> None:
    a = model_of(make_run(ranks=2, imports_per_rank=20, seed=1, run_id="A"))
    b = model_of(make_run(ranks=2, imports_per_rank=20, seed=1, run_id="B", common_imports=6))
    cmp = compare(a, b)
    phases = {p["phase"]: p for p in cmp.phases}
    assert phases["import"]["delta"] > 0
    keys = [r["key"] for r in cmp.ranks]
    assert "worker rank 0" in keys and "worker rank 1" in keys
    mods = {m["module"]: m for m in cmp.modules}
    assert mods["vllm.common5"]["a"] == 0 and mods["vllm.common5"]["b"] > 0
    out = io.StringIO()
    render_compare(cmp, Console(file=out, width=160))
    assert "vllm.common5" in out.getvalue()
    out = io.StringIO()
    render_report(a, Console(file=out, width=200))
    text = out.getvalue()
    for needle in ("1101", "worker", "vllm.platforms.cuda", "ready s", "critical path", "worker rank 1 pid 1101"):
        assert needle in text


def test_compare_endpoint(client: TestClient) -> None:
    for run in (
        make_run(ranks=2, imports_per_rank=10, run_id="ra", seed=21),
        make_run(ranks=3, imports_per_rank=10, run_id="rb", seed=22),
    ):
        client.post("/v1/traces", content=to_protobuf(run).SerializeToString(), headers=PB)
    flush(client)
    doc = client.get("/compare?a=ra&b=rb").json()
    assert doc["summary"]["processes"] == {"a": 5, "b": 6, "delta": 1}
    assert any(r["key"] == "worker rank 2" and r["time_to_ready_s"]["a"] is None for r in doc["ranks"])
    html = client.get("/compare?a=ra&b=rb", headers={"Accept": "text/html"}).text
    assert 'id="cmp-ranks"' in html and "worker rank 2" in html


def test_metrics_names_and_promtool(make_client: Callable[..., TestClient]) -> None:
    client = make_client(fleet_idle_s=0.0, fleet_interval_s=0.2)  # fleet facts (the histograms) at once
    for i in range(22):
        run = make_run(
            ranks=2, imports_per_rank=8, run_id=f"m{i:02d}", seed=100 + i, t0=1_700_000_000_000_000_000 + i * 10**12
        )
        client.post("/v1/traces", content=to_protobuf(run).SerializeToString(), headers=PB)
    flush(client)
    text = client.get("/metrics").text
    for name in (
        "starttrace_run_time_to_ready_seconds",
        "starttrace_run_phase_seconds",
        "starttrace_phase_duration_seconds",
        "starttrace_time_to_ready_seconds",
        "starttrace_run_startup_seconds",
        "starttrace_import_duration_seconds",
        "starttrace_import_ranks_paid",
        "starttrace_ingested_spans_total",
        "starttrace_otlp_requests_total",
    ):
        assert f"# TYPE {name.removesuffix('_total')} " in text or f"# TYPE {name} " in text, name
    assert "run_id=" not in text and "pid=" not in text  # no label names a run (or its processes)
    assert 'rank=""' in text  # processes without a rank
    # the gauges: the newest run of the service (m21)
    newest = client.get("/startup/m21").json()
    worker0 = next(ln for ln in newest["lanes"] if ln["rank"] == 0)
    gauge = 'starttrace_time_to_ready_seconds{rank="0",role="worker"'
    line = next(ln for ln in text.splitlines() if ln.startswith(gauge))
    assert float(line.split()[-1]) == pytest.approx(worker0["time_to_ready_s"], abs=1e-5)
    assert 'starttrace_import_ranks_paid{module="vllm.platforms.cuda",service="vllm"} 2.0' in text
    # the histograms: every run once (its fleet facts derived)
    deadline = time.monotonic() + 60
    while 'starttrace_run_time_to_ready_seconds_count{service="vllm"} 22.0' not in text:
        assert time.monotonic() < deadline, text[:2000]
        time.sleep(0.3)
        text = client.get("/metrics").text
    assert 'starttrace_run_phase_seconds_bucket{le="+Inf",phase="import",role="worker",service="vllm"} 22.0' in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_retention_drops_old_runs(make_client: Callable[..., TestClient], tmp_path: Path) -> None:
    assert parse_retention("7d") == 7 * 86400 and parse_retention("12h") == 43200 and parse_retention(2) == 172800
    with pytest.raises(ValueError):
        parse_retention("soon")
    c = make_client(retention_s=3600.0)
    old = make_run(ranks=1, imports_per_rank=5, run_id="old", t0=time.time_ns() - 3 * 3600 * 10**9)
    new = make_run(ranks=1, imports_per_rank=5, run_id="new", t0=time.time_ns() - 60 * 10**9)
    for run in (old, new):
        c.post("/v1/traces", content=to_protobuf(run).SerializeToString(), headers=PB)
    flush(c)
    store = c.app.state.store  # type: ignore[attr-defined]
    assert store.expire(3600.0) == ["old"]
    assert [r["run_id"] for r in c.get("/runs").json()["runs"]] == ["new"]
    assert c.get("/startup/old").status_code == 404


def test_runs_filters(client: TestClient) -> None:
    client.post(
        "/v1/traces",
        content=to_protobuf(
            make_run(ranks=1, imports_per_rank=5, run_id="s1", service="alpha", t0=1_700_000_000 * 10**9)
        ).SerializeToString(),
        headers=PB,
    )
    client.post(
        "/v1/traces",
        content=to_protobuf(
            make_run(ranks=1, imports_per_rank=5, run_id="s2", service="beta", t0=1_800_000_000 * 10**9)
        ).SerializeToString(),
        headers=PB,
    )
    flush(client)
    assert [r["run_id"] for r in client.get("/runs?service=alpha").json()["runs"]] == ["s1"]
    assert [r["run_id"] for r in client.get("/runs?since=1750000000").json()["runs"]] == ["s2"]
    assert [r["run_id"] for r in client.get("/runs?until=2023-12-01T00:00:00Z").json()["runs"]] == ["s1"]
    assert client.get("/runs?since=yesterday-ish").status_code == 400
    assert client.get("/startup").json()["run_id"] == "s2"  # latest
    assert "/v1/traces" in client.get("/openapi.json").json()["paths"]
