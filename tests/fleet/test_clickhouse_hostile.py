"""Issue 38's ClickHouse items, reproduced on the real service and real chdb: values reach ClickHouse
exactly as sent (item 1), the source is checked at start and a failing store answers 503 JSON
(item 2), facts are kept per traces table (item 3), and `Duration = 2^64-1` gives no end before the
start (item 7, the ClickHouse read side)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from st_service_helpers import serving

pytest.importorskip("chdb")

from otel_clickhouse import create_tables, exporter_rows, insert
from synth_runs import make_run, to_protobuf

REPO = Path(__file__).resolve().parents[2]
# run ids a hostile or careless exporter may send: escapes that must stay text, a trailing backslash,
# a newline and a tab
ODD_IDS = ("fleet-00001", "back\\slash\\", "new\nline", "a\ttab")
T0 = 1_750_000_000 * 10**9


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STARTTRACE", "VLLM_STARTTRACE", "OTEL_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "starttrace", *args],
        env=_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _fill_here(data: Path, table: str = "otel_traces", ids: tuple[str, ...] = ODD_IDS) -> None:
    from starttrace.sources.clickhouse.client import close_all, connect

    client = connect(f"chdb:{data}?table={table}", create=True)
    create_tables(client)
    for i, rid in enumerate(ids):
        run = make_run(ranks=2, imports_per_rank=3, run_id=rid, seed=70 + i, t0=T0 + i * 10**12)
        insert(client, exporter_rows(to_protobuf(run)))
    close_all()


def _fill_dir(data: Path) -> None:
    """In a process of its own (chdb: one engine per process; the service opens the directory next)."""
    code = (
        "import sys; sys.path[:0] = [sys.argv[2], sys.argv[3]]\n"
        "from pathlib import Path\n"
        "import test_clickhouse_hostile as t\n"
        "t._fill_here(Path(sys.argv[1]))\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(data), str(REPO / "tests"), str(Path(__file__).parent)],
        env=_env(),
        cwd=str(REPO),
        check=True,
        timeout=300,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("hostile") / "chdb"
    _fill_dir(data)
    return data


def test_cli_reads_ids_exactly_as_sent(ch_dir: Path) -> None:
    url = f"chdb:{ch_dir}"
    escaped = _cli("report", "fleet-0000\\x31", "--clickhouse", url, "--json")
    assert escaped.returncode == 2 and "no run" in escaped.stderr, escaped.stderr  # not fleet-00001
    for rid in ODD_IDS:
        got = _cli("report", rid, "--clickhouse", url, "--json")
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["run_id"] == rid


@pytest.fixture(scope="module")
def service(ch_dir: Path) -> Iterator[str]:
    with serving(["--clickhouse", f"chdb:{ch_dir}"], ch_dir.parent / "service.log", _env(), REPO) as url:
        yield url


def test_service_takes_values_exactly_as_sent(service: str) -> None:
    assert httpx.get(service + "/startup/fleet-0000%5Cx31", timeout=60).status_code == 404
    assert httpx.get(service + "/startup/fleet-00001", timeout=60).status_code == 200
    assert httpx.get(service + "/runs", params={"service": "vll\\x6d"}, timeout=60).json()["runs"] == []
    assert len(httpx.get(service + "/runs", params={"service": "vllm"}, timeout=60).json()["runs"]) == len(ODD_IDS)
    for path in ("/runs", "/fleet"):  # a trailing backslash is a value like any other
        got = httpx.get(service + path, params={"service": "vllm\\"}, timeout=60)
        assert got.status_code == 200, got.text
    listed = {r["run_id"] for r in httpx.get(service + "/runs", timeout=60).json()["runs"]}
    assert listed == set(ODD_IDS)
    for rid in ODD_IDS:
        got = httpx.get(service + "/startup/" + quote(rid, safe=""), timeout=60)
        assert got.status_code == 200, (rid, got.text)
        assert got.json()["run_id"] == rid
        exp = httpx.get(service + f"/runs/{quote(rid, safe='')}/export", params={"format": "otlp-json"}, timeout=60)
        assert exp.status_code == 200, (rid, exp.text)


def test_a_held_directory_is_refused_at_start(service: str, ch_dir: Path, tmp_path: Path) -> None:
    got = _cli("serve", "--port", str(_free_port()), "--db", str(tmp_path / "s.db"), "--clickhouse", f"chdb:{ch_dir}")
    assert got.returncode == 2, got.stderr
    assert "cannot open the chdb data directory" in got.stderr and "Traceback" not in got.stderr


def _serve_refused(url: str, tmp_path: Path, *words: str, db: Path | None = None) -> str:
    got = _cli("serve", "--port", str(_free_port()), "--db", str(db or tmp_path / "s.db"), "--clickhouse", url)
    assert got.returncode == 2, (url, got.stdout, got.stderr)
    assert "Traceback" not in got.stderr, got.stderr
    text = " ".join(got.stderr.split())
    for word in words:
        assert word in text, (word, text)
    return text


def test_sources_checked_at_start(tmp_path: Path) -> None:
    from starttrace.sources.clickhouse.client import close_all, connect

    data = tmp_path / "chdb"
    client = connect(f"chdb:{data}", create=True)
    create_tables(client)
    client.command("CREATE TABLE otel.wrong (Timestamp DateTime64(9), x Int32) ENGINE = MergeTree ORDER BY x")
    close_all()
    _serve_refused(f"chdb:{data}?table=nope", tmp_path, "no table otel.nope")
    _serve_refused(f"chdb:{data}?table=wrong", tmp_path, "not the exporter's otel_traces schema", "SpanId")
    _serve_refused(f"chdb:{data}?database=nodb", tmp_path, "no table nodb.otel_traces")
    missing = tmp_path / "missing"
    _serve_refused(f"chdb:{missing}", tmp_path, "no chdb data directory")
    assert not missing.exists()  # nothing created where the reader was only asked to read
    _serve_refused("chdb:/etc/passwd", tmp_path, "is not a directory")
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("not a database\n" * 100)
    refused = _cli("serve", "--port", str(_free_port()), "--db", str(not_sqlite), "--no-journal")
    assert refused.returncode == 2 and "not a starttrace store" in " ".join(refused.stderr.split()), refused.stderr
    assert "Traceback" not in refused.stderr
    fleet = _cli("fleet", "--clickhouse", f"chdb:{data}?table=nope")
    assert fleet.returncode == 2 and "no table otel.nope" in " ".join(fleet.stderr.split()), fleet.stderr
    # the refused database was not created (nor a facts table in it)
    client = connect(f"chdb:{data}")
    dbs = {r["name"] for r in client.arrow("SELECT name FROM system.databases").to_pylist()}
    assert "nodb" not in dbs
    tables = {r["name"] for r in client.arrow("SELECT name FROM system.tables WHERE database = 'otel'").to_pylist()}
    assert not any(t.startswith("starttrace_runs") for t in tables), tables
    close_all()


@pytest.fixture
def in_process(tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """The real app over a chdb directory this process holds (so that the test can break the store)."""
    from fastapi.testclient import TestClient

    from starttrace.service.app import Settings, create_app
    from starttrace.sources.clickhouse.client import close_all

    data = tmp_path / "chdb"
    _fill_here(data, ids=("r-a", "r-b"))
    app = create_app(Settings(db=tmp_path / "s.db", clickhouse=f"chdb:{data}", start_background=False))
    yield TestClient(app, base_url="http://localhost"), app.state.store.client
    close_all()


def test_store_errors_on_requests_are_503_json(in_process: tuple[Any, Any]) -> None:
    http, client = in_process
    assert http.get("/runs").status_code == 200
    client.command("RENAME TABLE otel.otel_traces TO otel.gone")  # the table goes away under the service
    for path in (
        "/runs",
        "/startup/r-a",
        "/compare?a=r-a&b=r-b",
        "/runs/r-a/export?format=perfetto",
        "/metrics",
        "/fleet",
    ):
        got = http.get(path)
        assert got.status_code == 503, (path, got.status_code, got.text[:300])
        assert got.headers["content-type"].startswith("application/json"), path
        assert "ClickHouse" in got.json()["error"], path


def test_facts_are_kept_per_traces_table(tmp_path: Path) -> None:
    from starttrace.service.fleet import cli_answer
    from starttrace.sources.clickhouse.client import close_all

    data = tmp_path / "chdb"
    _fill_here(data, ids=("a-1", "a-2", "a-3"))
    _fill_here(data, table="otel_traces_b", ids=("b-1", "b-2"))
    try:
        default = cli_answer("service.version", None, None, None, f"chdb:{data}", None)
        other = cli_answer("service.version", None, None, None, f"chdb:{data}?table=otel_traces_b", None)
        again = cli_answer("service.version", None, None, None, f"chdb:{data}", None)
    finally:
        close_all()
    assert default["runs"] == again["runs"] == 3
    assert other["runs"] == 2
    assert {r["run_id"] for r in other["slowest"]} == {"b-1", "b-2"}


def test_an_absurd_duration_gives_no_end_before_the_start(tmp_path: Path) -> None:
    from starttrace.sources.clickhouse.client import close_all, connect
    from starttrace.sources.clickhouse.runs import ClickHouseRuns

    client = connect(f"chdb:{tmp_path / 'chdb'}", create=True)
    create_tables(client)
    rows = exporter_rows(to_protobuf(make_run(ranks=2, imports_per_rank=3, run_id="absurd", seed=5, t0=T0)))
    bad = next(r for r in rows if r["SpanName"] not in ("startup", "process", "ready"))
    bad["Duration"] = 2**64 - 1  # the exporter's uint64 of a span that ends before it starts
    insert(client, rows)
    try:
        runs = ClickHouseRuns(client)
        run = runs.load_run("absurd")
        listed = runs.list_runs()
    finally:
        close_all()
    assert run is not None
    assert run.spans.filter(run.spans["end"] < run.spans["start"]).height == 0
    got = run.spans.filter(run.spans["span_id"] == bad["SpanId"]).row(0, named=True)
    assert got["end"] == got["start"] and got["instant"]
    assert any("impossible Duration" in p for p in run.problems), run.problems
    assert listed[0]["end_ns"] >= listed[0]["start_ns"] and listed[0]["end_ns"] < T0 + 10**13
