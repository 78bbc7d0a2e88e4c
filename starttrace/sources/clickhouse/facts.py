"""Per-run facts over ClickHouse, for the fleet answer (`service.fleet.fleet_of` feeds them to
`analysis.fleet.fleet_answer`, the one grouping implementation).

A run's facts come from its `starttrace.run` span in `otel_traces` (the run's exporter computed
them; run/facts_attrs.py; the latest export of a run wins), else from the facts table beside the
traces table (`starttrace_runs` for `otel_traces`, `starttrace_runs_<table>` for another: facts are
kept per traces table), which the service or `starttrace fleet` fills by deriving the runs that
have no such span. Only facts of the current definition (`FACTS_VERSION`) count; every other run
in range is `pending`, so that runs + pending = all runs in range.

The facts table is a ReplacingMergeTree keyed by run id, versioned by when the facts were derived;
reads take the newest row (`FINAL`). Its `Facts` column holds the whole facts as JSON (fields other
code adds travel); the typed columns beside it are what the Grafana dashboard reads.
"""

from __future__ import annotations

import json
import threading
import time
from string import Template
from typing import Any

from starttrace.run.facts_attrs import PREFIX, SEQ_KEY, SPAN_NAME, VERSION_KEY, facts_from_attributes
from starttrace.sources.clickhouse.client import Client, ident
from starttrace.sources.clickhouse.ddl import DEFAULT_TABLE
from starttrace.sources.clickhouse.runs import END_SQL, RUN_SQL, STARTUP_SQL

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
    Spans UInt64,
    Facts String DEFAULT ''
) ENGINE = ReplacingMergeTree(DerivedAt)
ORDER BY RunId"""

# a table made before the Facts column (its rows read from the typed columns)
FACTS_COLUMN_DDL = "ALTER TABLE $facts ADD COLUMN IF NOT EXISTS Facts String DEFAULT ''"

# the `starttrace.run` spans of this facts definition (every export; the latest per run is picked in
# Python: a GROUP BY with argMax over the attribute maps cost ~10x more than reading them)
_FACTS_SPANS = f"""
    FROM $traces
    WHERE SpanName = '{SPAN_NAME}' AND toUInt32OrZero(SpanAttributes['{VERSION_KEY}']) = {{facts_version:UInt32}}
"""
SPAN_KEYS_SQL = f"""
SELECT {RUN_SQL} AS run_id, SpanId AS span_id, toUInt32OrZero(SpanAttributes['{SEQ_KEY}']) AS seq, {END_SQL} AS end_ns
{_FACTS_SPANS} AND run_id != '' $range_filter
"""
# the facts attributes (less their prefix) of the exports not parsed yet (all of them, on a first answer)
SPAN_ATTRS_SQL = f"""
SELECT {RUN_SQL} AS run_id, SpanId AS span_id,
       toJSONString(mapApply((k, v) -> (substring(k, {len(PREFIX) + 1}), v),
                             mapFilter((k, v) -> startsWith(k, '{PREFIX}'), SpanAttributes))) AS attrs
{_FACTS_SPANS} AND {RUN_SQL} != '' $range_filter $span_filter
"""
_SPAN_FACT_IDS = f"SELECT DISTINCT {RUN_SQL} {_FACTS_SPANS}"
_SPAN_FACT_TRACES = f"SELECT DISTINCT TraceId {_FACTS_SPANS}"

TABLE_FACTS_SQL = """
SELECT * FROM $facts FINAL
WHERE FactsVersion = {facts_version:UInt32} $table_filter
"""

# runs in range that have no facts of this definition yet (neither a span nor a derived row). The
# runs are found by their root `startup` spans (every starttrace run has one; a scan of those rows
# alone, not of every span's resource map)
PENDING_SQL = f"""
SELECT count() AS pending FROM (
    SELECT {RUN_SQL} AS run_id, toUnixTimestamp64Nano(min(Timestamp)) AS start_ns,
           anyIf(ServiceName, ServiceName != '') AS service
    FROM $traces WHERE SpanName = 'startup' AND run_id != ''
    GROUP BY run_id
)
WHERE start_ns >= {{since:Int64}} AND start_ns <= {{until:Int64}} $service_filter
  AND run_id NOT IN ({_SPAN_FACT_IDS})
  AND run_id NOT IN (SELECT RunId FROM $facts FINAL WHERE FactsVersion = {{facts_version:UInt32}})
