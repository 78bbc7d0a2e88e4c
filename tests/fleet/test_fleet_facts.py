"""Fleet facts: one run's facts from its model (pure), and the fleet answer over facts rows, in SQL on
ClickHouse's engine (chdb) and in Python over the embedded store's facts: the same answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from fleet_rows import synthetic_facts

from starttrace.analysis.fleet import fleet_answer, regressions, run_facts
from starttrace.analysis.model import Lane, RunModel
from starttrace.run import Process, Run, Span, spans_table
from starttrace.service.fleet import fleet_of
from starttrace.sources.facts_store import FactsStore

S = 1_000_000_000


def _lane(index: int, role: str, rank: int | None, phases: dict[str, float], after_ready: bool = False) -> Lane:
    lane = Lane(
        index=index,
        id=f"lane{index}",
        pid=100 + index,
        ppid=1,
        role=role,
        rank=rank,
        local_rank=rank,
        world_size=2,
        start_method="spawn",
        service="vllm",
        host="node1",
        command=None,
        resource={},
        exited=None,
        exit_code=None,
        warnings=[],
        preloaded=[],
    )
    lane.phases = {k: int(v * S) for k, v in phases.items()}
    lane.after_ready = after_ready
    return lane


def _model(run_id: str, lanes: list[Lane], ready_s: float | None, findings: list[dict[str, Any]]) -> RunModel:
    t0 = 1_700_000_000 * S
    return RunModel(
        run_id=run_id,
        trace_id="ab" * 16,
        service="vllm",
        meta={},
        problems=[],
        t0=t0,
        t_end=t0 + 50 * S,
        now_ns=t0 + 60 * S,
        status="ready" if ready_s is not None else "exited",
        ready_ns=None if ready_s is None else t0 + int(ready_s * S),
        lanes=lanes,
        spans=pl.DataFrame(),
        side=pl.DataFrame(),
        phases=[],
        hotspots=[],
        preload_advice=[],
        cuda_audit={},
        critical_path=[],
        findings=findings,
    )


def _run(run_id: str) -> Run:
    res = {
        "service.name": "vllm",
        "service.version": "0.32.0",
        "host.name": "node1",
        "starttrace.start_method": "root",
        "container.image.name": "vllm/vllm-openai",
        "container.image.tag": "v0.32.0",
    }
    worker = dict(res, **{"host.name": "node2", "starttrace.start_method": "spawn"})
    procs = [
        Process("a", 101, 1, None, res, "p1"),
        Process("b", 102, 101, None, worker, "p2"),
    ]
    config = Span("c1", "p1", "vllm.config", 10, 20, {"vllm.model": "meta/llama", "vllm.tensor_parallel_size": 2})
    spans = spans_table(
        [("a", Span("p1", None, "process", 0, 30)), ("a", config), ("b", Span("p2", "p1", "process", 5, 30))]
    )
    return Run(run_id, "ab" * 16, "", {}, procs, [], [], spans=spans, service="vllm", version=7)


def test_run_facts_from_model() -> None:
    lanes = [
        _lane(0, "api_server", None, {"import": 3.0, "process": 40.0, "startup": 41.0}),
        _lane(1, "worker", 0, {"import": 5.0, "model_load": 10.0}),
        _lane(2, "worker", 1, {"import": 4.0, "model_load": 12.5}),
        _lane(3, "helper", None, {"import": 99.0}, after_ready=True),  # after ready: no part of startup
    ]
    findings = [
        {"kind": "preload", "seconds": 2.0},
        {"kind": "straggler", "seconds": 1.5},
        {"kind": "straggler", "seconds": 0.5},
        {"kind": "stalled", "seconds": None},
    ]
    facts = run_facts(_run("r1"), _model("r1", lanes, 30.0, findings))
    assert facts["time_to_ready_s"] == 30.0
    assert facts["phases"] == {"import": 5.0, "model_load": 12.5}  # the slowest process per phase
    assert facts["role_phases"] == {"api_server/import": 3.0, "worker/import": 5.0, "worker/model_load": 12.5}
    assert facts["findings"] == {"preload": 2.0, "straggler": 2.0, "stalled": 0.0}
    ident = facts["identity"]
    assert ident["service.name"] == "vllm" and ident["service.version"] == "0.32.0"
    assert ident["host.name"] == "node1"  # the root process's host
    assert ident["hosts"] == "node1,node2" and ident["nodes"] == "2"
    assert ident["vllm.model"] == "meta/llama" and ident["vllm.tensor_parallel_size"] == "2"
    assert ident["container.image"] == "vllm/vllm-openai:v0.32.0"
    assert facts["spans"] == 3 and facts["version"] == 7
    assert facts["kind"]["compile_cache"] == "none" and ident["kind.compile_cache"] == "none"
    not_ready = run_facts(_run("r2"), _model("r2", lanes, None, []))
    assert not_ready["time_to_ready_s"] is None and not_ready["status"] == "exited"


def _close(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["runs"] == b["runs"] and a["key"] == b["key"]
    assert [g["value"] for g in a["groups"]] == [g["value"] for g in b["groups"]]
    for ga, gb in zip(a["groups"], b["groups"], strict=True):
        assert ga["runs"] == gb["runs"]
        for q in ("p50", "p95"):
            assert ga["time_to_ready_s"][q] == pytest.approx(gb["time_to_ready_s"][q], abs=1e-4)
            for phase in ga["phases"]:
                assert ga["phases"][phase][q] == pytest.approx(gb["phases"][phase][q], abs=1e-4)
    assert [r["run_id"] for r in a["slowest"]] == [r["run_id"] for r in b["slowest"]]
    assert [(r["phase"], r["from"], r["to"]) for r in a["regressions"]] == [
        (r["phase"], r["from"], r["to"]) for r in b["regressions"]
    ]


def test_fleet_answer_in_python() -> None:
    rows = synthetic_facts(90)
    ans = fleet_answer(rows, "service.version")
    assert [g["value"] for g in ans["groups"]] == ["0.31.0", "0.32.0", "0.33.0"]
    assert sum(g["runs"] for g in ans["groups"]) == 90
    assert ans["slowest"][0]["url"] == f"/startup/{ans['slowest'][0]['run_id']}"
    ttrs = [r["time_to_ready_s"] for r in ans["slowest"]]
    assert ttrs == sorted(ttrs, reverse=True)
    reg = ans["regressions"]
    assert reg and reg[0]["phase"] == "model_load" and (reg[0]["from"], reg[0]["to"]) == ("0.32.0", "0.33.0")
    assert reg[0]["p50_delta_s"] > 4
    assert fleet_answer(rows, "tp")["key"] == "vllm.tensor_parallel_size"
    assert fleet_answer(rows, "tp")["regressions"] == []


def test_regressions_need_growth() -> None:
    groups = [
        {"value": "b", "first_ns": 2, "phases": {"x": {"p50": 1.0}}},
        {"value": "a", "first_ns": 1, "phases": {"x": {"p50": 1.005}}},
        {"value": "c", "first_ns": 3, "phases": {"x": {"p50": 2.0}, "y": {"p50": 9.0}}},
    ]
    assert regressions(groups) == [  # groups without kinds (ClickHouse's SQL groups): one kind, {}
        {
            "phase": "x",
            "from": "b",
            "to": "c",
            "kind": {},
            "p50_delta_s": 1.0,
            "from_p50_s": 1.0,
            "to_p50_s": 2.0,
            "runs_from": None,
            "runs_to": None,
        }
    ]


def test_embedded_facts_store(tmp_path: Path) -> None:
    store = FactsStore(tmp_path / "st.db")
    rows = synthetic_facts(30)
    store.write(rows)
    store.write(rows[:10])  # again: replaced, not added
    assert len(store.rows()) == 30
    store.forget(["run-00000", "run-00001"])  # expired runs' facts go with them
    assert len(store.rows()) == 28
    store.write(rows[:2])
    assert store.get("run-00003")["phases"] == rows[3]["phases"]  # type: ignore[index]
    ans = fleet_of(store, "service.version", service="vllm")
    assert ans["runs"] == sum(1 for r in rows if r["service"] == "vllm")
    _close(ans, fleet_answer([r for r in rows if r["service"] == "vllm"], "service.version"))


@pytest.fixture(scope="module")
def ch_facts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("chdb")
    from otel_clickhouse import create_tables

    from starttrace.sources.clickhouse.client import close_all, connect
    from starttrace.sources.clickhouse.facts import ClickHouseFacts

    client = connect(f"chdb:{tmp_path_factory.mktemp('chfacts') / 'data'}", create=True)
    create_tables(client)  # the facts table lives beside otel_traces, in its database
    yield ClickHouseFacts(client)
    close_all()


def test_clickhouse_fleet_matches_python(ch_facts: Any) -> None:
    rows = synthetic_facts(300)
    ch_facts.write(rows)
    for by in ("service.version", "tp", "host.name"):
        _close(fleet_of(ch_facts, by), fleet_answer(rows, by))
    since = rows[100]["start_ns"]
    sub = [r for r in rows if r["start_ns"] >= since and r["service"] == "vllm"]
    _close(fleet_of(ch_facts, "service.version", since_ns=since, service="vllm"), fleet_answer(sub, "service.version"))
    ans = fleet_of(ch_facts, "service.version")
    assert ans["regressions"][0]["phase"] == "model_load"


def test_clickhouse_facts_rewrite_is_idempotent(ch_facts: Any) -> None:
    rows = synthetic_facts(300)
    before = fleet_of(ch_facts, "service.version")
    ch_facts.write(rows[:50])  # derived again: the newest row of each run counts, once
    after = fleet_of(ch_facts, "service.version")
    assert after["runs"] == before["runs"] == 300
    changed = dict(rows[0], time_to_ready_s=9999.0)
    ch_facts.write([changed])
    assert fleet_of(ch_facts, "service.version")["slowest"][0]["run_id"] == "run-00000"
    assert ch_facts.get("run-00000")["TimeToReadyS"] == 9999.0
