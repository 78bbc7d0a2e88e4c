"""dashboards/*.json: structure, data sources, template variables, the panels issue 5 asks for."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from deploy_helpers import STARTTRACE_METRICS, dashboard_files, iter_panels, provisioned_datasources

EXPECTED_UIDS = {"starttrace-startup", "starttrace-imports", "starttrace-fleet"}
# the dashboards on Prometheus (the fleet dashboard reads ClickHouse: tests/deploy/test_deploy_fleet_dashboard.py)
PROMETHEUS_UIDS = {"starttrace-startup", "starttrace-imports"}
# Grafana's own variables (${__value.raw}, $__rate_interval, ${__url_time_range}, ...)
BUILTIN = re.compile(r"^__\w*$")
VAR_REF = re.compile(r"\$\{(\w+)(?:[.:][^}]*)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]")

DASHBOARDS = dashboard_files()
PROM_DASHBOARDS = [p for p in DASHBOARDS if json.loads(p.read_text(encoding="utf-8"))["uid"] in PROMETHEUS_UIDS]


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def strings(node: Any, skip_keys: frozenset[str] = frozenset()) -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k not in skip_keys:
                out += strings(v, skip_keys)
    elif isinstance(node, list):
        for v in node:
            out += strings(v, skip_keys)
    elif isinstance(node, str):
        out.append(node)
    return out


def var_refs(text: str) -> set[str]:
    return {a or b or c for a, b, c in VAR_REF.findall(text)}


def datasource_refs(node: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(node, dict):
        ds = node.get("datasource")
        if isinstance(ds, dict):
            out.append(ds)
        elif isinstance(ds, str):
            out.append({"uid": ds})
        for v in node.values():
            out += datasource_refs(v)
    elif isinstance(node, list):
        for v in node:
            out += datasource_refs(v)
    return out


def prom_exprs(dash: dict[str, Any]) -> list[str]:
    return [
        t["expr"]
        for p in iter_panels(dash["panels"])
        for t in p.get("targets") or []
        if (t.get("datasource") or p.get("datasource") or {}).get("type") == "prometheus"
    ]


def test_the_three_dashboards_exist() -> None:
    assert {load(p)["uid"] for p in DASHBOARDS} == EXPECTED_UIDS


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_structure(path: Path) -> None:
    dash = load(path)
    assert dash["uid"] in EXPECTED_UIDS and dash["title"]
    assert "id" not in dash or dash["id"] is None, "provisioned dashboards carry no database id"
    assert isinstance(dash.get("schemaVersion"), int)
    ids = [p["id"] for p in iter_panels(dash["panels"])]
    assert all(isinstance(i, int) for i in ids)
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    for p in iter_panels(dash["panels"]):
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]), p["title"]
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
        assert p.get("type"), p["title"]
        for t in p.get("targets") or []:
            assert t.get("refId"), p["title"]
        refs = [t["refId"] for t in p.get("targets") or []]
        assert len(refs) == len(set(refs)), p["title"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_datasource_is_provisioned(path: Path) -> None:
    provisioned = provisioned_datasources()
    refs = datasource_refs(load(path))
    assert refs
    for ds in refs:
        if ds.get("uid") in ("-- Grafana --", "grafana"):
            continue
        assert ds.get("uid") in provisioned, f"data source uid {ds.get('uid')!r} is not provisioned"
        if "type" in ds:
            assert ds["type"] == provisioned[ds["uid"]]["type"], ds


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_variable_used_is_defined_and_every_defined_one_used(path: Path) -> None:
    dash = load(path)
    variables = dash["templating"]["list"]
    defined = [v["name"] for v in variables]
    assert len(defined) == len(set(defined))
    used: set[str] = set()
    for text in strings(dash):
        used |= var_refs(text)
    used = {u for u in used if not BUILTIN.match(u)}
    assert used <= set(defined), f"variables used but not defined: {sorted(used - set(defined))}"
    # each variable is referenced somewhere other than its own definition
    for v in variables:
        elsewhere = [s for other in variables if other is not v for s in strings(other)]
        elsewhere += strings(dash["panels"]) + strings(dash.get("links") or [])
        assert any(v["name"] in var_refs(s) for s in elsewhere), f"variable {v['name']} is never used"


@pytest.mark.parametrize("path", PROM_DASHBOARDS, ids=lambda p: p.name)
def test_template_variables(path: Path) -> None:
    dash = load(path)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    for name in ("service", "rank"):
        v = variables[name]
        assert v["type"] == "query"
        assert v["datasource"]["uid"] == "starttrace-prometheus"
        query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        assert query.startswith("label_values(") and query == v["definition"]
        assert query.rstrip(")").endswith({"service": "service", "rank": "rank"}[name])
        assert "run_id" not in query
    # no metric names a run (issue 27): the run is a free textbox for the links (empty: the newest)
    assert variables["run"]["type"] == "textbox"
    assert not any("run_id" in e for e in prom_exprs(dash))
    assert variables["rank"]["multi"] and variables["rank"]["includeAll"] and variables["rank"]["allValue"] == ".*"
    if dash["uid"] == "starttrace-startup":
        assert variables["traceId"]["type"] == "textbox"


@pytest.mark.parametrize("path", PROM_DASHBOARDS, ids=lambda p: p.name)
def test_prometheus_expressions_use_the_service_metrics(path: Path) -> None:
    exprs = prom_exprs(load(path))
    assert exprs
    for expr in exprs:
        names = set(re.findall(r"\bstarttrace_\w+", expr))
        assert names, expr
        assert names <= STARTTRACE_METRICS, f"unknown metric in {expr}: {names - STARTTRACE_METRICS}"


def panels_by_type(dash: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [p for p in iter_panels(dash["panels"]) if p["type"] == kind]


def test_startup_dashboard_panels() -> None:
    dash = load(next(p for p in DASHBOARDS if load(p)["uid"] == "starttrace-startup"))
    assert dash["title"] == "vLLM startup"
    # runs table from Tempo TraceQL
    runs = [
        t for p in panels_by_type(dash, "table") for t in p["targets"] if t["datasource"]["uid"] == "starttrace-tempo"
    ]
    assert runs and runs[0]["queryType"] == "traceql" and runs[0]["tableType"] == "traces"
    assert runs[0]["query"] == '{ span:name = "startup" }'
    # per-phase x per-rank bar chart from Prometheus
    bars = [
        p for p in panels_by_type(dash, "barchart") if "starttrace_phase_duration_seconds" in p["targets"][0]["expr"]
    ]
    assert bars, "no phase bar chart"
    expr = bars[0]["targets"][0]["expr"]
    assert re.search(r"by \((?=[^)]*phase)(?=[^)]*rank)[^)]*\)", expr), expr
    assert any(t["id"] == "groupingToMatrix" for t in bars[0]["transformations"])
    # time to ready per rank
    assert any("starttrace_time_to_ready_seconds" in e and "rank" in e for e in prom_exprs(dash))
    # the selected trace
    traces = [p for p in panels_by_type(dash, "traces") if p["datasource"]["uid"] == "starttrace-tempo"]
    assert traces and traces[0]["targets"][0] == {
        "datasource": {"type": "tempo", "uid": "starttrace-tempo"},
        "refId": "A",
        "queryType": "traceql",
        "query": "${traceId}",
    }
    # data links to the starttrace page of a run
    links = [s for s in strings(dash) if "/startup/" in s and s.startswith("${starttrace_url}")]
    assert any(s == "${starttrace_url}/startup/${run}" for s in links)
    # the newest run of a service (the metrics name no run)
    assert "${starttrace_url}/startup" in [s for s in strings(dash) if s.startswith("${starttrace_url}")]


def test_imports_dashboard_panels() -> None:
    dash = load(next(p for p in DASHBOARDS if load(p)["uid"] == "starttrace-imports"))
    assert dash["title"] == "Imports"
    exprs = prom_exprs(dash)
    assert any(e.startswith("sort_desc(topk(") and "starttrace_import_duration_seconds" in e for e in exprs)
    assert any(e.startswith("sort_desc(topk(") and "starttrace_import_ranks_paid" in e for e in exprs)
    assert any("starttrace_import_ranks_paid" in e and ">= 2" in e for e in exprs)
