"""Findings over hand-built runs (the run type, as every source produces it): preload covering
lists, unused forkservers, CUDA before fork, stalled processes, stragglers; the same list in the
JSON view, on the page (escaped) and in the service's /startup."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from finding_runs import MS, T0, XSS, forkserver_run, spawn_run, stuck_run
from st_service_helpers import flush
from synth_runs import make_run, to_protobuf

from starttrace.analysis.findings import preload_modules, stall_seconds
from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import RunModel
from starttrace.views.html import PHASE_COLORS, environment, render_page
from starttrace.views.json import to_json


def of_kind(model: RunModel, kind: str) -> list[dict[str, Any]]:
    return [f for f in model.findings if f["kind"] == kind]


def test_every_finding_has_the_common_shape() -> None:
    for run in (forkserver_run(), spawn_run()):
        model = build_model(run)
        assert model.findings
        for f in model.findings:
            assert {"kind", "severity", "pids", "lanes", "seconds", "text", "action"} <= set(f)
            assert f["severity"] in ("error", "warning", "info") and f["text"] and f["action"]
            assert [model.lanes[i].pid for i in f["lanes"]] == f["pids"]
        assert to_json(model)["findings"] == model.findings


def test_preload_covering_list_for_forkserver_ranks() -> None:
    model = build_model(forkserver_run())
    (f,) = of_kind(model, "preload")
    assert f["pids"] == [110, 111]  # the ranks; the EngineCore (which imports pkg too) is not one
    assert f["start_method"] == "forkserver" and f["forkserver_pid"] == 102
    # a package and the submodule it loads are listed once; __main__, what ran cuda.init, and what
    # only one rank imported are not listed
    assert f["modules"][:1] == ["slowmod"] or "slowmod" in f["modules"]
    assert "pkg" in f["modules"] and "pkg.sub" not in f["modules"]
    assert not {"myapp", "torchish", "only0", "only1"} & set(f["modules"])
    assert f["refused"] and f["refused"][0]["module"] == "torchish"
    assert "cuda.init" in f["refused"][0]["reason"]
    # measured seconds per rank: pkg (0.3 s) + slowmod + the odd name (0.03 s)
    per = {r["pid"]: r["seconds"] for r in f["per_rank"]}
    assert per[110] == pytest.approx(0.3 + 0.1 + 0.03) and per[111] == pytest.approx(0.3 + 0.6 + 0.03)
    assert f["seconds"] == pytest.approx((per[110] + per[111]) / 2)
    assert "to the preload of forkserver pid 102 (it preloads [__main__] now)" in f["text"]
    assert f["estimate"]["label"] == "estimate" and "estimate" in f["text"]
    # the preload's cost: the fastest import of each listed module anywhere in the run (pkg 0.09 s
    # in rank 1, slowmod 0.1 s, the odd name 0.03 s), as that is less than the cheapest rank's
    # 0.43 s, less the 0.04 s the forkserver sat idle before its first fork
    assert f["estimate"]["preload_cost_s"] == pytest.approx(0.09 + 0.1 + 0.03 - 0.04)
    assert "STARTTRACE_FORKSERVER_PRELOAD" in f["action"] and "starttrace compare" in f["action"]
    assert preload_modules(model.findings) == f["modules"]
    # the older per-module rows come from the same list
    assert [a["module"] for a in model.preload_advice] == sorted(
        f["modules"], key=lambda m: -next(a["total_s"] for a in model.preload_advice if a["module"] == m)
    )


def test_preload_for_spawned_ranks_and_unused_forkserver() -> None:
    model = build_model(spawn_run())
    (f,) = of_kind(model, "preload")
    assert f["start_method"] == "spawn" and f["modules"] == ["vllm.v1.worker.gpu_worker"]
    assert "Start them from a forkserver that preloads [vllm.v1.worker.gpu_worker]" in f["text"]
    assert "VLLM_WORKER_MULTIPROC_METHOD=forkserver" in f["action"]
    (u,) = of_kind(model, "unused_forkserver")
    assert u["forkserver_pid"] == 103 and u["pids"] == [103, 100] and u["started_by_pid"] == 100
    assert u["preload_s"] == pytest.approx(2.0) and u["seconds"] == pytest.approx(2.0)
    assert u["critical_path_overlap_s"] > 1.0  # it preloaded while the API server imported
    assert "[vllm.v1.engine.async_llm] for 2.00 s and forked nothing" in u["text"]
    assert "unset VLLM_WORKER_MULTIPROC_METHOD" in u["action"]
    # the forkserver run's forkserver forked: not unused
    assert not of_kind(build_model(forkserver_run()), "unused_forkserver")


def test_straggler_says_who_was_late_and_why() -> None:
    model = build_model(forkserver_run())
    by_phase = {f["phase"]: f for f in of_kind(model, "straggler")}
    dist = by_phase["dist_init"]
    assert dist["slowest_rank"] == 1 and dist["pids"][0] == 111
    assert dist["entry_spread_s"] == pytest.approx(0.5)
    assert "rank 0 (pid 110) waited 0.50 s in dist.init for rank 1 (pid 111)" in dist["text"]
    assert "whose import of slowmod took 0.50 s longer" in dist["text"]
    assert "model_load" not in by_phase  # 50 ms apart: under the threshold


def test_stalled_names_the_stuck_process_and_its_waiters(monkeypatch: pytest.MonkeyPatch) -> None:
    run = stuck_run()
    now = T0 + 31_000 * MS
    model = build_model(run, now_ns=now, stall_s=20)
    assert model.live
    (f,) = of_kind(model, "stalled")
    assert f["stalled_pid"] == 111 and f["pids"] == [111, 110] and f["seconds"] == pytest.approx(30.0)
    assert f["text"] == (
        "rank 0 (pid 110) has waited 30.0 s in dist.init; rank-1 (rank_main) pid 111 has been in "
        "`import stuckmod` for 30.0 s"
    )
    assert f["waiters"][0]["span"] == "dist.init" and "py-spy dump --pid 111" in f["action"]
    assert not of_kind(build_model(run, now_ns=now), "stalled")  # default: 60 s
    monkeypatch.setenv("STARTTRACE_STALL_S", "25")
    assert stall_seconds() == 25.0 and of_kind(build_model(run, now_ns=now), "stalled")
    monkeypatch.setenv("STARTTRACE_STALL_S", "soon")
    assert stall_seconds() == 60.0
    # finished runs have nothing stalled
    assert not of_kind(build_model(forkserver_run(), now_ns=now, stall_s=0.001), "stalled")


def test_cuda_before_fork_finding_with_chain() -> None:
    from synth_runs import to_run

    model = build_model(to_run(make_run(ranks=2, imports_per_rank=10, cuda_in_forkserver=True)))
    (f,) = of_kind(model, "cuda_before_fork")
    assert f["severity"] == "error" and f["audit_kind"] == "forkserver_cuda"
    assert f["chain"] == model.cuda_audit["issues"][0]["chain"]
    assert (
        "forkserver.preload -> preload vllm.v1.engine.async_llm -> import vllm.platforms.cuda -> cuda.init" in f["text"]
    )
    assert f["child_pids"] == [1100, 1101]
    assert "remove 'vllm.v1.engine.async_llm' from the forkserver preload" in f["action"]


def test_page_lists_findings_escaped() -> None:
    model = build_model(forkserver_run())
    html = render_page(
        environment(), "startup.html", run=to_json(model, include_spans=False), model=model, phase_colors=PHASE_COLORS
    )
    assert 'id="findings-list"' in html and html.index('id="findings"') < html.index('id="rank-table"')
    assert XSS not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert 'data-lanes="' in html and "to the preload of forkserver pid 102" in html


def test_service_startup_json_has_findings(client: TestClient) -> None:
    run = make_run(ranks=3, imports_per_rank=20, run_id="fsvc", common_imports=3)
    client.post(
        "/v1/traces", content=to_protobuf(run).SerializeToString(), headers={"Content-Type": "application/x-protobuf"}
    )
    flush(client)
    doc = client.get("/startup/fsvc?format=json").json()
    kinds = [f["kind"] for f in doc["findings"]]
    assert "preload" in kinds
    (f,) = [f for f in doc["findings"] if f["kind"] == "preload"]
    assert set(f["modules"]) >= {"vllm.common0", "vllm.common1", "vllm.common2"}
    assert "vllm.platforms.cuda" not in f["modules"]  # its import ran cuda.init in every rank
    assert doc["preload_advice"] and doc["cuda_audit"]["clean"]


def test_a_module_that_ran_cuda_init_is_refused_with_the_reason() -> None:
    import io

    from finding_runs import Builder
    from rich.console import Console

    from starttrace.views.terminal import render_advise

    b = Builder()
    main = b.proc(100, 1, "main", "root", None, 0, 3000)
    for r in range(2):
        launch = b.span(main, "process.launch", 10 + r, 20 + r, phase="launch", child_pid=110 + r, start_method="spawn")
        w = b.proc(110 + r, 100, "worker", "spawn", launch, 15 + r, 2000, rank=r)
        imp = b.span(w, "import torchish", 100, 900)
        b.span(w, "cuda.init", 200, 800, imp, phase="cuda_init")
    model = build_model(b.build(ready_at=None))
    (f,) = of_kind(model, "preload")
    assert f["modules"] == [] and f["refused"][0]["module"] == "torchish"
    assert "import torchish -> cuda.init" in f["refused"][0]["reason"]
    assert preload_modules(model.findings) == []
    out = io.StringIO()
    render_advise(model, Console(file=out, width=100, color_system=None))
    assert "refused torchish: its import ran cuda.init in worker rank 0 pid 110" in out.getvalue()
