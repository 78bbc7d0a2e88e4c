"""Like with like: the held-out fleet (1,000 vLLM starts; 0.32.0 with 20 % cold-compile-cache
starts, 0.33.0 with 80 %; compile unchanged within each kind; 0.33.0's model_load +5 s) through
`fleet_answer`, through a real `starttrace.service.server --db` process's /fleet (JSON and page) and
through `starttrace fleet --db` on the same SQLite store. Plus the fleet parts of issue 38 item 10:
percent-encoded `slowest[].url`, `by=tp`/`by=model` read from the resource too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleet_rows import held_out_fleet, synthetic_facts
from st_service_helpers import serving

from starttrace.analysis.fleet import fleet_answer, mix, regressions, run_facts
from starttrace.analysis.lanes import build_model
from starttrace.run import Process, Run, Span, spans_table
from starttrace.sources.facts_store import FactsStore

REPO = Path(__file__).resolve().parents[2]


def check_held_out(ans: dict[str, Any]) -> None:
    """What the held-out fleet must say, whichever way it was asked."""
    assert ans["runs"] == 1000
    assert [g["value"] for g in ans["groups"]] == ["0.32.0", "0.33.0"]
    phases = {r["phase"] for r in ans["regressions"]}
    assert "compile" not in phases, [r for r in ans["regressions"] if r["phase"] == "compile"]
    loads = [r for r in ans["regressions"] if r["phase"] == "model_load"]
    assert {r["kind"]["compile_cache"] for r in loads} == {"cold", "warm"}  # within each kind, with it
    for r in loads:
        assert (r["from"], r["to"]) == ("0.32.0", "0.33.0")
        assert r["p50_delta_s"] == pytest.approx(5.0, abs=0.5)
        assert r["kind"]["page_cache"] == "warm" and r["kind"]["weights_source"] == "local"
    cold = [m for m in ans["mix"] if (m["key"], m["value"]) == ("compile_cache", "cold")]
    assert cold == [
        {"from": "0.32.0", "to": "0.33.0", "key": "compile_cache", "value": "cold", "share_from": 0.2, "share_to": 0.8}
    ]
    assert {m["key"] for m in ans["mix"]} == {"compile_cache"}  # the other kind keys did not move
    for g in ans["groups"]:  # p50/p95 per kind
        kinds = {k["kind"]["compile_cache"]: k for k in g["kinds"]}
        assert set(kinds) == {"cold", "warm"}
        assert sum(k["runs"] for k in g["kinds"]) == g["runs"] == 500
        assert kinds["cold"]["phases"]["compile"]["p50"] == pytest.approx(40, abs=1)
        assert kinds["warm"]["phases"]["compile"]["p50"] == pytest.approx(3, abs=0.5)


def test_held_out_fleet_through_fleet_answer() -> None:
    rows = held_out_fleet()
    ans = fleet_answer(rows, "service.version")
    check_held_out(ans)
    # the mixed-kind p50 does move by tens of seconds: what a fleet answer blind to kinds called a regression
    g32, g33 = ans["groups"]
    assert g33["phases"]["compile"]["p50"] - g32["phases"]["compile"]["p50"] > 30
    by_kind = fleet_answer(rows, "kind.compile_cache")
    assert {g["value"]: g["runs"] for g in by_kind["groups"]} == {"cold": 500, "warm": 500}


def test_regressions_and_mix_need_kinds_in_common() -> None:
    def group(value: str, first: int, kinds: list[tuple[str, int, float]]) -> dict[str, Any]:
        total = sum(n for _, n, _ in kinds)
        return {
            "value": value,
            "first_ns": first,
            "runs": total,
            "phases": {},
            "kinds": [
                {
                    "kind": {"compile_cache": c},
                    "label": f"compile_cache={c}",
                    "runs": n,
                    "share": n / total,
                    "phases": {"x": {"p50": p}},
                }
                for c, n, p in kinds
            ],
        }

    groups = [group("a", 1, [("cold", 5, 10.0), ("warm", 5, 1.0)]), group("b", 2, [("cold", 10, 10.5)])]
    (reg,) = regressions(groups)  # warm exists only before: nothing to compare it with
    assert reg["kind"] == {"compile_cache": "cold"} and reg["p50_delta_s"] == 0.5
    assert mix(groups) == [
        {"from": "a", "to": "b", "key": "compile_cache", "value": "cold", "share_from": 0.5, "share_to": 1.0},
        {"from": "a", "to": "b", "key": "compile_cache", "value": "warm", "share_from": 0.5, "share_to": 0.0},
    ]


def test_old_rows_without_kind_read_as_unknown() -> None:
    rows = synthetic_facts(60)
    ans = fleet_answer(rows, "service.version")
    assert ans["regressions"][0]["kind"]["compile_cache"] == "unknown"
    assert ans["regressions"][0]["phase"] == "model_load"
    assert ans["mix"] == []


def test_slowest_url_is_percent_encoded() -> None:
    rows = synthetic_facts(3)
    rows[0]["run_id"] = "a/b c?d#e"
    rows[0]["time_to_ready_s"] = 999.0
    top = fleet_answer(rows, "service.version")["slowest"][0]
    assert top["run_id"] == "a/b c?d#e" and top["url"] == "/startup/a%2Fb%20c%3Fd%23e"


def _foreign_run() -> Run:
    """A run whose exporter put vLLM's config on the resource, not on spans."""
    res = {
        "service.name": "vllm",
        "service.version": "0.32.0",
        "starttrace.start_method": "root",
        "vllm.model": "org/foreign-model",
        "vllm.tensor_parallel_size": 4,
    }
    spans = spans_table([("a", Span("p1", None, "process", 0, 10**9))])
    return Run("foreign", "cd" * 16, "", {}, [Process("a", 11, 1, None, res, "p1")], [], [], spans=spans)