"""

# runs whose facts are missing or stale: no span of this definition, and no row yet, fewer span rows
# than now (the Collector wrote more), or an older facts definition; and quiet for `idle_s`. The
# traces that carry a facts span are left out before any resource map is read.
MISSING_SQL = f"""
SELECT t.run_id AS run_id, t.rows AS rows
FROM (
    SELECT {RUN_SQL} AS run_id, count() AS rows, max({END_SQL}) AS last_ns
    FROM $traces
    WHERE TraceId NOT IN ({_SPAN_FACT_TRACES}) AND run_id != '' AND {STARTUP_SQL}
    GROUP BY run_id
) AS t
LEFT JOIN (SELECT RunId, SpanRows, FactsVersion FROM $facts FINAL) AS f ON f.RunId = t.run_id
WHERE (f.RunId = '' OR f.SpanRows != t.rows OR f.FactsVersion < {{facts_version:UInt32}})
  AND t.last_ns <= {{quiet_before:Int64}}
  AND t.run_id NOT IN ({_SPAN_FACT_IDS})
ORDER BY t.last_ns DESC
LIMIT {{limit:UInt32}}
"""

FACTS_SQL = "SELECT * FROM $facts FINAL WHERE RunId = {run:String}"

_MAX_NS = 2**63 - 1
MAX_PARSED = 200_000  # facts spans kept parsed in memory (a few KB each)
_UNTIL = _MAX_NS // 10 * 9  # DateTime64(9) ends in 2262


def _range_params(since_ns: int | None, until_ns: int | None, facts_version: int) -> dict[str, Any]:
    """The query parameters of a time range (open ends: all of time) and a facts version."""
    return {
        "facts_version": facts_version,
        "since": since_ns if since_ns is not None else 0,
        "until": until_ns if until_ns is not None else _UNTIL,
    }


class ClickHouseFacts:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.facts = f"{ident(client.url.database)}.{ident(facts_table(client.url.table))}"
        self.traces = client.url.traces
        self._ready = False
        self._parsed: dict[tuple[str, str], dict[str, Any]] = {}  # (run id, facts span id) -> facts
        self._lock = threading.Lock()  # the table is created once (a request and the deriver may race)

    def _sql(self, template: str, **parts: str) -> str:
        return Template(template).substitute(facts=self.facts, traces=self.traces, **parts)

    def ensure_table(self) -> None:
        """The facts table (the one thing starttrace creates in a ClickHouse it reads)."""
        if self._ready:
            return
        with self._lock:
            if not self._ready:
                self.client.command(self._sql(FACTS_DDL))
                self.client.command(self._sql(FACTS_COLUMN_DDL))
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
                "Facts": json.dumps(f, separators=(",", ":"), sort_keys=True),
            }
            for f in facts
        )
        lines = "\n".join(json.dumps(row, separators=(",", ":")) for row in rows)
        self.client.command(f"INSERT INTO {self.facts} FORMAT JSONEachRow\n{lines}")

    def missing(
        self, limit: int = 1000, idle_s: float = 5.0, facts_version: int = 0, now_ns: int | None = None
    ) -> list[str]:
        """Run ids whose facts are missing or stale (no `starttrace.run` span of `facts_version`, and
        no row, fewer span rows than now, or a row of an older definition), newest first, quiet for `idle_s`."""
        self.ensure_table()
        now = time.time_ns() if now_ns is None else now_ns
        params = {"facts_version": facts_version, "quiet_before": now - int(idle_s * 1e9), "limit": limit}
        return [str(r["run_id"]) for r in self.client.arrow(self._sql(MISSING_SQL), params).to_pylist()]

    def get(self, run_id: str) -> dict[str, Any] | None:
        self.ensure_table()
        rows = self.client.arrow(self._sql(FACTS_SQL), {"run": run_id}).to_pylist()
        return rows[0] if rows else None

    def rows(
        self,
        since_ns: int | None = None,
        until_ns: int | None = None,
        service: str | None = None,
        facts_version: int = 0,
    ) -> list[dict[str, Any]]:
        """The facts of every run in range that has facts of `facts_version`: from its latest
        `starttrace.run` span, else from the facts table."""
        self.ensure_table()
        params = _range_params(since_ns, until_ns, facts_version)
        span_filter = " AND Timestamp >= fromUnixTimestamp64Nano({since:Int64})"
        span_filter += " AND Timestamp <= fromUnixTimestamp64Nano({until:Int64})"
        table_filter = " AND Start >= fromUnixTimestamp64Nano({since:Int64})"
        table_filter += " AND Start <= fromUnixTimestamp64Nano({until:Int64})"
        if service is not None:
            span_filter += " AND SpanAttributes['starttrace.run.service'] = {service:String}"
            table_filter += " AND ServiceName = {service:String}"
            params["service"] = service
        keys = self.client.arrow(self._sql(SPAN_KEYS_SQL, range_filter=span_filter), params)
        latest: dict[str, tuple[int, int, str]] = {}  # run id -> (seq, end, span): the export at exit wins
        columns = (keys.column(c).to_pylist() for c in ("run_id", "seq", "end_ns", "span_id"))
        for rid, seq, end, sid in zip(*columns, strict=True):
            if rid not in latest or (seq, end) > latest[rid][:2]:
                latest[rid] = (seq, end, sid)
        # each export is parsed once per process (a fleet answer reads every run's facts)
        todo = [sid for rid, (_, _, sid) in latest.items() if (rid, sid) not in self._parsed]
        if todo:
            only = ""
            if len(todo) * 2 < len(latest):
                only = "AND SpanId IN {spans:Array(String)}"
                params["spans"] = todo
            got = self.client.arrow(self._sql(SPAN_ATTRS_SQL, range_filter=span_filter, span_filter=only), params)
            # span ids are unique within a trace only: an export is its run id and span id
            names = zip(got.column("run_id").to_pylist(), got.column("span_id").to_pylist(), strict=True)
            texts = dict(zip(names, got.column("attrs").to_pylist(), strict=True))
            if len(self._parsed) + len(todo) > MAX_PARSED:
                self._parsed.clear()
            for rid, (_, _, sid) in latest.items():
                text = texts.get((rid, sid))
                if text is not None and (rid, sid) not in self._parsed:
                    self._parsed[(rid, sid)] = facts_from_attributes(json.loads(text), prefixed=False)
        out = [dict(self._parsed[(rid, sid)]) for rid, (_, _, sid) in latest.items() if (rid, sid) in self._parsed]
        table = self.client.arrow(self._sql(TABLE_FACTS_SQL, table_filter=table_filter), params)
        if table.num_rows:
            shipped = set(latest) | self._span_fact_ids(facts_version)  # a shipped span wins over a derived row
            out.extend(_row_facts(row) for row in table.to_pylist() if row["RunId"] not in shipped)
        return out

    def _span_fact_ids(self, facts_version: int) -> set[str]:
        got = self.client.arrow(self._sql(_SPAN_FACT_IDS), {"facts_version": facts_version})
        return {str(v) for v in got.column(0).to_pylist()}

    def pending(
        self,
        since_ns: int | None = None,
        until_ns: int | None = None,
        service: str | None = None,
        facts_version: int = 0,
    ) -> int:
        """How many runs in range have no facts of `facts_version` yet (being derived)."""
        self.ensure_table()
        params = _range_params(since_ns, until_ns, facts_version)
        service_filter = ""
        if service is not None:
            service_filter = "AND service = {service:String}"
            params["service"] = service
        got = self.client.arrow(self._sql(PENDING_SQL, service_filter=service_filter), params)
        return int(got.column(0)[0].as_py()) if got.num_rows else 0


def _row_facts(row: dict[str, Any]) -> dict[str, Any]:
    """A facts-table row as `run_facts` gave it (its JSON; a row written before it, its columns)."""
    if row.get("Facts"):
        return dict(json.loads(row["Facts"]))

    def as_dict(pairs: Any) -> dict[str, Any]:
        return dict(pairs.items() if isinstance(pairs, dict) else pairs or [])

    return {
        "run_id": row["RunId"],
        "trace_id": row["TraceId"],
        "service": row["ServiceName"],
        "start_ns": _ns(row["Start"]),
        "status": row["Status"],
        "time_to_ready_s": row["TimeToReadyS"],
        "startup_s": row["StartupS"],
        "phases": as_dict(row["Phases"]),
        "role_phases": as_dict(row["RolePhases"]),
        "findings": as_dict(row["Findings"]),
        "identity": as_dict(row["Identity"]),
        "processes": row["Processes"],
        "spans": row["Spans"],
        "version": row["SpanRows"],
        "facts_version": row["FactsVersion"],
    }


def _ns(value: Any) -> int:
    if isinstance(value, int):
        return value
    import datetime as dt

    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp()) * 10**9 + value.microsecond * 1000
    return int(value)


def _ts(ns: int) -> str:
    return f"{ns // 10**9}.{ns % 10**9:09d}"


__all__ = ["FACTS_TABLE", "ClickHouseFacts", "facts_table"]
