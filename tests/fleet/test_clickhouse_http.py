"""The HTTP client path (clickhouse-connect) against a real ClickHouse server.

No ClickHouse server that can hold otel_traces runs on this project's machines: Debian's
clickhouse-server is 18.16 (no Map, no DateTime64), no PyPI package ships a server binary, and
chdb's embedded engine, although it carries ClickHouse's HTTP handlers, cannot start a listener
in-process (`SYSTEM START LISTEN HTTP` answers "start_servers_callback is not set"). So:
- against a server named by STARTTRACE_TEST_CLICKHOUSE_URL (http://user:pass@host:8123/db), the
  same checks as on chdb run over HTTP: the exporter's DDL, rows filled as the exporter fills them,
  runs listed and loaded, facts written and the fleet answered in SQL (skipped without one);
- always: the client's real connection path to a port where nothing listens fails as a
  ClickHouseError naming the URL without its password.
No mock of ClickHouse stands in for a server.
"""

from __future__ import annotations

import os
import socket
import uuid

import pytest

pytest.importorskip("clickhouse_connect")

from starttrace.sources.clickhouse.client import ClickHouseError, HttpClient, parse_url

SERVER = os.environ.get("STARTTRACE_TEST_CLICKHOUSE_URL")


def test_no_server_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(ClickHouseError) as err:
            HttpClient(parse_url(f"http://bob:hunter2@127.0.0.1:{port}/otel"))
    assert f"127.0.0.1:{port}" in str(err.value) and "hunter2" not in str(err.value)


@pytest.mark.skipif(not SERVER, reason="no real ClickHouse server here (set STARTTRACE_TEST_CLICKHOUSE_URL)")
def test_source_and_facts_over_http() -> None:
    from otel_clickhouse import create_tables, exporter_rows, insert
    from synth_runs import make_run, to_protobuf

    from starttrace.sources.clickhouse.facts import ClickHouseFacts
    from starttrace.sources.clickhouse.runs import ClickHouseRuns

    assert SERVER is not None
    base = parse_url(SERVER)
    table = f"otel_traces_{uuid.uuid4().hex[:8]}"  # a table of its own: the server may hold real data
    client = HttpClient(parse_url(f"{SERVER.split('?')[0]}?table={table}"))
    try:
        create_tables(client)
        srun = make_run(ranks=2, imports_per_rank=5, run_id=f"http-{table}", seed=3)
        insert(client, exporter_rows(to_protobuf(srun)))
        runs = ClickHouseRuns(client)
        assert srun.run_id in [r["run_id"] for r in runs.list_runs()]
        run = runs.load_run(srun.run_id)
        assert run is not None and run.span_count() == srun.span_count
        assert set(runs.load_runs([srun.run_id])) == {srun.run_id}
        facts = ClickHouseFacts(client)
        assert srun.run_id in facts.missing(idle_s=0)
    finally:
        for suffix in ("_trace_id_ts_mv", "_trace_id_ts", ""):
            client.command(f"DROP TABLE IF EXISTS `{base.database}`.`{table}{suffix}`")
        client.close()
