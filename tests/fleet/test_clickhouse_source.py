"""The ClickHouse run source on ClickHouse's own engine (chdb), over the Collector exporter's DDL,
filled the way the exporter fills it (tests/otel_clickhouse.py). No mock of ClickHouse."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("chdb")

from otel_clickhouse import create_tables, exporter_rows, insert
from synth_runs import make_run, to_protobuf

from starttrace.sources.clickhouse.client import ClickHouseError, Client, close_all, connect, parse_url
from starttrace.sources.clickhouse.runs import ClickHouseRuns, typed


@pytest.fixture(scope="module")
def ch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    client = connect(f"chdb:{tmp_path_factory.mktemp('chdb') / 'data'}", create=True)
    create_tables(client)
    yield client
    close_all()


def _fill(client: Client, run_id: str, seed: int, **kw: object) -> object:
    srun = make_run(ranks=2, imports_per_rank=6, run_id=run_id, seed=seed, **kw)  # type: ignore[arg-type]
    req = to_protobuf(srun)
    # what starttrace's own exporter adds (views/otlp.py): a thread id, an error status, typed values,
    # a forkserver child's launch as a link marked starttrace.link = launched_by
    worker = req.resource_spans[-1].scope_spans[0].spans
    launch = req.resource_spans[0].scope_spans[0].spans[2]
    proc = next(s for s in worker if s.name == "process")
    link = proc.links.add()
    link.trace_id = proc.trace_id
    link.span_id = launch.span_id
    kv = link.attributes.add()
    kv.key, kv.value.string_value = "starttrace.link", "launched_by"
    imp = next(s for s in worker if s.name.startswith("import "))
    for key, setter in (("thread.id", ("int_value", 140001)), ("x.float", ("double_value", 1.25))):
        kv = imp.attributes.add()
        kv.key = key
        setattr(kv.value, setter[0], setter[1])
    kv = imp.attributes.add()
    kv.key = "x.list"
    kv.value.array_value.values.add().string_value = "a"
    kv.value.array_value.values.add().int_value = 2
    imp.status.code = 2
    imp.status.message = "boom"
    insert(client, exporter_rows(req))
    return srun


def test_parse_url() -> None:
    u = parse_url("http://bob:s%40cret@ch.example:8124/traces?table=spans")
    assert (u.kind, u.host, u.port, u.user, u.password, u.database, u.table) == (
        "http",
        "ch.example",
        8124,
        "bob",
        "s@cret",
        "traces",
        "spans",
    )
    assert "s@cret" not in u.redacted()
    h = parse_url("https://ch.example")
    assert (h.secure, h.port, h.database, h.table, h.user) == (True, 8443, "otel", "otel_traces", "default")
    c = parse_url("chdb:/var/lib/x?database=d1&table=t1")
    assert (c.kind, c.path, c.database, c.table) == ("chdb", "/var/lib/x", "d1", "t1")
    assert parse_url("chdb:rel/dir").traces == "`otel`.`otel_traces`"
    for bad in ("ftp://x", "chdb:", "http://h/db?table=a;DROP", "http://h/db%60x", "http://h/db?tabel=x"):
        with pytest.raises(ClickHouseError):
            parse_url(bad)


def test_typed_resource_values() -> None:
    assert typed("process.pid", "123") == 123
    assert typed("process.command_args", '["python","-m","vllm"]') == ["python", "-m", "vllm"]
    assert typed("x.flag", "true") is True
    assert typed("service.version", "1") == "1"  # a version stays a string
    assert typed("host.name", "007") == "007"


def test_ddl_is_the_exporters(ch: Client) -> None:
    cols = [r["name"] for r in ch.arrow("DESCRIBE TABLE otel.otel_traces").to_pylist()]
    assert cols[:15] == [
        "Timestamp",
        "TraceId",
        "SpanId",
        "ParentSpanId",
        "TraceState",
        "SpanName",
        "SpanKind",
        "ServiceName",
        "ResourceAttributes",
        "ScopeName",
        "ScopeVersion",
        "SpanAttributes",
        "Duration",
        "StatusCode",
        "StatusMessage",
    ]
    types = {r["name"]: r["type"] for r in ch.arrow("DESCRIBE TABLE otel.otel_traces").to_pylist()}
    assert types["ResourceAttributes"] == "Map(LowCardinality(String), String)"
    assert types["Duration"] == "UInt64"
    assert types["Timestamp"] == "DateTime64(9)"


def test_load_run_as_columns(ch: Client) -> None:
    srun = _fill(ch, "ch-run-1", 11)
    runs = ClickHouseRuns(ch)
    run = runs.load_run("ch-run-1")
    assert run is not None and run.source == "clickhouse"
    assert run.span_count() == srun.span_count  # type: ignore[attr-defined]
    assert len(run.processes) == len(srun.processes)  # type: ignore[attr-defined]
    assert [s.name for s in run.root_spans] == ["startup"]
    assert run.spans.filter(run.spans["name"] == "startup").height == 0
    # ids as the exporter wrote them: lowercase hex, parents resolved across processes
    ids = set(run.spans["span_id"])
    assert all(len(i) == 16 and i == i.lower() for i in ids)
    workers = [p for p in run.processes if p.role == "worker"]
    assert sorted(p.rank for p in workers) == [0, 1]  # typed back from the exporter's strings
    assert all(isinstance(p.pid, int) and p.pid > 0 for p in run.processes)
    assert all(p.process_span_id in ids for p in run.processes)
    assert isinstance(workers[0].resource["process.command_args"], list)
    # the hot attributes as columns; times in epoch ns, end = start + Duration
    imports = run.spans.filter(run.spans["phase"] == "import")
    assert imports.height > 0 and imports["module"].null_count() == 0
    assert (run.spans["end"] >= run.spans["start"]).all()
    # the one span given a thread, an error and typed attributes
    odd = run.spans.filter(run.spans["error"].is_not_null()).row(0, named=True)
    assert odd["error"] == "boom" and odd["thread"] == 140001
    attrs = json.loads(odd["attrs"])
    assert attrs["x.float"] == 1.25 and attrs["x.list"] == ["a", 2]
    assert "starttrace.phase" not in attrs and "thread.id" not in attrs
    # the launch link as launched_by
    launched = run.spans.filter(run.spans["launched_by"].is_not_null())
    assert launched.height == 1 and launched["name"][0] == "process"


def test_list_runs_and_filters(ch: Client) -> None:
    _fill(ch, "ch-run-2", 12, service="sglang")
    runs = ClickHouseRuns(ch)
    listed = {r["run_id"]: r for r in runs.list_runs()}
    assert {"ch-run-1", "ch-run-2"} <= set(listed)
    assert listed["ch-run-2"]["service"] == "sglang"
    assert listed["ch-run-2"]["spans"] == runs.run_version("ch-run-2")
    assert [r["run_id"] for r in runs.list_runs(service="sglang")] == ["ch-run-2"]
    start = listed["ch-run-2"]["start_ns"]
    assert "ch-run-2" not in [r["run_id"] for r in runs.list_runs(since_ns=start + 1)]
    assert runs.load_run("no-such-run") is None and runs.run_version("no-such-run") is None
    # a run id is a query parameter, never SQL text
    assert runs.load_run("x' OR 1=1 --") is None


def test_open_then_ended_copy_kept_once(ch: Client) -> None:
    srun = make_run(ranks=1, imports_per_rank=2, run_id="ch-run-3", seed=13, in_progress_rank=0)
    first = exporter_rows(to_protobuf(srun))
    insert(ch, first)
    runs = ClickHouseRuns(ch)
    live = runs.load_run("ch-run-3")
    assert live is not None and live.spans["in_progress"].any()
    # the ended copies arrive later (the exporter appends rows; nothing is updated in place)
    ended = [
        dict(r, SpanAttributes={k: v for k, v in r["SpanAttributes"].items() if k != "starttrace.in_progress"})
        for r in first
        if r["SpanAttributes"].get("starttrace.in_progress") == "true"
    ]
    insert(ch, ended)
    done = runs.load_run("ch-run-3")
    assert done is not None
    assert done.span_count() == live.span_count()
    assert not done.spans["in_progress"].any()


def test_chdb_path_is_a_directory(tmp_path: Path) -> None:
    assert parse_url(f"chdb:{tmp_path}").path == str(tmp_path)


def test_missing_facts_follow_the_spans(ch: Client) -> None:
    from starttrace.sources.clickhouse.facts import ClickHouseFacts

    facts = ClickHouseFacts(ch)
    runs = ClickHouseRuns(ch)
    assert {"ch-run-1", "ch-run-2"} <= set(facts.missing(idle_s=0))
    assert facts.missing(idle_s=10**9) == []  # nothing quiet for that long: not yet
    row = {
        "run_id": "ch-run-1",
        "trace_id": "",
        "service": "vllm",
        "start_ns": 1_700_000_000 * 10**9,
        "status": "ready",
        "time_to_ready_s": 1.0,
        "startup_s": 1.0,
        "phases": {},
        "role_phases": {},
        "findings": {},
        "identity": {},
        "processes": 1,
        "spans": 1,
        "version": runs.run_version("ch-run-1"),
        "facts_version": 1,
    }
    facts.write([row])
    assert "ch-run-1" not in facts.missing(idle_s=0)
    _fill(ch, "ch-run-1b", 21)  # another run: ch-run-1 stays derived
    assert "ch-run-1" not in facts.missing(idle_s=0) and "ch-run-1b" in facts.missing(idle_s=0)
    facts.write([dict(row, version=row["version"] - 1)])  # derived from fewer spans than there are now
    assert "ch-run-1" in facts.missing(idle_s=0)


def test_load_runs_in_one_batch_as_one_by_one(ch: Client) -> None:
    runs = ClickHouseRuns(ch)
    batch = runs.load_runs(["ch-run-1", "ch-run-2", "no-such-run"])
    assert set(batch) == {"ch-run-1", "ch-run-2"}
    for rid, run in batch.items():
        one = runs.load_run(rid)
        assert one is not None
        assert run.spans.sort("lane", "span_id").equals(one.spans.sort("lane", "span_id"))
        assert [p.instance_id for p in run.processes] == [p.instance_id for p in one.processes]
        assert [p.resource for p in run.processes] == [p.resource for p in one.processes]
        assert [s.span_id for s in run.root_spans] == [s.span_id for s in one.root_spans]


def test_concurrent_queries_keep_their_parameters(ch: Client) -> None:
    """A request and the facts deriver query one chdb session at once: each query keeps its own
    parameters (without the client's query lock, one lost them: "Substitution `by` is not set")."""
    import threading

    runs = ClickHouseRuns(ch)
    want = {rid: runs.run_version(rid) for rid in ("ch-run-1", "ch-run-2", "ch-run-3")}
    errors: list[str] = []

    def work(rid: str) -> None:
        try:
            for _ in range(25):
                got = runs.run_version(rid)
                if got != want[rid]:
                    errors.append(f"{rid}: {got} != {want[rid]}")
        except Exception as exc:
            errors.append(f"{rid}: {exc}")

    threads = [threading.Thread(target=work, args=(rid,)) for rid in want for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
