"""Runs from ClickHouse's `otel_traces`, as the Collector's `clickhouse` exporter writes them.

A run is the spans whose resource carries its `starttrace.run_id`; a process is one
`service.instance.id` (else host + pid) of it. `load_run` builds the run type at full detail, its
span table from the query's Arrow answer column by column (no Python object per span); how each
column maps is in docs/fleet.md ("How `otel_traces` becomes a run"). Span attribute values, which
the exporter wrote as strings, are typed back in SQL; resource values in Python (`typed`).
"""

from __future__ import annotations

import contextlib
import json
import re
from string import Template
from typing import Any

import polars as pl

from starttrace.run import COLUMN_KEYS, SPAN_SCHEMA, Process, Run, Span, empty_spans, int_or_none, span_of
from starttrace.run.facts_attrs import SPAN_NAME as FACTS_SPAN
from starttrace.sources.clickhouse.client import Client

RUN_KEY = "starttrace.run_id"
# the process key: its instance id, else host and pid (a process exported without one)
LANE_SQL = (
    "if(ResourceAttributes['service.instance.id'] != '', ResourceAttributes['service.instance.id'],"
    " concat(ResourceAttributes['host.name'], ':', ResourceAttributes['process.pid']))"
)
RUN_SQL = f"ResourceAttributes['{RUN_KEY}']"
# the run's facts span (run/facts_attrs.py) is no startup span: kept out of every run query
STARTUP_SQL = f"SpanName != '{FACTS_SPAN}'"

# a value the exporter wrote with AsString(), typed back in SQL: ints, floats, bools and JSON
# arrays/maps as JSON, everything else as a JSON string (`$$`: the SQL templates are string.Template)
_TYPED_JSON = (
    "multiIf(match(v, '^-?(0|[1-9][0-9]{0,17})$$'), v,"
    " v IN ('true', 'false'), v,"
    " match(v, '^-?(0|[1-9][0-9]*)\\\\.[0-9]+([eE][-+]?[0-9]+)?$$'), v,"
    " (startsWith(v, '[') OR startsWith(v, '{')) AND isValidJSON(v), v,"
    " toJSONString(v))"
)
_SKIP_KEYS = (*COLUMN_KEYS, "thread.id", "starttrace.in_progress")
_REST = "mapFilter((k, v) -> k NOT IN (" + ", ".join(f"'{k}'" for k in _SKIP_KEYS) + "), SpanAttributes)"
_ATTRS_SQL = (
    f"if(empty({_REST}), NULL, concat('{{', arrayStringConcat(arrayMap((k, v) -> concat(toJSONString(k), ':',"
    f" {_TYPED_JSON}), mapKeys({_REST}), mapValues({_REST})), ','), '}}'))"
)


# A Duration no span can have (>= 2^62 ns, 146 years; the exporter writes 2^64-1 for a span that ends
# before it starts): toInt64 of it would give an end before the start. Such a span is read as an
# instant at its start and named in the run's problems.
ABSURD_DURATION_SQL = "Duration >= 4611686018427387904"
END_SQL = f"toUnixTimestamp64Nano(Timestamp) + toInt64(if({ABSURD_DURATION_SQL}, 0, Duration))"


def _opt(key: str) -> str:
    return f"if(mapContains(SpanAttributes, '{key}'), SpanAttributes['{key}'], NULL)"


_LAUNCHED_BY = (
    "coalesce(nullIf(SpanAttributes['starttrace.launched_by'], ''),"
    " nullIf(arrayFirst((s, a) -> a['starttrace.link'] = 'launched_by', Links.SpanId, Links.Attributes), ''))"
)

SPANS_SQL = f"""
SELECT run_id, lane, span_id, parent_id, name, start, end, in_progress, instant, error, thread, phase, module,
       self_us, launched_by, attrs, absurd
FROM (
    SELECT
        {RUN_SQL} AS run_id,
        {LANE_SQL} AS lane,
        SpanId AS span_id,
        nullIf(ParentSpanId, '') AS parent_id,
        toString(SpanName) AS name,
        toUnixTimestamp64Nano(Timestamp) AS start,
        {ABSURD_DURATION_SQL} AS absurd,
        start + toInt64(if(absurd, 0, Duration)) AS end,
        SpanAttributes['starttrace.in_progress'] = 'true' AS in_progress,
        (Duration = 0 OR absurd) AND NOT in_progress AS instant,
        multiIf(StatusCode IN ('Error', 'STATUS_CODE_ERROR'), if(StatusMessage != '', StatusMessage, 'error'),
                has(Events.Name, 'exception'), 'exception', NULL) AS error,
        toInt64OrNull(SpanAttributes['thread.id']) AS thread,
        nullIf(SpanAttributes['{COLUMN_KEYS[0]}'], '') AS phase,
        {_opt(COLUMN_KEYS[1])} AS module,
        toFloat64OrNull(SpanAttributes['{COLUMN_KEYS[2]}']) AS self_us,
        {_LAUNCHED_BY} AS launched_by,
        {_ATTRS_SQL} AS attrs
    FROM $traces
    WHERE $run_filter AND {STARTUP_SQL}
    ORDER BY run_id, lane, span_id, in_progress, end DESC
    LIMIT 1 BY run_id, lane, span_id
)
ORDER BY run_id, start, lane
"""

