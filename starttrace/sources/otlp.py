"""OTLP trace decoding: an OTLP/HTTP request body (protobuf or OTLP/JSON) as ingest batches.

- OTLP/JSON ids are hex: they are converted before `json_format` reads the message (which would
  otherwise read them as base64).
- Spans with bad ids or out-of-range times are rejected one by one (partial success).
- Each span's attributes are kept as their raw protobuf bytes; those the analysis reads of every span
  (`run.COLUMN_KEYS`) are read once here, from the parsed span, and become columns of the stored
  batch; the others are decoded only for the rows that ask (`span_attrs`).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from starttrace.run import LAUNCHED_BY_KEY, MODULE_KEY, PHASE_KEY, SELF_US_KEY
from starttrace.run.facts_attrs import SPAN_NAME as FACTS_SPAN
from starttrace.run.facts_attrs import VERSION_KEY
from starttrace.run.otlp_attrs import kv_attrs, message_class
from starttrace.sources.batches import IngestBatch, ProcessBatch, SpanTuple

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)
_STATUS_ERROR = 2


class BadRequest(Exception):
    """The body is not a valid OTLP request; the message says why (answered with 400)."""


def _hex_to_b64(value: Any) -> Any:
    """OTLP/JSON ids are hex; protobuf's JSON reader expects base64. Invalid hex becomes an empty
    id, which the span validation then rejects (partial success)."""
    if not isinstance(value, str):
        return value
    try:
        raw = binascii.unhexlify(value)
    except (binascii.Error, ValueError):
        return ""
    return base64.b64encode(raw).decode("ascii")


def _fix_ids(doc: Any) -> None:
    if not isinstance(doc, dict):
        raise BadRequest("OTLP/JSON body must be an object")
    for rs in doc.get("resourceSpans") or []:
        if not isinstance(rs, dict):
            continue
        for ss in (rs.get("scopeSpans") or []) + (rs.get("instrumentationLibrarySpans") or []):
            if not isinstance(ss, dict):
                continue
            for span in ss.get("spans") or []:
                if not isinstance(span, dict):
                    continue
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = _hex_to_b64(span[key])
                for link in span.get("links") or []:
                    if isinstance(link, dict):
                        for key in ("traceId", "spanId"):
                            if key in link:
                                link[key] = _hex_to_b64(link[key])
        rs.pop("instrumentationLibrarySpans", None)


def parse_request(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    msg = ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        try:
            msg.ParseFromString(body)
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise BadRequest(f"invalid protobuf ExportTraceServiceRequest: {exc}") from None
        return msg
    try:
        doc = json.loads(body) if body.strip() else {}
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(f"invalid JSON: {exc}") from None
    _fix_ids(doc)
    try:
        json_format.ParseDict(doc, msg, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError, AttributeError) as exc:
        raise BadRequest(f"invalid OTLP/JSON ExportTraceServiceRequest: {exc}") from None
    return msg


_IN_PROGRESS = "starttrace.in_progress"
_SCOPE_KEY = "otel.scope.name"
_MAX_NS = (1 << 63) - 1  # SQLite integers are signed 64-bit


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _build_lite_types() -> Any:
    """`ExportTraceServiceRequest` with each span's attributes left as their raw bytes (same field
    numbers and wire types), its other fields unknown: with those discarded, a span serializes as its
    attribute entries alone, the bytes the store keeps (the receiver reads each span's fields from
    the request parsed with the OTLP schema), so no attribute is decoded in Python at ingest."""
    from google.protobuf import descriptor_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2 as _t  # noqa: F401  (registers the deps)

    fdp = descriptor_pb2.FieldDescriptorProto
    optional, repeated = fdp.LABEL_OPTIONAL, fdp.LABEL_REPEATED
    return message_class(
        "starttrace/sources/otlp_lite.proto",
        "starttrace.otlp_lite",
        ["opentelemetry/proto/common/v1/common.proto", "opentelemetry/proto/resource/v1/resource.proto"],
        [
            ("Span", [("attributes", 9, fdp.TYPE_BYTES, repeated, "")]),
            (
                "ScopeSpans",
                [
                    ("scope", 1, fdp.TYPE_MESSAGE, optional, ".opentelemetry.proto.common.v1.InstrumentationScope"),
                    ("spans", 2, fdp.TYPE_MESSAGE, repeated, ".starttrace.otlp_lite.Span"),
                    ("schema_url", 3, fdp.TYPE_STRING, optional, ""),
                ],
            ),
            (
                "ResourceSpans",
                [
                    ("resource", 1, fdp.TYPE_MESSAGE, optional, ".opentelemetry.proto.resource.v1.Resource"),
                    ("scope_spans", 2, fdp.TYPE_MESSAGE, repeated, ".starttrace.otlp_lite.ScopeSpans"),
                    ("schema_url", 3, fdp.TYPE_STRING, optional, ""),
                ],
            ),
            ("Request", [("resource_spans", 1, fdp.TYPE_MESSAGE, repeated, ".starttrace.otlp_lite.ResourceSpans")]),
        ],
    )


_LiteRequest = _build_lite_types()
_ATTR_TAG = b"J"  # Span.attributes: field 9, length-delimited
_IN_PROGRESS_B = _IN_PROGRESS.encode()
_SCOPE_KEY_B = _SCOPE_KEY.encode()
_EXCEPTION_B = b"exception"
_FACTS_B = VERSION_KEY.encode()  # an attribute only the facts span has


def _scope_suffix(scope: str) -> bytes:
    """A serialized `Span.attributes` entry `otel.scope.name = scope`, appended to a span's bytes
    (a repeated field may be continued anywhere in a message: it parses as one more attribute)."""
    kv = KeyValue(key=_SCOPE_KEY, value=AnyValue(string_value=scope)).SerializeToString()
    return _ATTR_TAG + varint(len(kv)) + kv


_NUMBERS = ("double_value", "int_value")
_COLUMNS = {PHASE_KEY: 0, MODULE_KEY: 1, SELF_US_KEY: 2, LAUNCHED_BY_KEY: 3, _IN_PROGRESS: 4}


def _own_attrs(attributes: Any, maybe_open: bool) -> tuple[bool, Any, Any, Any, Any]:
    """`starttrace.in_progress` and the column attributes of a span (`run.column_values`' rule: a
    phase or launched-by that is a non-empty string, a module that is a string, a self time that is
    a number; else None), in one walk of its parsed attributes (a repeated key: the last one wins,
    as in `span_attrs`). A string value is read as such; its kind is asked only when it is empty
    (an empty string, or a value of another kind)."""
    in_progress = False
    phase = module = self_us = launched = None
    columns = _COLUMNS
    for kv in attributes:
        which = columns.get(kv.key)
        if which is None:
            continue
        v = kv.value
        if which == 0:
            phase = v.string_value or None
        elif which == 1:
            module = v.string_value
            if not module and v.WhichOneof("value") != "string_value":
                module = None
        elif which == 2:
            kind = v.WhichOneof("value")
            self_us = float(v.double_value if kind == "double_value" else v.int_value) if kind in _NUMBERS else None
        elif which == 3:
            launched = v.string_value or None
        elif maybe_open:
            in_progress = v.WhichOneof("value") == "bool_value" and v.bool_value
    return in_progress, phase, module, self_us, launched


@dataclass
class Decoded:
    batch: IngestBatch
    accepted: int
    rejected: int
    errors: list[str]


MAX_RUN_ID = 200


def run_id_problem(run_id: Any) -> str | None:
    """Why a resource's `starttrace.run_id` cannot be a run (None: it can). A run id is a path
    segment of every URL of the run (`/startup/{run_id}`): no `/`, not `.` or `..`, no control
    characters, at most MAX_RUN_ID characters; so every run id stored round-trips."""
    if run_id is None:
        return None
    text = str(run_id)
    if text in ("", ".", ".."):
        return f"invalid starttrace.run_id {text!r}"
    if "/" in text or any(ord(c) < 32 or ord(c) == 127 for c in text) or len(text) > MAX_RUN_ID:
        return (
            f"invalid starttrace.run_id {text[:80]!r}: a run id is one URL path segment (no '/', no control"
            f" characters, at most {MAX_RUN_ID} characters)"
        )
    return None


def decode(msg: ExportTraceServiceRequest | bytes) -> Decoded:
    """Rows from a request (its protobuf bytes, or a parsed message).

    The request is parsed twice, each time whole and in C: with the OTLP schema, for each span's
    fields and its column attributes (a malformed span fails the request), and with `_LiteRequest`,
    for the raw bytes of each span's attribute entries. Those bytes (plus the scope name as one more
    attribute) are the stored attributes, decoded only for the rows that ask (`run.decode_attrs`).
    Parsing each span on its own cost ~3x more per span than this whole-request parse."""
    # Long by design: the ingest hot loop (every span of every request): names bound as locals and validation inlined,
    # measured for the ingest benchmark.
    if not isinstance(msg, bytes):
        msg = msg.SerializeToString()
    full = ExportTraceServiceRequest.FromString(msg)
    lite = _LiteRequest.FromString(msg)
    lite.DiscardUnknownFields()  # each span: its attributes alone
    processes: list[ProcessBatch] = []
    accepted = rejected = 0
    errors: list[str] = []
    zero_trace = _ZERO_TRACE
    zero_span = _ZERO_SPAN
    max_ns = _MAX_NS
    error_code = _STATUS_ERROR
    ours_b, own_attrs = b"starttrace.", _own_attrs
    # whole-request byte searches: where a key is nowhere in the request, no span needs the check
    # (most requests of a finished startup have no span in progress and no exception event)
    maybe_open = _IN_PROGRESS_B in msg
    maybe_exception = _EXCEPTION_B in msg
    # a run's facts span (run/facts_attrs.py) is acknowledged, not stored as a startup span: the
    # service derives the facts itself, and the span must not change the run's waterfall
    maybe_facts = _FACTS_B in msg
    last_tid, last_hex = b"", ""  # the spans of a request mostly share one trace id
    for rs, rs_raw in zip(full.resource_spans, lite.resource_spans, strict=True):
        resource = kv_attrs(rs.resource.attributes)
        bad_run = run_id_problem(resource.get("starttrace.run_id"))
        if bad_run is not None:  # a run no URL could open: refused, with its spans
            n = sum(len(ss.spans) for ss in rs.scope_spans)
            rejected += n
            if n and len(errors) < 5:
                errors.append(bad_run)
            continue
        rows: list[SpanTuple] = []
        append = rows.append
        # one str per span id of the process's batch, shared by the span and its children's parent
        # ids: the stored blob then holds a back-reference for most parent ids, and the loaded run
        # one string for both (a child ends, and so is sent, before its parent, in the same batch)
        hexes: dict[bytes, str] = {}
        for ss, ss_raw in zip(rs.scope_spans, rs_raw.scope_spans, strict=True):
            scope = ss.scope.name
            suffix = None
            if scope and not scope.startswith("starttrace"):
                suffix = _scope_suffix(scope)
            for sp, lite_span in zip(ss.spans, ss_raw.spans, strict=True):
                if maybe_facts and sp.name == FACTS_SPAN:
                    accepted += 1
                    continue
                raw = lite_span.SerializeToString()
                tid = sp.trace_id
                sid = sp.span_id
                pid = sp.parent_span_id
                if tid != last_tid:
                    if len(tid) != 16 or tid == zero_trace:
                        rejected += 1
                        if len(errors) < 5:
                            errors.append(f"span {sp.name[:80]!r}: invalid trace or span id")
                        continue
                    last_tid, last_hex = tid, tid.hex()
                if len(sid) != 8 or sid == zero_span:
                    rejected += 1
                    if len(errors) < 5:
                        errors.append(f"span {sp.name[:80]!r}: invalid trace or span id")
                    continue
                if pid and (len(pid) != 8 or pid == zero_span):
                    if len(pid) != 8:
                        rejected += 1
                        if len(errors) < 5:
                            errors.append(f"span {sp.name[:80]!r}: invalid parent span id")
                        continue
                    pid = b""
                start = sp.start_time_unix_nano
                end = sp.end_time_unix_nano
                if start > max_ns or end > max_ns:
                    rejected += 1
                    if len(errors) < 5:
                        errors.append(f"span {sp.name[:80]!r}: timestamp out of range")
                    continue
                # an end before the start is kept as sent: the model names the span (analysis.lanes)
                # a byte search first: the attribute list is read only when a key it looks for may be there
                if ours_b in raw:
                    in_progress, phase, module, self_us, launched = own_attrs(sp.attributes, maybe_open)
                else:
                    in_progress = False
                    phase = module = self_us = launched = None
                if suffix is not None and not (
                    _SCOPE_KEY_B in raw and any(kv.key == _SCOPE_KEY for kv in sp.attributes)
                ):
                    raw += suffix
                error = None
                if sp.HasField("status") and sp.status.code == error_code:
                    error = sp.status.message or "error"
                if error is None and maybe_exception and any(e.name == "exception" for e in sp.events):
                    error = "exception"
                sid_hex = hexes.get(sid)
                if sid_hex is None:
                    sid_hex = hexes[sid] = sid.hex()
                pid_hex = None
                if pid:
                    pid_hex = hexes.get(pid)
                    if pid_hex is None:
                        pid_hex = hexes[pid] = pid.hex()
                append(
                    (
                        last_hex,
                        sid_hex,
                        pid_hex,
                        sp.name,
                        start,
                        end,
                        in_progress,
                        end == start and not in_progress,
                        raw,
                        error,
                        None,
                        phase,
                        module,
                        self_us,
                        launched,
                    )
                )
                accepted += 1
        if rows or resource:
            processes.append(ProcessBatch(source="otlp", resource=resource, spans=rows))
    return Decoded(IngestBatch(processes=processes), accepted, rejected, errors)


def parse_and_decode(body: bytes, ctype: str) -> Decoded:
    if ctype == PROTOBUF:
        # every span is parsed (and so validated) by `decode` itself; only the envelope is checked here
        try:
            return decode(body)
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise BadRequest(f"invalid protobuf ExportTraceServiceRequest: {exc}") from None
    return decode(parse_request(body, ctype))
