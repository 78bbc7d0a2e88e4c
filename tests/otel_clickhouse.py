"""Fill `otel_traces` the way the Collector's `clickhouse` exporter fills it (tests, benchmarks).

`exporter_rows(request)` turns an OTLP ExportTraceServiceRequest (what the Collector receives) into
the rows `pushTraceData` inserts (opentelemetry-collector-contrib exporter/clickhouseexporter/
exporter_traces.go): Timestamp = start, lowercase hex ids ('' for no parent), ServiceName from the
resource, every attribute value as `pcommon.Value.AsString()` (internal/util.go AttributesToMap),
ScopeName/ScopeVersion, Duration = end - start in ns, StatusCode and SpanKind as traceutil's
strings, Events and Links as parallel arrays. `insert(client, rows)` writes them with one
`INSERT ... FORMAT JSONEachRow` into the exporter's own table (`sources.clickhouse.ddl.traces_ddl`).
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from starttrace.sources.clickhouse.client import Client
from starttrace.sources.clickhouse.ddl import traces_ddl

# traceutil.SpanKindStr / StatusCodeStr
SPAN_KINDS = {0: "Unspecified", 1: "Internal", 2: "Server", 3: "Client", 4: "Producer", 5: "Consumer"}
STATUS_CODES = {0: "Unset", 1: "Ok", 2: "Error"}


def _raw(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return v.double_value
    if kind == "array_value":
        return [_raw(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _raw(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    return None


def _go_float(f: float) -> str:
    """strconv.FormatFloat(f, 'f', -1, 64)."""
    text = format(Decimal(repr(f)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def as_string(v: AnyValue) -> str:
    """pcommon.Value.AsString()."""
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return "true" if v.bool_value else "false"
    if kind == "int_value":
        return str(v.int_value)
    if kind == "double_value":
        return _go_float(v.double_value)
    if kind in ("array_value", "kvlist_value"):
        return json.dumps(_raw(v), separators=(",", ":"), ensure_ascii=False)
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    return ""


def attributes_to_map(kvs: Iterable[Any]) -> dict[str, str]:
    return {kv.key: as_string(kv.value) for kv in kvs}


def _ts(ns: int) -> str:
    """A DateTime64(9) value as ClickHouse reads it from JSON: epoch seconds with 9 decimals."""
    return f"{ns // 10**9}.{ns % 10**9:09d}"


def exporter_rows(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for rs in request.resource_spans:
        res_attr = attributes_to_map(rs.resource.attributes)
        service = next((as_string(kv.value) for kv in rs.resource.attributes if kv.key == "service.name"), "")
        for ss in rs.scope_spans:
            for sp in ss.spans:
                rows.append(
                    {
                        "Timestamp": _ts(sp.start_time_unix_nano),
                        "TraceId": sp.trace_id.hex(),
                        "SpanId": sp.span_id.hex(),
                        "ParentSpanId": sp.parent_span_id.hex(),
                        "TraceState": sp.trace_state,
                        "SpanName": sp.name,
                        "SpanKind": SPAN_KINDS.get(sp.kind, "Unspecified"),
                        "ServiceName": service,
                        "ResourceAttributes": res_attr,
                        "ScopeName": ss.scope.name,
                        "ScopeVersion": ss.scope.version,
                        "SpanAttributes": attributes_to_map(sp.attributes),
                        "Duration": max(0, sp.end_time_unix_nano - sp.start_time_unix_nano),
                        "StatusCode": STATUS_CODES.get(sp.status.code, "Unset"),
                        "StatusMessage": sp.status.message,
                        "Events.Timestamp": [_ts(e.time_unix_nano) for e in sp.events],
                        "Events.Name": [e.name for e in sp.events],
                        "Events.Attributes": [attributes_to_map(e.attributes) for e in sp.events],
                        "Links.TraceId": [lk.trace_id.hex() for lk in sp.links],
                        "Links.SpanId": [lk.span_id.hex() for lk in sp.links],
                        "Links.TraceState": [lk.trace_state for lk in sp.links],
                        "Links.Attributes": [attributes_to_map(lk.attributes) for lk in sp.links],
                    }
                )
    return rows


def facts_span_row(facts: dict[str, Any], export_seq: int = 1, end_ns: int | None = None) -> dict[str, Any]:
    """The exporter's row of a run's `starttrace.run` facts span (views/otlp.py `facts_span`), with
    the attributes as AsString writes them (tests of the fleet over facts that travel with the run)."""
    from starttrace.run.facts_attrs import PHASE, SPAN_NAME, facts_attributes

    def text(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return _go_float(v) if isinstance(v, float) else str(v)

    start = int(facts["start_ns"])
    attrs = {"starttrace.phase": PHASE, **facts_attributes(facts, export_seq)}
    resource = {"service.name": facts["service"], "starttrace.run_id": facts["run_id"]}
    return {
        "Timestamp": _ts(start),
        "TraceId": facts["trace_id"],
        "SpanId": f"{export_seq + 1:016x}",
        "ParentSpanId": "",
        "TraceState": "",
        "SpanName": SPAN_NAME,
        "SpanKind": "Internal",
        "ServiceName": facts["service"],
        "ResourceAttributes": resource,
        "ScopeName": "starttrace",
        "ScopeVersion": "",
        "SpanAttributes": {k: text(v) for k, v in attrs.items()},
        "Duration": max(0, (end_ns or start + 10**9) - start),
        "StatusCode": "Unset",
        "StatusMessage": "",
        "Events.Timestamp": [],
        "Events.Name": [],
        "Events.Attributes": [],
        "Links.TraceId": [],
        "Links.SpanId": [],
        "Links.TraceState": [],
        "Links.Attributes": [],
    }


def create_tables(client: Client) -> None:
    """The exporter's DDL (create_schema: true), on the client's database and table."""
    for stmt in traces_ddl(client.url.database, client.url.table):
        client.command(stmt)


COLUMNS = (
    "Timestamp, TraceId, SpanId, ParentSpanId, TraceState, SpanName, SpanKind, ServiceName, ResourceAttributes,"
    " ScopeName, ScopeVersion, SpanAttributes, Duration, StatusCode, StatusMessage, Events.Timestamp, Events.Name,"
    " Events.Attributes, Links.TraceId, Links.SpanId, Links.TraceState, Links.Attributes"
)


def insert(client: Client, rows: list[dict[str, Any]]) -> None:
    """One INSERT of the rows, as the exporter's batch insert (JSONEachRow on the wire)."""
    if not rows:
        return
    if client.url.kind == "chdb":  # a file: no 100 MB query text for a benchmark's batch
        fd, path = tempfile.mkstemp(suffix=".jsonl")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, separators=(",", ":")) + "\n")
            client.command(
                f"INSERT INTO {client.url.traces} ({COLUMNS}) SELECT {COLUMNS} FROM file('{path}', JSONEachRow,"
                f" '{_FILE_SCHEMA}')"
            )
        finally:
            os.unlink(path)
        return
    body = "\n".join(json.dumps(row, separators=(",", ":")) for row in rows)
    client.command(f"INSERT INTO {client.url.traces} ({COLUMNS}) FORMAT JSONEachRow\n{body}")


_MAP = "Map(String, String)"
_FILE_SCHEMA = (
    "Timestamp DateTime64(9), TraceId String, SpanId String, ParentSpanId String, TraceState String,"
    " SpanName String, SpanKind String, ServiceName String, ResourceAttributes " + _MAP + ","
    " ScopeName String, ScopeVersion String, SpanAttributes " + _MAP + ", Duration UInt64, StatusCode String,"
    " StatusMessage String, `Events.Timestamp` Array(DateTime64(9)), `Events.Name` Array(String),"
    " `Events.Attributes` Array(" + _MAP + "), `Links.TraceId` Array(String), `Links.SpanId` Array(String),"
    " `Links.TraceState` Array(String), `Links.Attributes` Array(" + _MAP + ")"
)
