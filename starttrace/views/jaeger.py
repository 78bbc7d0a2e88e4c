"""Jaeger view: a run as a Jaeger UI JSON file (`{"data": [trace]}`; parents only through
`references`, times in microseconds), loadable with the Jaeger UI's "JSON File" search.
`detail` as for every exporter (analysis/detail.py): `summary` keeps what the Jaeger UI can draw."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from starttrace.analysis.detail import DEFAULT_DETAIL, DEFAULT_IMPORT_BUDGET, apply_detail
from starttrace.run import Run, Span, span_of
from starttrace.views.json import attr_text
from starttrace.views.perfetto import lane_rows, sort_key

_TAG_TYPES = ((bool, "bool"), (int, "int64"), (float, "float64"), (str, "string"))  # bool before int: a subclass


def _tag(key: str, value: Any) -> dict[str, Any]:
    kind = next((name for cls, name in _TAG_TYPES if isinstance(value, cls)), None)
    if kind == "float64" and not math.isfinite(value):
        return {"key": key, "type": "string", "value": attr_text(value)}  # NaN, infinity: their text
    if kind is None:
        return {"key": key, "type": "string", "value": json.dumps(value, default=str)}
    return {"key": key, "type": kind, "value": value}


def trace_hex(run: Run) -> str:
    """The run's 32-hex trace id (a stable stand-in derived from the run id when it has none)."""
    tid = run.trace_id or ""
    if len(tid) == 32 and all(c in "0123456789abcdef" for c in tid):
        return tid
    import hashlib

    return hashlib.md5((tid or run.run_id).encode()).hexdigest()


def to_jaeger(
    run: Run, now_ns: int | None = None, detail: str = DEFAULT_DETAIL, import_budget: int = DEFAULT_IMPORT_BUDGET
) -> dict[str, Any]:
    now_ns = time.time_ns() if now_ns is None else now_ns
    run = apply_detail(run, detail, import_budget)
    trace_id = trace_hex(run)
    processes: dict[str, Any] = {}
    spans: list[dict[str, Any]] = []
    root, root_owners = run.root_process, run.root_owners()
    ordered = sorted(run.processes, key=sort_key)
    by_lane = lane_rows(run)
    for index, process in enumerate(ordered, 1):
        key = f"p{index}"
        tags = [_tag(k, v) for k, v in process.resource.items() if k != "service.name"]
        service = process.resource.get("service.name") or run.service or "starttrace"
        processes[key] = {"serviceName": str(service), "tags": tags}
        own = [span_of(row) for row in by_lane.get(process.instance_id, ())]
        own += [s for s in run.root_spans if (root_owners[s.span_id] or root) is process]
        spans.extend(_span(s, trace_id, key, now_ns) for s in own)
    if not run.processes and run.root_spans:
        processes["p1"] = {"serviceName": run.service or "starttrace", "tags": []}
        spans.extend(_span(s, trace_id, "p1", now_ns) for s in run.root_spans)
    return {"data": [{"traceID": trace_id, "spans": spans, "processes": processes, "warnings": None}]}


def _span(span: Span, trace_id: str, process_key: str, now_ns: int) -> dict[str, Any]:
    refs = []
    if span.parent_id:
        refs.append({"refType": "CHILD_OF", "traceID": trace_id, "spanID": span.parent_id})
    refs.extend(
        {"refType": "FOLLOWS_FROM", "traceID": link.trace_id or trace_id, "spanID": link.span_id} for link in span.links
    )
    tags = [_tag(k, v) for k, v in span.attrs.items()]
    if span.error:
        tags.append(_tag("error", True))
        tags.append(_tag("otel.status_description", span.error))
    end = span.end_ns
    if span.open:
        tags.append(_tag("starttrace.in_progress", True))
        end = max(now_ns if end is None else end, span.start_ns)
    return {
        "traceID": trace_id,
        "spanID": span.span_id,
        "operationName": span.name,
        "references": refs,
        "startTime": span.start_ns // 1000,
        "duration": max(0, (end or span.start_ns) - span.start_ns) // 1000,
        "tags": tags,
        "logs": [],
        "processID": process_key,
        "warnings": None,
        "flags": 1,
    }