PROCESSES_SQL = f"""
SELECT {RUN_SQL} AS run_id, {LANE_SQL} AS lane, any(ResourceAttributes) AS resource,
       anyIf(ServiceName, ServiceName != '') AS service, any(TraceId) AS trace_id
FROM $traces
WHERE $run_filter AND {STARTUP_SQL}
GROUP BY run_id, lane
"""

TRACES_SQL = f"SELECT DISTINCT TraceId FROM $traces WHERE {RUN_SQL} = {{run:String}} LIMIT 16"

LIST_SQL = f"""
SELECT
    {RUN_SQL} AS run_id,
    any(TraceId) AS trace_id,
    anyIf(ServiceName, ServiceName != '') AS service,
    toUnixTimestamp64Nano(min(Timestamp)) AS start_ns,
    max({END_SQL}) AS end_ns,
    uniqExact({LANE_SQL}) AS processes,
    count() AS spans
FROM $traces
WHERE run_id != '' AND {STARTUP_SQL} $where
GROUP BY run_id
HAVING 1 $having
ORDER BY start_ns DESC, run_id
LIMIT {{limit:UInt32}}
"""

# one run: the bloom filter on TraceId finds its granules, the run id keeps other runs out
_ONE_RUN = f"{RUN_SQL} = {{run:String}} AND TraceId IN {{traces:Array(String)}}"
_RUNS = f"{RUN_SQL} IN {{runs:Array(String)}}"
VERSION_SQL = f"SELECT count() FROM $traces WHERE {_ONE_RUN} AND {STARTUP_SQL}"
MAX_KNOWN_RUNS = 100_000  # run ids whose trace ids are remembered

# resource values kept as strings even when they look like numbers
STRING_KEYS = frozenset(
    {
        "service.name",
        "service.version",
        "service.instance.id",
        "service.namespace",
        "host.name",
        "host.id",
        "starttrace.run_id",
        "starttrace.clock.domain",
        "vllm.model",
        "container.image.name",
        "container.image.tag",
    }
)
_INT = re.compile(r"^-?(0|[1-9][0-9]{0,17})$")
_FLOAT = re.compile(r"^-?(0|[1-9][0-9]*)\.[0-9]+([eE][-+]?[0-9]+)?$")


def typed(key: str, value: str) -> Any:
    """A resource value the exporter wrote as a string, typed back (ints, floats, bools, JSON)."""
    if key in STRING_KEYS:
        return value
    if _INT.match(value):
        return int(value)
    if value in ("true", "false"):
        return value == "true"
    if _FLOAT.match(value):
        return float(value)
    if value[:1] in ("[", "{"):
        with contextlib.suppress(ValueError):
            return json.loads(value)
    return value


def typed_resource(pairs: Any) -> dict[str, Any]:
    items = pairs.items() if isinstance(pairs, dict) else pairs
    return {str(k): typed(str(k), str(v)) for k, v in items}


