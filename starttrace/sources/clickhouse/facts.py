"""Per-run facts in ClickHouse (`starttrace_runs`, beside `otel_traces`) and the fleet query over them.

A ReplacingMergeTree keyed by run id, versioned by when the facts were derived; reads take the newest
row (`FINAL`). Quantiles, per-phase groups and the slowest runs are computed in SQL, so only groups and
a few rows come back to Python (`service.fleet.fleet_of` shapes them with `analysis.fleet.answer`).
"""

from __future__ import annotations

import json
import threading
import time
from string import Template
from typing import Any

from starttrace.sources.clickhouse.client import Client, ident
from starttrace.sources.clickhouse.ddl import DEFAULT_TABLE
from starttrace.sources.clickhouse.runs import END_SQL, LANE_SQL, RUN_SQL

FACTS_TABLE = "starttrace_runs"  # beside the default traces table (otel_traces); others: facts_table()


def facts_table(traces_table: str) -> str:
    """The facts table of one traces table, in its database: facts are kept per traces table, so two
    traces tables of one database never count each other's runs."""
    return FACTS_TABLE if traces_table == DEFAULT_TABLE else f"{FACTS_TABLE}_{traces_table}"


FACTS_DDL = """CREATE TABLE IF NOT EXISTS $facts (
    RunId String,
    TraceId String,
    ServiceName LowCardinality(String),
    Start DateTime64(9),
    DerivedAt DateTime64(6),
    FactsVersion UInt32,
    SpanRows UInt64,
    Status LowCardinality(String),
    TimeToReadyS Nullable(Float64),
    StartupS Float64,
    Phases Map(LowCardinality(String), Float64),
    RolePhases Map(LowCardinality(String), Float64),
    Findings Map(LowCardinality(String), Float64),
    Identity Map(LowCardinality(String), String),
    Processes UInt32,
    Spans UInt64
) ENGINE = ReplacingMergeTree(DerivedAt)
ORDER BY RunId"""

# runs whose facts are missing or stale: none yet, fewer span rows than now (the Collector wrote
# more), or an older facts definition; and quiet for `idle_s` (no span ended since)
MISSING_SQL = f"""
SELECT t.run_id AS run_id, t.rows AS rows
FROM (
    SELECT {RUN_SQL} AS run_id, count() AS rows,
           max({END_SQL}) AS last_ns
    FROM $traces WHERE run_id != '' GROUP BY run_id
) AS t
LEFT JOIN (SELECT RunId, SpanRows, FactsVersion FROM $facts FINAL) AS f ON f.RunId = t.run_id
WHERE (f.RunId = '' OR f.SpanRows != t.rows OR f.FactsVersion < {{facts_version:UInt32}})
  AND t.last_ns <= {{quiet_before:Int64}}
ORDER BY t.last_ns DESC
LIMIT {{limit:UInt32}}
"""

_FILTER = """
WHERE 1 $service_filter
  AND Start >= fromUnixTimestamp64Nano({since:Int64}) AND Start <= fromUnixTimestamp64Nano({until:Int64})
"""

GROUPS_SQL = f"""
SELECT Identity[{{by:String}}] AS value, count() AS runs, toUnixTimestamp64Nano(min(Start)) AS first_ns,
       quantilesIf(0.5, 0.95)(TimeToReadyS, TimeToReadyS IS NOT NULL) AS ttr
FROM $facts FINAL {_FILTER}
GROUP BY value
"""

PHASES_SQL = f"""
SELECT Identity[{{by:String}}] AS value, phase, quantiles(0.5, 0.95)(secs) AS q
FROM $facts FINAL
ARRAY JOIN mapKeys(Phases) AS phase, mapValues(Phases) AS secs
{_FILTER}
GROUP BY value, phase
"""

SLOWEST_SQL = f"""
SELECT RunId AS run_id, ServiceName AS service, Identity[{{by:String}}] AS value,
       TimeToReadyS AS time_to_ready_s, toUnixTimestamp64Nano(Start) AS start_ns
FROM $facts FINAL {_FILTER} AND TimeToReadyS IS NOT NULL
ORDER BY TimeToReadyS DESC, RunId
LIMIT {{limit:UInt32}}
"""

FACTS_SQL = "SELECT * FROM $facts FINAL WHERE RunId = {run:String}"

_MAX_NS = 2**63 - 1


