"""GET /fleet and runs from ClickHouse through the real service and CLI: `starttrace serve
--clickhouse chdb:DIR` in its own process, asked over HTTP; the embedded store's /fleet; `starttrace
fleet|report|export --clickhouse`. ClickHouse is chdb (the real engine) with the exporter's DDL,
filled the way the exporter fills it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from st_service_helpers import serving

pytest.importorskip("chdb")

from otel_clickhouse import create_tables, exporter_rows, insert
from synth_runs import make_run, protobuf_batches, to_protobuf

REPO = Path(__file__).resolve().parents[2]
VERSIONS = ("0.31.0", "0.32.0", "<b>0.33.0</b>")  # a value from span data: escaped on the page
RUNS = 9


def _runs() -> list[Any]:
    out = []
    for i in range(RUNS):
        run = make_run(
            ranks=2, imports_per_rank=4, run_id=f"fl-{i}", seed=40 + i, t0=1_750_000_000 * 10**9 + i * 10**12
        )
        for p in run.processes:
            p.resource["service.version"] = VERSIONS[i // 3]
        out.append(run)
    return out


def fill_dir(data: Path) -> None:
    """otel_traces in a chdb directory, filled by a process of its own that then exits: chdb is one
    engine per process, and a directory another live process has opened cannot be opened."""
    code = (
        "import sys; sys.path[:0] = [sys.argv[2], sys.argv[3]]\n"
        "from pathlib import Path\n"
        "import test_fleet_service as t\n"
        "t._fill_here(Path(sys.argv[1]))\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(data), str(REPO / "tests"), str(Path(__file__).parent)],
        env=_env(),
        cwd=str(REPO),
        check=True,
        timeout=300,
    )


def _fill_here(data: Path) -> None:
    from starttrace.sources.clickhouse.client import close_all, connect

    client = connect(f"chdb:{data}", create=True)
    create_tables(client)
    for run in _runs():
        insert(client, exporter_rows(to_protobuf(run)))
    close_all()


@pytest.fixture(scope="module")
def ch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("fleet-service") / "chdb"
    fill_dir(data)
    return data


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STARTTRACE", "VLLM_STARTTRACE", "OTEL_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


LOG: list[Path] = []


@pytest.fixture(scope="module")
def service(ch_dir: Path) -> Iterator[str]:
    log = ch_dir.parent / "service.log"
    LOG.append(log)
    with serving(["--clickhouse", f"chdb:{ch_dir}"], log, _env(), REPO) as url:
        yield url


def _fleet(url: str, **params: str) -> dict[str, Any]:
    """/fleet once the service has derived every run's facts (its background deriver)."""
    deadline = time.monotonic() + 120
    while True:
        got = httpx.get(url + "/fleet", params=params, timeout=60)
        assert got.status_code == 200, got.text + (LOG[-1].read_text(errors="replace")[-4000:] if LOG else "")
        doc = got.json()
        # never silent: every answer, from the first one on, counts each run once (with facts, or pending)
        if not params.get("service") and not params.get("since"):
            assert doc["runs"] + doc["pending"] == RUNS, doc
        if doc["runs"] == RUNS or time.monotonic() > deadline:
            return doc
        time.sleep(0.3)


def test_fleet_over_http_from_clickhouse(service: str) -> None:
    first = httpx.get(service + "/fleet", timeout=60).json()  # right after the start, on an unseen store
    assert first["runs"] + first["pending"] == RUNS, first
    doc = _fleet(service, by="service.version")
    assert doc["runs"] == RUNS and doc["pending"] == 0 and doc["key"] == "service.version"
    assert [g["value"] for g in doc["groups"]] == list(VERSIONS)  # first-seen order
    for g in doc["groups"]:
        assert g["runs"] == 3
        assert g["time_to_ready_s"]["p50"] > 0 and g["time_to_ready_s"]["p95"] >= g["time_to_ready_s"]["p50"]
        assert "import" in g["phases"] and set(g["phases"]["import"]) == {"p50", "p95"}
    assert len(doc["slowest"]) == RUNS
    top = doc["slowest"][0]
    assert top["url"] == f"/startup/{top['run_id']}"
    assert httpx.get(service + top["url"], timeout=60).status_code == 200  # the link opens the waterfall
    for reg in doc["regressions"]:
        assert reg["p50_delta_s"] > 0 and reg["from"] in VERSIONS and reg["to"] in VERSIONS
    by_host = _fleet(service, by="host")
    assert by_host["key"] == "host.name" and [g["value"] for g in by_host["groups"]] == ["synth-host"]
    none = httpx.get(service + "/fleet", params={"service": "nope"}, timeout=60).json()
    assert none["runs"] == 0 and none["groups"] == [] and none["slowest"] == []
    since = httpx.get(service + "/fleet", params={"since": "1750004500"}, timeout=60).json()
    assert since["runs"] == RUNS - 5
    assert httpx.get(service + "/fleet", params={"since": "soon"}, timeout=60).status_code == 400


def test_fleet_page_escapes_span_data(service: str) -> None:
    _fleet(service)
    page = httpx.get(service + "/fleet", headers={"Accept": "text/html"}, timeout=60)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<b>0.33.0</b>" not in page.text and "&lt;b&gt;0.33.0&lt;/b&gt;" in page.text
    assert 'id="fleet-groups"' in page.text and 'href="/startup/fl-' in page.text


