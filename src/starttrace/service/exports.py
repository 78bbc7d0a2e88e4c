"""Export a run (its waterfall model) as Perfetto / Chrome trace JSON, Jaeger UI JSON or OTLP/JSON."""

from __future__ import annotations

from typing import Any

from starttrace.analysis.model import Lane, RunModel, SpanNode

FORMATS = ("perfetto", "jaeger", "otlp-json")


def _trace_hex(model: RunModel) -> str:
    tid = model.trace_id or ""
    if len(tid) == 32 and all(c in "0123456789abcdef" for c in tid):
        return tid
    import hashlib

    return hashlib.md5((tid or model.run_id).encode()).hexdigest()


def _lane_pid(lane: Lane) -> int:
    return lane.pid if lane.pid is not None else 1_000_000 + lane.index


def perfetto(model: RunModel) -> dict[str, Any]:
    """Chrome trace event format (loads in ui.perfetto.dev and chrome://tracing)."""
    events: list[dict[str, Any]] = []
    for lane in model.lanes:
        pid = _lane_pid(lane)
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": pid, "args": {"name": lane.label}})
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid, "args": {"sort_index": lane.index}}
        )
        for n in lane.spans:
            tid = n.thread if n.thread is not None else pid
            args: dict[str, Any] = {k: v for k, v in n.attrs.items()}
            args["span_id"] = n.id
            if n.error:
                args["error"] = n.error
            ts = (n.start - model.t0) / 1000
            if n.instant:
                events.append(
                    {
                        "ph": "i",
                        "s": "p",
                        "name": n.name,
                        "cat": n.phase,
                        "pid": pid,
                        "tid": tid,
                        "ts": ts,
                        "args": args,
                    }
                )
                continue
            if n.in_progress:
                args["in_progress"] = True
            events.append(
                {
                    "ph": "X",
                    "name": n.name,
                    "cat": n.phase,
                    "pid": pid,
                    "tid": tid,
                    "ts": ts,
                    "dur": (n.eff_end - n.start) / 1000,
                    "args": args,
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"run_id": model.run_id, "trace_id": model.trace_id, "start_epoch_ns": model.t0},
    }


def _tag(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    if isinstance(value, str):
        return {"key": key, "type": "string", "value": value}
    import json

    return {"key": key, "type": "string", "value": json.dumps(value, default=str)}


def jaeger(model: RunModel) -> dict[str, Any]:
    """Jaeger UI JSON file: parents only through `references`."""
    trace_id = _trace_hex(model)
    processes: dict[str, Any] = {}
    spans: list[dict[str, Any]] = []
    for lane in model.lanes:
        pid_key = f"p{lane.index + 1}"
        tags = [_tag(k, v) for k, v in lane.resource.items() if k != "service.name"]
        processes[pid_key] = {"serviceName": lane.service or model.service or "starttrace", "tags": tags}
        for n in lane.spans:
            refs = []
            if n.parent_node is not None:
                refs.append({"refType": "CHILD_OF", "traceID": trace_id, "spanID": n.parent_node.id})
            tags_s = [_tag(k, v) for k, v in n.attrs.items()]
            if n.error:
                tags_s.append(_tag("error", True))
                tags_s.append(_tag("otel.status_description", n.error))
            if n.in_progress:
                tags_s.append(_tag("starttrace.in_progress", True))
            spans.append(
                {
                    "traceID": trace_id,
                    "spanID": n.id,
                    "operationName": n.name,
                    "references": refs,
                    "startTime": n.start // 1000,
                    "duration": (n.eff_end - n.start) // 1000,
                    "tags": tags_s,
                    "logs": [],
                    "processID": pid_key,
                    "warnings": None,
                    "flags": 1,
                }
            )
    return {"data": [{"traceID": trace_id, "spans": spans, "processes": processes, "warnings": None}]}


def _any(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_any(v) for v in value]}}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": [{"key": str(k), "value": _any(v)} for k, v in value.items()]}}
    return {"stringValue": str(value)}


def _kvs(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any(v)} for k, v in attrs.items()]


def _otlp_span(n: SpanNode, trace_id: str) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": n.id,
        "name": n.name,
        "kind": 1,
        "startTimeUnixNano": str(n.start),
        "endTimeUnixNano": str(n.eff_end),
        "attributes": _kvs(dict(n.attrs, **({"starttrace.in_progress": True} if n.in_progress else {}))),
    }
    if n.parent_node is not None:
        span["parentSpanId"] = n.parent_node.id
    elif n.parent:
        span["parentSpanId"] = n.parent
    if n.error:
        span["status"] = {"code": 2, "message": n.error}
    return span


def otlp_json(model: RunModel) -> dict[str, Any]:
    """An OTLP/JSON ExportTraceServiceRequest (hex ids), one ResourceSpans per process."""
    trace_id = _trace_hex(model)
    out = []
    for lane in model.lanes:
        resource = dict(lane.resource)
        resource.setdefault("starttrace.run_id", model.run_id)
        out.append(
            {
                "resource": {"attributes": _kvs(resource)},
                "scopeSpans": [
                    {"scope": {"name": "starttrace"}, "spans": [_otlp_span(n, trace_id) for n in lane.spans]}
                ],
            }
        )
    return {"resourceSpans": out}


def export(model: RunModel, fmt: str) -> dict[str, Any]:
    if fmt == "perfetto":
        return perfetto(model)
    if fmt == "jaeger":
        return jaeger(model)
    if fmt == "otlp-json":
        return otlp_json(model)
    raise ValueError(f"unknown export format {fmt!r}; one of {', '.join(FORMATS)}")