class ClickHouseFacts:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.facts = f"{ident(client.url.database)}.{ident(facts_table(client.url.table))}"
        self.traces = client.url.traces
        self._ready = False
        self._lock = threading.Lock()  # the table is created once (a request and the deriver may race)

    def _sql(self, template: str, **parts: str) -> str:
        return Template(template).substitute(facts=self.facts, traces=self.traces, **parts)

    def ensure_table(self) -> None:
        if self._ready:
            return
        with self._lock:
            if not self._ready:
                self.client.command(self._sql(FACTS_DDL))
                self._ready = True

    def write(self, facts: list[dict[str, Any]]) -> None:
        """Insert facts rows (`analysis.fleet.run_facts`); a run written again replaces its row."""
        if not facts:
            return
        self.ensure_table()
        now = time.time()
        rows = (
            {
                "RunId": f["run_id"],
                "TraceId": f["trace_id"],
                "ServiceName": f["service"],
                "Start": _ts(int(f["start_ns"])),
                "DerivedAt": f"{now:.6f}",
                "FactsVersion": f["facts_version"],
                "SpanRows": int(f["version"]),
                "Status": f["status"],
                "TimeToReadyS": f["time_to_ready_s"],
                "StartupS": f["startup_s"],
                "Phases": f["phases"],
                "RolePhases": f["role_phases"],
                "Findings": f["findings"],
                "Identity": f["identity"],
                "Processes": f["processes"],
                "Spans": f["spans"],
            }
            for f in facts
        )
        lines = "\n".join(json.dumps(row, separators=(",", ":")) for row in rows)
        self.client.command(f"INSERT INTO {self.facts} FORMAT JSONEachRow\n{lines}")

    def missing(
        self, limit: int = 1000, idle_s: float = 5.0, facts_version: int = 0, now_ns: int | None = None
    ) -> list[str]:
        """Run ids whose facts are missing or stale (fewer span rows than now, or derived by a facts
        definition older than `facts_version`), newest first, quiet for `idle_s`."""
        self.ensure_table()
        now = time.time_ns() if now_ns is None else now_ns
        params = {"facts_version": facts_version, "quiet_before": now - int(idle_s * 1e9), "limit": limit}
        return [str(r["run_id"]) for r in self.client.arrow(self._sql(MISSING_SQL), params).to_pylist()]

    def get(self, run_id: str) -> dict[str, Any] | None:
        self.ensure_table()
        rows = self.client.arrow(self._sql(FACTS_SQL), {"run": run_id}).to_pylist()
        return rows[0] if rows else None

    def groups(
        self,
        key: str,
        since_ns: int | None = None,
        until_ns: int | None = None,
        service: str | None = None,
        slowest: int = 10,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        """(groups, slowest runs, runs) per value of identity key `key`, quantiles computed in SQL."""
        self.ensure_table()
        params: dict[str, Any] = {
            "by": key,
            "since": since_ns if since_ns is not None else 0,
            "until": until_ns if until_ns is not None else _MAX_NS // 10 * 9,  # DateTime64(9) ends in 2262
            "limit": slowest,
        }
        service_filter = ""
        if service is not None:
            service_filter = "AND ServiceName = {service:String}"
            params["service"] = service
        parts = {"service_filter": service_filter}
        groups: dict[str, dict[str, Any]] = {}
        runs = 0
        for row in self.client.arrow(self._sql(GROUPS_SQL, **parts), params).to_pylist():
            runs += int(row["runs"])
            groups[row["value"]] = {
                "value": row["value"],
                "runs": int(row["runs"]),
                "first_ns": int(row["first_ns"]),
                "time_to_ready_s": _quantiles(row["ttr"] if row["runs"] else None),
                "phases": {},
            }
        for row in self.client.arrow(self._sql(PHASES_SQL, **parts), params).to_pylist():
            group = groups.get(row["value"])
            if group is not None:
                group["phases"][row["phase"]] = _quantiles(row["q"])
        for group in groups.values():
            group["phases"] = dict(sorted(group["phases"].items()))
        top = self.client.arrow(self._sql(SLOWEST_SQL, **parts), params).to_pylist()
        for row in top:
            row["time_to_ready_s"] = round(float(row["time_to_ready_s"]), 6)
            row["start_ns"] = int(row["start_ns"])
        return list(groups.values()), top, runs


def _quantiles(values: list[float] | None) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None}
    # a group whose runs never became ready has NaN quantiles: reported as null
    names = ("p50", "p95")
    return {n: None if v is None or v != v else round(float(v), 6) for n, v in zip(names, values, strict=False)}


def _ts(ns: int) -> str:
    return f"{ns // 10**9}.{ns % 10**9:09d}"


__all__ = ["FACTS_TABLE", "LANE_SQL", "ClickHouseFacts"]