def test_runs_from_clickhouse_at_full_detail(service: str) -> None:
    runs = httpx.get(service + "/runs", timeout=60).json()["runs"]
    assert {r["run_id"] for r in runs} == {f"fl-{i}" for i in range(RUNS)}
    assert all(r["source"] == "clickhouse" for r in runs)
    src = _runs()[4]
    doc = httpx.get(service + "/startup/fl-4", params={"spans": "all"}, timeout=60).json()
    assert doc["run_id"] == "fl-4" and len(doc["lanes"]) == len(src.processes)
    assert sum(len(lane["spans"]) for lane in doc["lanes"]) >= src.span_count - 1  # all but the root
    html = httpx.get(service + "/startup/fl-4", headers={"Accept": "text/html"}, timeout=60)
    assert html.status_code == 200
    export = httpx.get(service + "/runs/fl-4/export", params={"format": "otlp-json"}, timeout=60)
    assert export.status_code == 200
    spans = [s for rs in export.json()["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(spans) == src.span_count
    cmp = httpx.get(service + "/compare", params={"a": "fl-0", "b": "fl-8"}, timeout=60)
    assert cmp.status_code == 200
    assert httpx.get(service + "/startup/no-such-run", timeout=60).status_code == 404
    # the Collector writes ClickHouse: this service takes no OTLP
    assert httpx.post(service + "/v1/traces", content=b"", timeout=60).status_code == 404


def test_metrics_carry_no_run_id(service: str) -> None:
    _fleet(service)
    text = httpx.get(service + "/metrics", timeout=60).text
    assert "run_id=" not in text
    assert "starttrace_run_phase_seconds_bucket{" in text
    assert 'starttrace_run_time_to_ready_seconds_count{service="vllm"} 9.0' in text


def test_cli_fleet_report_export_from_clickhouse(ch_dir: Path, tmp_path: Path, service: str) -> None:
    # the service holds its engine's directory: the CLI reads one of its own (chdb: one process each)
    copy = tmp_path / "cli-chdb"
    fill_dir(copy)
    cli = [sys.executable, "-m", "starttrace"]
    out = subprocess.run(
        [*cli, "fleet", "--clickhouse", f"chdb:{copy}", "--by", "service.version", "--json"],
        env=_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["runs"] == RUNS and [g["value"] for g in doc["groups"]] == list(VERSIONS)
    assert doc["pending"] == 0  # derived before the answer
    text = subprocess.run(
        [*cli, "fleet", "--clickhouse", f"chdb:{copy}", "--by", "tp"],
        env=_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert text.returncode == 0 and "fleet startup by vllm.tensor_parallel_size" in text.stdout, text.stderr
    rep = subprocess.run(
        [*cli, "report", "fl-2", "--clickhouse", f"chdb:{copy}", "--json"],
        env=_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rep.returncode == 0, rep.stderr
    assert json.loads(rep.stdout)["run_id"] == "fl-2"
    exp = subprocess.run(
        [
            *cli,
            "export",
            "fl-2",
            "--clickhouse",
            f"chdb:{copy}",
            "--format",
            "perfetto",
            "-o",
            str(tmp_path / "p.json"),
        ],
        env=_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert exp.returncode == 0, exp.stderr
    assert json.loads((tmp_path / "p.json").read_text())
    missing = subprocess.run(
        [*cli, "report", "nope", "--clickhouse", f"chdb:{copy}"],
        env=_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr


def test_fleet_over_the_embedded_store(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from starttrace.service.app import Settings, create_app

    app = create_app(Settings(db=tmp_path / "st.db", fleet_interval_s=0.2, fleet_idle_s=0.0, decode_workers=0))
    with TestClient(app, base_url="http://localhost") as client:
        for run in _runs():
            for body in protobuf_batches(run):
                r = client.post("/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"})
                assert r.status_code == 200
        doc = _fleet_client(client)
        assert doc["runs"] == RUNS
        assert [g["value"] for g in doc["groups"]] == list(VERSIONS)
        assert doc["slowest"][0]["url"].startswith("/startup/fl-")
        # derived once: a second pass finds nothing missing
        assert app.state.facts.missing(idle_s=0) == []
    # `starttrace fleet --db`: the same answer from the store's file
    for derive in ("--no-derive", "--derive"):
        out = subprocess.run(
            [sys.executable, "-m", "starttrace", "fleet", "--db", str(tmp_path / "st.db"), "--json", derive],
            env=_env(),
            cwd=str(REPO),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
        cli = json.loads(out.stdout)
        assert cli["runs"] == RUNS and cli["groups"] == doc["groups"]
    missing = subprocess.run(
        [sys.executable, "-m", "starttrace", "fleet", "--db", str(tmp_path / "none.db")],
        env=_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert missing.returncode == 2 and "no store at" in missing.stderr


def _fleet_client(client: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        doc = client.get("/fleet").json()
        assert doc["runs"] + doc["pending"] == RUNS, doc  # the embedded store: never silent either
        if doc["runs"] == RUNS or time.monotonic() > deadline:
            return doc
        time.sleep(0.3)
