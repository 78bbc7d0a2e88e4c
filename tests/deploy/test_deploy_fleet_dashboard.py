"""dashboards/fleet-startup.json ("Fleet startup", on Grafana's ClickHouse data source): every
panel's SQL and the variable's query run for real on ClickHouse's engine (chdb) against
starttrace_runs as starttrace writes it, with Grafana's macros and variables expanded as the
grafana-clickhouse-datasource plugin expands them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from deploy_helpers import DASHBOARDS_DIR, iter_panels, provisioned_datasources

pytest.importorskip("chdb")

from fleet_rows import synthetic_facts

ALL, DERIVED = 126, 120  # runs; of them, runs whose facts were derived into starttrace_runs
DASH = json.loads((DASHBOARDS_DIR / "fleet-startup.json").read_text(encoding="utf-8"))


def sql_targets() -> list[tuple[str, str, int]]:
    return [(p["title"], t["rawSql"], t["format"]) for p in iter_panels(DASH["panels"]) for t in p["targets"]]


ALL_KINDS = "'cold','warm','unknown'"  # the start-kind variable's All: every value its query lists


def expand(sql: str, by: str, compile_cache: str = ALL_KINDS) -> str:
    """Grafana's and the plugin's expansion: $__timeFilter, $__timeInterval, ${var[:format]}."""
    sql = re.sub(r"\$__timeFilter\((\w+)\)", r"\1 >= toDateTime(0) AND \1 <= toDateTime(4102444800)", sql)
    sql = re.sub(r"\$__timeInterval\((\w+)\)", r"toStartOfInterval(toDateTime(\1), INTERVAL 3600 second)", sql)
    sql = sql.replace("${service:singlequote}", "'vllm','sglang'").replace("${by}", by)
    sql = sql.replace("${compile_cache:singlequote}", compile_cache)
    assert "$" not in sql, sql
    return sql


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from otel_clickhouse import create_tables, facts_span_row, insert

    from starttrace.sources.clickhouse.client import close_all, connect
    from starttrace.sources.clickhouse.facts import ClickHouseFacts

    client = connect(f"chdb:{tmp_path_factory.mktemp('dash') / 'data'}", create=True)
    create_tables(client)  # the facts table lives beside otel_traces, in its database
    store = ClickHouseFacts(client)
    rows = synthetic_facts(ALL)
    rows[4]["findings"] = {"cold_compile": 12.0}
    for i, row in enumerate(rows[:60]):  # start kinds on 60 of them; the rest predate start kinds
        row["identity"]["kind.compile_cache"] = "cold" if i % 3 == 0 else "warm"
    store.write(rows[:DERIVED])
    # the others' facts travel with the run: their starttrace.run spans in otel_traces, read straight
    # from there (the export at exit supersedes the one at ready)
    insert(client, [facts_span_row(dict(f, time_to_ready_s=999.0), 0) for f in rows[DERIVED:]])
    insert(client, [facts_span_row(f, 1) for f in rows[DERIVED:]])
    yield client
    close_all()


def test_dashboard_reads_the_provisioned_clickhouse_source() -> None:
    ds = provisioned_datasources()["starttrace-clickhouse"]
    assert ds["type"] == "grafana-clickhouse-datasource"
    for p in iter_panels(DASH["panels"]):
        for t in p["targets"]:
            assert t["datasource"] == {"type": ds["type"], "uid": ds["uid"]}, p["title"]
            assert t["editorType"] == "sql" and t["format"] in (0, 1), p["title"]
            assert "otel.starttrace_runs FINAL" in t["rawSql"], "the newest facts row of each run only"
            assert "SpanName = 'starttrace.run'" in t["rawSql"], "the facts spans, straight from otel_traces"


BY = next(v for v in DASH["templating"]["list"] if v["name"] == "by")["query"].split(",")


@pytest.mark.parametrize("by", BY)
@pytest.mark.parametrize(("title", "sql", "fmt"), sql_targets(), ids=[t for t, _, _ in sql_targets()])
def test_panel_sql_runs_on_clickhouse(facts: Any, title: str, sql: str, fmt: int, by: str) -> None:
    table = facts.arrow(expand(sql, by))
    assert table.num_rows > 0, title
    if fmt == 0:  # a time series: a time column first
        assert table.column_names[0] == "time", title


def test_group_panel_matches_the_fleet_answer(facts: Any) -> None:
    from starttrace.analysis.fleet import fleet_answer

    sql = next(s for t, s, _ in sql_targets() if t.startswith("Time to ready by"))
    rows = {r["value"]: r for r in facts.arrow(expand(sql, "service.version")).to_pylist()}
    ans = fleet_answer(synthetic_facts(ALL), "service.version")
    for g in ans["groups"]:
        assert rows[g["value"]]["runs"] == g["runs"]
        assert rows[g["value"]]["p50_s"] == pytest.approx(g["time_to_ready_s"]["p50"], abs=0.01)


def test_variable_query_runs(facts: Any) -> None:
    var = next(v for v in DASH["templating"]["list"] if v["name"] == "service")
    assert var["query"] == var["definition"]
    values = [r["ServiceName"] for r in facts.arrow(var["query"]).to_pylist()]
    assert values == ["sglang", "vllm"]


def test_start_kind_variable_filters_the_panels(facts: Any) -> None:
    var = next(v for v in DASH["templating"]["list"] if v["name"] == "compile_cache")
    assert var["query"] == var["definition"] and var["includeAll"] and var["multi"]
    values = [r["compile_cache"] for r in facts.arrow(var["query"]).to_pylist()]
    assert values == ["cold", "unknown", "warm"]
    runs = next(s for t, s, _ in sql_targets() if t == "Runs")
    assert facts.arrow(expand(runs, "service.version", "'cold'")).to_pylist()[0]["runs"] == 20
    assert facts.arrow(expand(runs, "service.version", "'unknown'")).to_pylist()[0]["runs"] == ALL - 60
    assert facts.arrow(expand(runs, "service.version")).to_pylist()[0]["runs"] == ALL
    mix = next(s for t, s, _ in sql_targets() if t.startswith("Start-kind mix"))
    shares = facts.arrow(expand(mix, "kind.compile_cache")).to_pylist()
    assert {(r["value"], r["compile_cache"]): r["share"] for r in shares} == {
        ("cold", "cold"): 1.0,
        ("warm", "warm"): 1.0,
        ("", "unknown"): 1.0,
    }
def test_runs_with_facts_spans_count_once_with_their_latest_export(facts: Any) -> None:
    def panel(prefix: str) -> list[dict[str, Any]]:
        sql = next(s for t, s, _ in sql_targets() if t.startswith(prefix))
        return facts.arrow(expand(sql, "service.version")).to_pylist()

    assert panel("Runs")[0]["runs"] == ALL  # derived rows and facts spans together, each run once
    slowest = panel("Slowest runs")
    assert slowest and all(r["time_to_ready_s"] < 999 for r in slowest)  # the export at ready was superseded
    # the spans' phase map (`starttrace.run.phase.model_load_s` -> `model_load`) reads like the table's
    assert sum(r["runs"] for r in panel("Nodes loading weights slowest")) == ALL
