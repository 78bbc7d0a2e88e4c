"""Facts that travel with the run (issue 34 item 1) over ClickHouse: runs whose export carried a
`starttrace.run` span are in the fleet answer from the first query, without deriving; the others
are `pending` until derived; the later export supersedes the earlier; the span is no startup span."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("chdb")

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from otel_clickhouse import create_tables, exporter_rows, insert
from synth_runs import make_run, to_protobuf, to_run

from starttrace.analysis.fleet import FACTS_VERSION, fleet_answer, run_facts
from starttrace.analysis.lanes import build_model
from starttrace.run.facts_attrs import facts_attributes, facts_from_attributes
from starttrace.service.fleet import Prefetching, derive_all, direct_loader, fleet_of
from starttrace.sources.clickhouse.client import Client, close_all, connect
from starttrace.sources.clickhouse.facts import ClickHouseFacts
from starttrace.sources.clickhouse.runs import ClickHouseRuns
from starttrace.views.otlp import facts_span

T0 = 1_760_000_000 * 10**9
WITH_SPAN, WITHOUT = 6, 3


def _facts_of(srun: Any) -> dict[str, Any]:
    run = to_run(srun)
    return run_facts(run, build_model(run))


@pytest.fixture
def ch(tmp_path: Path) -> Iterator[Client]:
    client = connect(f"chdb:{tmp_path / 'chdb'}", create=True)
    create_tables(client)
    yield client
    close_all()


def _fill(client: Client) -> dict[str, dict[str, Any]]:
    shipped: dict[str, dict[str, Any]] = {}
    for i in range(WITH_SPAN + WITHOUT):
        srun = make_run(ranks=2, imports_per_rank=4, run_id=f"edge-{i}", seed=90 + i, t0=T0 + i * 10**12)
        for p in srun.processes:
            p.resource["service.version"] = "0.32.0" if i % 2 else "0.33.0"
        insert(client, exporter_rows(to_protobuf(srun)))
        if i < WITH_SPAN:
            facts = _facts_of(srun)
            run = to_run(srun)
            stale = dict(facts, time_to_ready_s=999.0)  # the export at ready, superseded by the one at exit
            for seq, f in ((0, stale), (1, facts)):
                insert(client, exporter_rows(encode_spans([facts_span(run, f, seq, now_ns=T0 + i * 10**12 + 10**11)])))
            shipped[srun.run_id] = facts
    return shipped


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    drop = ("version",)  # the source's own row count (tells a store when to derive again)
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}


def test_codec_round_trips_through_strings() -> None:
    srun = make_run(ranks=2, imports_per_rank=3, run_id="codec", seed=3, t0=T0)
    facts = _facts_of(srun)
    facts["identity"]["vllm.tensor_parallel_size"] = "2"  # a string that looks like a number stays one
    facts["kind"] = {"compile_cache": "cold"}  # a field another branch adds travels without a change here
    facts["fingerprint"] = {}
    attrs = facts_attributes(facts, 1)
    assert attrs["starttrace.run.id"] == "codec" and attrs["starttrace.run.facts_version"] == FACTS_VERSION
    assert all(attrs[f"starttrace.run.phase.{p}_s"] == v for p, v in facts["phases"].items())
    assert attrs["starttrace.run.kind.compile_cache"] == "cold"
    as_strings = {k: v if isinstance(v, str) else ("true" if v is True else "false" if v is False else repr(v))
                  for k, v in attrs.items()}  # fmt: skip
    for got in (facts_from_attributes(attrs), facts_from_attributes(as_strings)):
        assert got == facts


def test_spans_answer_the_fleet_without_deriving(ch: Client) -> None:
    shipped = _fill(ch)
    facts = ClickHouseFacts(ch)
    rows = facts.rows(facts_version=FACTS_VERSION)
    assert {r["run_id"] for r in rows} == set(shipped)
    for row in rows:
        _same(row, shipped[row["run_id"]])  # the latest export (at exit) wins over the one at ready
    first = fleet_of(facts, "service.version")
    assert first["runs"] == WITH_SPAN and first["pending"] == WITHOUT
    _shows_progress(first)
    assert first["groups"] == fleet_answer(shipped.values(), "service.version")["groups"]
    # only the runs without a span are derived
    assert set(facts.missing(idle_s=0, facts_version=FACTS_VERSION)) == {f"edge-{i}" for i in range(WITH_SPAN, 9)}
    runs = ClickHouseRuns(ch)
    pre = Prefetching(runs.load_runs)
    derive_all(facts, direct_loader(pre.load_run, pre))
    done = fleet_of(facts, "service.version")
    assert done["runs"] == WITH_SPAN + WITHOUT and done["pending"] == 0
    assert fleet_of(facts, "service.version", service="nope") == dict(fleet_answer([], "service.version"), pending=0)
    # the facts span is not a span of the run: its waterfall, listing and version ignore it
    srun = make_run(ranks=2, imports_per_rank=4, run_id="edge-0", seed=90, t0=T0)
    run = runs.load_run("edge-0")
    assert run is not None and run.span_count() == srun.span_count
    assert "starttrace.run" not in set(run.spans.get_column("name").to_list())
    listed = {r["run_id"]: r for r in runs.list_runs()}
    assert listed["edge-0"]["spans"] == srun.span_count
    assert listed["edge-0"]["end_ns"] < T0 + 10**11  # not the export's end


def _shows_progress(answer: dict[str, Any]) -> None:
    """The page and the terminal say what is pending (the page reloads until it is complete)."""
    from rich.console import Console

    from starttrace.views.html import environment, render_page
    from starttrace.views.terminal_fleet import render_fleet

    page = render_page(environment(), "fleet.html", fleet=answer, since=None, until=None, service=None, source="x")
    assert 'id="fleet-pending"' in page and f'<progress value="{WITH_SPAN}" max="{WITH_SPAN + WITHOUT}">' in page
    assert 'http-equiv="refresh"' in page
    console = Console(record=True, width=200)
    render_fleet(dict(answer, source="x"), console)
    assert f"{WITHOUT} more run(s) in range pending" in console.export_text()
    done = render_page(
        environment(), "fleet.html", fleet=dict(answer, pending=0), since=None, until=None, service=None, source="x"
    )
    assert 'id="fleet-pending"' not in done and "refresh" not in done


def test_exports_with_one_span_id_in_two_traces_stay_apart(ch: Client) -> None:
    """OTLP span ids are unique within a trace only: two runs' facts spans may share one."""
    from fleet_rows import synthetic_facts
    from otel_clickhouse import facts_span_row

    rows = synthetic_facts(4)
    insert(ch, [facts_span_row(f, 1) for f in rows])  # the same SpanId in every run's trace
    got = {f["run_id"]: f for f in ClickHouseFacts(ch).rows(facts_version=FACTS_VERSION)}
    assert set(got) == {f["run_id"] for f in rows}
    for f in rows:
        assert got[f["run_id"]]["time_to_ready_s"] == f["time_to_ready_s"]
        assert got[f["run_id"]]["identity"] == f["identity"]