def test_by_tp_and_model_read_the_resource() -> None:
    run = _foreign_run()
    facts = run_facts(run, build_model(run))
    assert facts["identity"]["vllm.tensor_parallel_size"] == "4"
    assert fleet_answer([facts], "tp")["groups"][0]["value"] == "4"
    assert fleet_answer([facts], "model")["groups"][0]["value"] == "org/foreign-model"
    assert facts["kind"] == {
        "compile_cache": "none",
        "page_cache": "none",
        "weights_source": "none",
        "weights_fs": "none",
        "plan_cache": "none",
    }


# ---------------------------------------------------------------------------------------------
# the real service and CLI on the SQLite store


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STARTTRACE", "VLLM_STARTTRACE", "OTEL_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.fixture(scope="module")
def held_out_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store's SQLite file with the held-out fleet's facts (as the service's deriver writes them)."""
    db = tmp_path_factory.mktemp("held-out") / "st.db"
    from starttrace.sources.store import Store

    Store(db).close()  # the store's own tables, as `serve` makes them
    FactsStore(db).write(held_out_fleet())
    return db


@pytest.fixture(scope="module")
def service(held_out_db: Path) -> Iterator[str]:
    with serving(["--db", str(held_out_db)], held_out_db.parent / "service.log", _env(), held_out_db.parent) as url:
        yield url


def test_held_out_fleet_through_the_service_and_the_cli(service: str, held_out_db: Path) -> None:
    got = httpx.get(service + "/fleet", params={"by": "service.version"}, timeout=60)
    assert got.status_code == 200, got.text
    check_held_out(got.json())
    page = httpx.get(service + "/fleet", params={"by": "version"}, headers={"Accept": "text/html"}, timeout=60)
    assert page.status_code == 200
    assert 'id="fleet-mix"' in page.text and "compile_cache=cold" in page.text
    cli = subprocess.run(
        [sys.executable, "-m", "starttrace", "fleet", "--db", str(held_out_db), "--json", "--no-derive"],
        env=_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    answer = json.loads(cli.stdout)
    check_held_out(answer)
    assert answer["regressions"] == got.json()["regressions"] and answer["mix"] == got.json()["mix"]
    text = subprocess.run(
        [sys.executable, "-m", "starttrace", "fleet", "--db", str(held_out_db), "--no-derive"],
        env=_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert text.returncode == 0, text.stderr
    assert "start-kind mix" in text.stdout and "compile_cache" in text.stdout
