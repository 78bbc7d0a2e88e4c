"""Facts at the edge (issue 34 item 1): a traced run's automatic OTLP export carries one
`starttrace.run` span whose facts equal the service's own analysis of the same run, on the
embedded service (which does not take the span as a startup span) and read back from ClickHouse's
`otel_traces` as the Collector's exporter writes it (complete with no deriving)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from starttrace.run.facts_attrs import SPAN_NAME, facts_from_attributes

# the facts' `version` is the source's own row count (journal records, store rows, otel_traces rows),
# which tells a store when to derive again: it differs by source by design
SOURCE_ONLY = ("version",)


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    a = {k: v for k, v in a.items() if k not in SOURCE_ONLY}
    b = {k: v for k, v in b.items() if k not in SOURCE_ONLY}
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for key in a:
        if isinstance(a[key], dict):
            assert a[key].keys() == b[key].keys(), key
            for sub in a[key]:
                assert (
                    a[key][sub] == pytest.approx(b[key][sub], abs=1e-6)
                    if isinstance(a[key][sub], float)
                    else a[key][sub] == b[key][sub]
                ), (key, sub, a[key][sub], b[key][sub])
        elif isinstance(a[key], float):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
        else:
            assert a[key] == b[key], (key, a[key], b[key])


def test_export_carries_the_services_facts(run_tree: Callable[..., Any], otlp_receiver: Any, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from starttrace.service.app import Settings, create_app

    run = run_tree(env={"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.url}, timeout=180)
    otlp_receiver.wait_for_spans(run.span_count(), timeout=60)
    deadline = time.monotonic() + 30
    while not otlp_receiver.spans(facts=True) and time.monotonic() < deadline:
        time.sleep(0.2)
    shipped = otlp_receiver.spans(facts=True)
    assert shipped, "no starttrace.run span arrived"
    latest = max(shipped, key=lambda s: (s.attributes["starttrace.run.export_seq"], s.end_ns))
    assert latest.trace_id == run.trace_id and latest.resource["starttrace.run_id"] == run.run_id
    assert latest.attributes["starttrace.phase"] == "facts"
    assert latest.attributes["starttrace.run.id"] == run.run_id
    edge = facts_from_attributes(latest.attributes)
    assert edge["run_id"] == run.run_id and edge["processes"] == len(run.processes) > 1
    assert edge["phases"] and all(
        latest.attributes[f"starttrace.run.phase.{p}_s"] == v for p, v in edge["phases"].items()
    )

    # the service's own analysis of the same run, from the same OTLP requests
    app = create_app(Settings(db=tmp_path / "s.db", fleet_interval_s=0.2, fleet_idle_s=0.0, decode_workers=0))
    with otlp_receiver.lock:
        requests = list(otlp_receiver.requests)
    with TestClient(app, base_url="http://localhost") as http:
        for request in requests:
            posted = http.post(
                "/v1/traces", content=request.SerializeToString(), headers={"Content-Type": "application/x-protobuf"}
            )
            assert posted.status_code == 200, posted.text
        deadline = time.monotonic() + 60
        while (own := app.state.facts.get(run.run_id)) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert own is not None, app.state.deriver.errors
        stored = app.state.store.load_run(run.run_id)
        assert SPAN_NAME not in set(stored.spans.get_column("name").to_list())  # no startup span of the run
        assert stored.span_count() == run.span_count()
        assert http.get(f"/startup/{run.run_id}").status_code == 200
        fleet = http.get("/fleet").json()
        assert fleet["runs"] == 1 and fleet["pending"] == 0
    _same(edge, own)

    # read back from otel_traces (every value a string there), complete without deriving
    pytest.importorskip("chdb")
    from otel_clickhouse import create_tables, exporter_rows, insert

    from starttrace.analysis.fleet import FACTS_VERSION
    from starttrace.sources.clickhouse.client import close_all, connect
    from starttrace.sources.clickhouse.facts import ClickHouseFacts
    from starttrace.sources.clickhouse.runs import ClickHouseRuns

    client = connect(f"chdb:{tmp_path / 'chdb'}", create=True)
    try:
        create_tables(client)
        for request in requests:
            insert(client, exporter_rows(request))
        facts = ClickHouseFacts(client)
        rows = facts.rows(facts_version=FACTS_VERSION)
        assert facts.pending(facts_version=FACTS_VERSION) == 0
        assert facts.missing(idle_s=0, facts_version=FACTS_VERSION) == []  # nothing to derive
        ch_run = ClickHouseRuns(client).load_run(run.run_id)
        listed = ClickHouseRuns(client).list_runs()
    finally:
        close_all()
    assert len(rows) == 1
    _same(rows[0], own)
    assert ch_run is not None and SPAN_NAME not in set(ch_run.spans.get_column("name").to_list())
    assert listed[0]["spans"] == ch_run.span_count()
