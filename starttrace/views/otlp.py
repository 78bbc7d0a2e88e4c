"""OTLP view: a run as OpenTelemetry SDK spans, sent with the official OTLP/HTTP exporter, or
written as OTLP protobuf / OTLP/JSON (`starttrace export`, `GET /runs/{id}/export`).

The spans keep the journal's trace id, span ids, parents and timestamps, so the same run looks
the same in Jaeger, Tempo and the starttrace service. Spans still open are sent with the export
time as their end and `starttrace.in_progress = true`. `detail` (analysis/detail.py): `full` sends
every span with the summary set marked (`starttrace.summary = true`), `summary` only that set.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import polars as pl
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from starttrace import __version__
from starttrace.analysis.detail import DEFAULT_DETAIL, DEFAULT_IMPORT_BUDGET, apply_detail
from starttrace.run import Process, Run, Span, span_of
from starttrace.tracer.lifecycle import otlp_endpoint

SCOPE = InstrumentationScope("starttrace", __version__)
BATCH = 512


class ExportError(Exception):
    pass


def traces_endpoint(endpoint: str | None = None) -> str | None:
    """The OTLP/HTTP traces URL: explicit, else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else ..._ENDPOINT."""
    if endpoint:
        return endpoint if endpoint.rstrip("/").endswith("/v1/traces") else endpoint.rstrip("/") + "/v1/traces"
    return otlp_endpoint()


def _attr_value(value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        items = [v for v in value if isinstance(v, (str, bool, int, float))]
        if items and all(isinstance(v, type(items[0])) for v in items):
            return tuple(items)
        return tuple(str(v) for v in value)
    return str(value)


def _attributes(attrs: dict[str, Any]) -> dict[str, Any]:
    return {str(k): _attr_value(v) for k, v in attrs.items() if v is not None}


def _context(trace_id: int, span_id: str) -> SpanContext:
    return SpanContext(trace_id, int(span_id, 16), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def to_readable_spans(
    run: Run,
    now_ns: int | None = None,
    only: set[str] | None = None,
    detail: str = DEFAULT_DETAIL,
    import_budget: int = DEFAULT_IMPORT_BUDGET,
) -> list[ReadableSpan]:
    """The spans of the run at `detail` (optionally only the ids in `only`) as SDK ReadableSpans."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    run = apply_detail(run, detail, import_budget)
    trace_id = int(run.trace_id, 16)
    parent_of_root = run.meta.get("parent_span_id")
    result: list[ReadableSpan] = []
    owners = run.root_owners()  # each node's root span goes with its own root process
    for span in run.root_spans:
        if only is None or span.span_id in only:
            owner = owners[span.span_id]
            root_resource = owner.resource if owner is not None else {"service.name": "starttrace"}
            result.append(
                _readable(span, trace_id, Resource.create(_attributes(root_resource)), now_ns, parent_of_root)
            )
    table = run.spans if only is None else run.spans.filter(pl.col("span_id").is_in(list(only)))
    by_lane: dict[str, list[dict[str, Any]]] = {}
    for row in table.iter_rows(named=True):
        by_lane.setdefault(row["lane"], []).append(row)
    for process in run.processes:
        rows = by_lane.get(process.instance_id, ())
        if not rows:
            continue
        resource = Resource.create(_attributes(process.resource))
        result.extend(_readable(span_of(row), trace_id, resource, now_ns, None, process) for row in rows)
    return result


def _readable(
    span: Span,
    trace_id: int,
    resource: Resource,
    now_ns: int,
    remote_parent: str | None = None,
    process: Process | None = None,
) -> ReadableSpan:
    attrs = dict(span.attrs)
    end = span.end_ns
    if span.open:
        attrs["starttrace.in_progress"] = True
        end = max(now_ns if end is None else end, span.start_ns)
    if span.thread is not None:
        attrs["thread.id"] = span.thread
    parent_id = span.parent_id or remote_parent
    parent = None
    if parent_id:
        parent = SpanContext(
            trace_id, int(parent_id, 16), is_remote=remote_parent is not None and parent_id == remote_parent
        )
    links = [
        Link(_context(int(link.trace_id, 16) if link.trace_id else trace_id, link.span_id), _attributes(link.attrs))
        for link in span.links
    ]
    status = Status(StatusCode.ERROR, span.error) if span.error is not None else Status(StatusCode.UNSET)
    kind = SpanKind.SERVER if span.name == "ready" else SpanKind.INTERNAL
    return ReadableSpan(
        name=span.name,
        context=_context(trace_id, span.span_id),
        parent=parent,
        resource=resource,
        attributes=_attributes(attrs),
        events=(),
        links=links,
        kind=kind,
        status=status,
        start_time=span.start_ns,
        end_time=end,
        instrumentation_scope=SCOPE,
    )