class ClickHouseRuns:
    """Run listing and loading over one `otel_traces` table."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.traces = client.url.traces
        # run id -> its trace ids, found once by a scan of the run-id attribute; later queries of the
        # run go through the table's bloom filter on TraceId (the service asks a run's version on
        # every request)
        self._trace_ids: dict[str, list[str]] = {}

    def _sql(self, template: str, **parts: str) -> str:
        return Template(template).substitute(traces=self.traces, **parts)

    def list_runs(
        self,
        service: str | None = None,
        since_ns: int | None = None,
        until_ns: int | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        where = having = ""
        if service is not None:
            where = "AND ServiceName = {service:String}"
            params["service"] = service
        if since_ns is not None:
            having += " AND start_ns >= {since:Int64}"
            params["since"] = since_ns
        if until_ns is not None:
            having += " AND start_ns <= {until:Int64}"
            params["until"] = until_ns
        rows = self.client.arrow(self._sql(LIST_SQL, where=where, having=having), params).to_pylist()
        for row in rows:
            row.update(source="clickhouse", version=int(row["spans"]), updated_at=None)
        return rows

    def latest_run_id(self) -> str | None:
        rows = self.list_runs(limit=1)
        return rows[0]["run_id"] if rows else None

    def newest_run_ids(self, n: int) -> list[str]:
        return [r["run_id"] for r in self.list_runs(limit=n)]

    def _traces_of(self, run_id: str) -> list[str]:
        traces = self._trace_ids.get(run_id)
        if traces is None:
            found = self.client.arrow(self._sql(TRACES_SQL), {"run": run_id})
            traces = sorted(r["TraceId"] for r in found.to_pylist())
            if traces:  # a run not (yet) there is looked for again next time
                if len(self._trace_ids) >= MAX_KNOWN_RUNS:
                    self._trace_ids.pop(next(iter(self._trace_ids)))
                self._trace_ids[run_id] = traces
        return traces

    def run_version(self, run_id: str) -> int | None:
        """The run's span rows (grows while the Collector writes it); None: no such run."""
        traces = self._traces_of(run_id)
        if not traces:
            return None
        table = self.client.arrow(self._sql(VERSION_SQL), {"run": run_id, "traces": traces})
        n = int(table.column(0)[0].as_py()) if table.num_rows else 0
        return n or None

    def load_run(self, run_id: str) -> Run | None:
        """The run at full detail (None: no span carries this run id)."""
        traces = self._traces_of(run_id)
        if not traces:
            return None
        params: dict[str, Any] = {"run": run_id, "traces": traces}
        procs = self.client.arrow(self._sql(PROCESSES_SQL, run_filter=_ONE_RUN), params)
        spans = _span_table(self.client.arrow(self._sql(SPANS_SQL, run_filter=_ONE_RUN), params))
        return _assemble(run_id, traces[0], procs.to_pylist(), spans)

    def load_runs(self, run_ids: list[str]) -> dict[str, Run]:
        """Several runs at once (deriving fleet facts: two queries for a batch, not three per run)."""
        if not run_ids:
            return {}
        params: dict[str, Any] = {"runs": list(run_ids)}
        procs: dict[str, list[dict[str, Any]]] = {}
        for row in self.client.arrow(self._sql(PROCESSES_SQL, run_filter=_RUNS), params).to_pylist():
            procs.setdefault(row["run_id"], []).append(row)
        spans = _span_table(self.client.arrow(self._sql(SPANS_SQL, run_filter=_RUNS), params), keep_run=True)
        parts = spans.partition_by("run_id", as_dict=True) if spans.height else {}
        out = {}
        for rid, rows in procs.items():
            table = parts.get((rid,))
            table = table.drop("run_id") if table is not None else empty_spans()
            out[rid] = _assemble(rid, rows[0]["trace_id"], rows, table)
        return out


def _span_table(table: Any, keep_run: bool = False) -> pl.DataFrame:
    if table.num_rows == 0:
        return empty_spans()
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    cols = [pl.col(name).cast(dtype) for name, dtype in SPAN_SCHEMA.items()]
    return frame.with_columns(pl.lit(None, dtype=pl.Binary()).alias("attrs_pb")).select(
        [pl.col("run_id"), *cols, pl.col("absurd")] if keep_run else [*cols, pl.col("absurd")]
    )


def _assemble(run_id: str, trace_id: str, procs: list[dict[str, Any]], spans: pl.DataFrame) -> Run:
    problems: list[str] = []
    if "absurd" in spans.columns:
        absurd = int(spans.get_column("absurd").cast(pl.Int64).sum() or 0)
        spans = spans.drop("absurd")
        if absurd:
            problems.append(
                f"{absurd} span(s) with an impossible Duration in ClickHouse (2^62 ns or more, e.g. 2^64-1 for an end"
                " before the start): read as instants at their start"
            )
    # roots: `startup` spans whose parent is not a span of the run
    is_root = (pl.col("name") == "startup") & (
        pl.col("parent_id").is_null() | ~pl.col("parent_id").is_in(spans.get_column("span_id").implode())
    )
    roots = spans.filter(is_root)
    rest = spans.filter(~is_root)
    root_spans: list[Span] = sorted((span_of(r) for r in roots.iter_rows(named=True)), key=lambda s: s.start_ns)
    own = (
        rest.filter(pl.col("name") == "process")
        .group_by("lane")
        .agg(pl.col("span_id", "start").sort_by("start").first())
    )
    own_by_lane = {lane: (sid, start) for lane, sid, start in own.iter_rows()}
    services = [p["service"] for p in procs if p.get("service")]
    processes: list[Process] = []
    for p in procs:
        resource = typed_resource(p["resource"])
        sid, created = own_by_lane.get(p["lane"], ("", 0))
        processes.append(
            Process(
                instance_id=str(p["lane"]),
                pid=int_or_none(resource.get("process.pid")) or 0,
                ppid=int_or_none(resource.get("process.parent_pid")) or 0,
                journal_path=None,
                resource=resource,
                process_span_id=sid,
                exited=None,
                created_ns=int(created or 0),
                source="clickhouse",
            )
        )
    processes.sort(key=lambda p: (p.created_ns, p.instance_id))
    return Run(
        run_id=run_id,
        trace_id=trace_id,
        root_span_id=root_spans[0].span_id if root_spans else "",
        meta={},
        processes=processes,
        problems=problems,
        root_spans=root_spans,
        spans=rest,
        service=services[0] if services else None,
        source="clickhouse",
        version=rest.height + len(root_spans),
    )
