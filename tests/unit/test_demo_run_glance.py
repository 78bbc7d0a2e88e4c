"""The demo's real run (a cold vLLM start, TP=2, kept as test data) at a glance: the report fits 60
lines of 80 columns with the summary and plan first and no helper named one by one; the plan
replays the critical path (predicted below time to ready, its saving at most the findings'
savings summed); the cold model inspection is a finding the plan covers; compare sets the cold
run's plan against the warm start."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from demo_runs import demo_run_dir
from rich.console import Console

from starttrace.analysis.compare import compare
from starttrace.analysis.folding import fold_groups
from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import RunModel
from starttrace.analysis.plan import plan
from starttrace.sources.journal_reader import read_run
from starttrace.views.json import to_json
from starttrace.views.terminal import render_compare, render_report


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> RunModel:
    return build_model(read_run(demo_run_dir(tmp_path_factory.mktemp("demo"), "cold")))


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> RunModel:
    return build_model(read_run(demo_run_dir(tmp_path_factory.mktemp("demo"), "warm")))


def report_lines(model: RunModel, width: int = 80, **kw: bool) -> list[str]:
    out = io.StringIO()
    render_report(model, Console(file=out, width=width, color_system=None), **kw)
    return out.getvalue().splitlines()


def test_report_fits_sixty_lines_of_eighty_columns(cold: RunModel) -> None:
    lines = report_lines(cold)
    assert len(lines) <= 60, "\n".join(lines)
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    # the summary comes first: time to ready, the bar by phase, the plan, then the findings
    head = text[: text.index("findings")]
    assert "time to ready 65.7 s" in head and "time to ready by phase" in head and "plan:" in head
    # no short helper named one by one: each is in a folded line, by kind and parent
    folded = [i for g in fold_groups(cold) for i in g["lanes"]]
    assert folded
    for i in folded:
        assert f"pid {cold.lanes[i].pid}" not in text
    assert "1 x python -c (Inductor's .so check), 0.04 s" in text
    # every column it names is shown whole (the compile table: graphs, hit, miss, compile s)
    header = next(line for line in lines if line.startswith("process") and "graphs" in line)
    assert header.split() == ["process", "graphs", "hit", "miss", "compile", "s"]
    assert "other" in next(line for line in lines if line.startswith("process") and "total" in line)


def test_full_report_names_every_helper(cold: RunModel) -> None:
    text = "\n".join(report_lines(cold, full=True))
    for g in fold_groups(cold):
        for i in g["lanes"]:
            assert cold.lanes[i].label in text
    assert "time to ready by phase" in text and "import hotspots" in text


def test_plan_replays_the_path(cold: RunModel) -> None:
    got = plan(cold)
    savings = {f["kind"]: f["saving_s"] for f in cold.findings}
    assert got["predicted_ready_s"] < cold.startup_s
    assert 0 < got["saving_s"] <= sum(s for s in savings.values() if s) + 1e-6
    assert got["saving_s"] == pytest.approx(cold.startup_s - got["predicted_ready_s"], abs=1e-5)
    # each finding its own change of time to ready; the ones without a predicted saving None
    assert savings["cold_compile"] > 10 and savings["kv_profile"] is None
    assert got["findings"][0]["kind"] == "cold_compile"
    assert to_json(cold, include_spans=False)["plan"] == got


def test_cold_model_inspection_is_a_finding_the_plan_covers(cold: RunModel) -> None:
    (f,) = [f for f in cold.findings if f["kind"] == "cold_model_inspection"]
    helper = cold.lanes[f["helper_lane"]]
    assert "vllm.model_executor.models.registry" in (helper.command or "")
    assert "modelinfos" in f["text"] and "VLLM_CACHE_ROOT" in f["action"]
    assert f["critical_path_s"] > 5  # the API server waited ~9.6 s for it
    assert 5 < f["saving_s"] <= f["critical_path_s"]  # its imports come off the path
    assert "cold_model_inspection" in [p["kind"] for p in plan(cold)["findings"]]


def test_compare_sets_the_plan_against_the_warm_start(cold: RunModel, warm: RunModel) -> None:
    check = compare(cold, warm).plan
    rows = {r["kind"]: r for r in check["findings"]}
    for kind in ("cold_compile", "cold_model_inspection"):  # the warm start kept both caches
        assert rows[kind]["acted_on"], rows[kind]
        assert rows[kind]["realised_saving_s"] > 0.5 * rows[kind]["predicted_saving_s"]
    assert not rows["preload"]["acted_on"]  # the warm start still spawned its ranks
    assert check["realised_saving_s"] == pytest.approx(cold.startup_s - warm.startup_s, abs=1e-5)
    out = io.StringIO()
    render_compare(compare(cold, warm), Console(file=out, width=80, color_system=None))
    assert "A's plan: saving predicted (A) vs realised (B)" in out.getvalue()


def test_report_reads_the_packed_run(tmp_path: Path) -> None:
    run_dir = demo_run_dir(tmp_path, "cold")
    assert (run_dir / "run.json").exists() and len(list(run_dir.glob("*.journal"))) >= 8


def test_fleet_facts_leave_the_busy_loop_out(tmp_path: Path) -> None:
    """The workers' busy loop (phase `idle`) runs on after ready: no fleet phase of the start."""
    from starttrace.analysis.fleet import run_facts

    run = read_run(demo_run_dir(tmp_path, "cold"))
    model = build_model(run)
    assert any("idle" in lane.phases for lane in model.lanes)  # the loop is there
    facts = run_facts(run, model)
    assert "idle" not in facts["phases"] and {"compile", "import"} <= set(facts["phases"])
    assert not any(key.endswith("/idle") for key in facts["role_phases"])