def facts_span(run: Run, facts: dict[str, Any], export_seq: int = 0, now_ns: int | None = None) -> ReadableSpan:
    """The run's facts (`analysis.fleet.run_facts`) as one `starttrace.run` span in the run's trace
    (run/facts_attrs.py): a child of the root span, from the run's start to this export, with the
    root process's resource (so it carries the run id), a fresh span id per export."""
    import secrets

    from starttrace.run.facts_attrs import PHASE, SPAN_NAME, facts_attributes

    now_ns = time.time_ns() if now_ns is None else now_ns
    trace_id = int(run.trace_id, 16)
    root = run.root_spans[0] if run.root_spans else None
    owner = run.root_owners().get(root.span_id) if root is not None else None
    resource = owner.resource if owner is not None else (run.processes[0].resource if run.processes else {})
    attrs = {"starttrace.phase": PHASE, **facts_attributes(facts, export_seq)}
    start = int(facts.get("start_ns") or (root.start_ns if root is not None else now_ns))
    return ReadableSpan(
        name=SPAN_NAME,
        context=_context(trace_id, f"{secrets.randbits(63) | 1:016x}"),
        parent=SpanContext(trace_id, int(root.span_id, 16), is_remote=False) if root is not None else None,
        resource=Resource.create(_attributes(resource)),
        attributes=_attributes(attrs),
        events=(),
        links=[],
        kind=SpanKind.INTERNAL,
        status=Status(StatusCode.UNSET),
        start_time=start,
        end_time=max(start, now_ns),
        instrumentation_scope=SCOPE,
    )


def send(spans: Sequence[ReadableSpan], exporter: SpanExporter) -> int:
    """Send in batches; returns how many spans were accepted. Raises ExportError on failure."""
    sent = 0
    for start in range(0, len(spans), BATCH):
        batch = spans[start : start + BATCH]
        if exporter.export(batch) is not SpanExportResult.SUCCESS:
            raise ExportError(f"the OTLP endpoint refused or did not answer ({sent} of {len(spans)} spans sent)")
        sent += len(batch)
    return sent


def http_exporter(endpoint: str, timeout_s: float = 10.0, headers: dict[str, str] | None = None) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s, headers=headers)


def export_run(
    run: Run,
    endpoint: str,
    timeout_s: float = 10.0,
    headers: dict[str, str] | None = None,
    detail: str = DEFAULT_DETAIL,
    import_budget: int = DEFAULT_IMPORT_BUDGET,
) -> int:
    spans = to_readable_spans(run, detail=detail, import_budget=import_budget)
    exporter = http_exporter(endpoint, timeout_s, headers)
    try:
        return send(spans, exporter)
    finally:
        exporter.shutdown()


def to_otlp_json(
    run: Run,
    spans: Iterable[ReadableSpan] | None = None,
    now_ns: int | None = None,
    detail: str = DEFAULT_DETAIL,
    import_budget: int = DEFAULT_IMPORT_BUDGET,
) -> dict[str, Any]:
    """OTLP/JSON (ExportTraceServiceRequest) with hex ids, as the OTLP spec wants them."""
    from google.protobuf import json_format
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    if spans is None:
        spans = to_readable_spans(run, now_ns, detail=detail, import_budget=import_budget)
    message = encode_spans(list(spans))
    # OTLP/JSON: enums are integers (json_format writes their names by default).
    data = json_format.MessageToDict(message, preserving_proto_field_name=False, use_integers_for_enums=True)
    for resource_spans in data.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for item in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if item.get(key):
                        item[key] = _b64_to_hex(item[key])
                for link in item.get("links", []):
                    for key in ("traceId", "spanId"):
                        if link.get(key):
                            link[key] = _b64_to_hex(link[key])
    return data


def _b64_to_hex(value: str) -> str:
    import base64

    return base64.b64decode(value).hex()


def to_otlp_protobuf(
    run: Run, now_ns: int | None = None, detail: str = DEFAULT_DETAIL, import_budget: int = DEFAULT_IMPORT_BUDGET
) -> bytes:
    """An OTLP protobuf ExportTraceServiceRequest of the run at `detail` (what a backend receives)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(to_readable_spans(run, now_ns, detail=detail, import_budget=import_budget)).SerializeToString()
