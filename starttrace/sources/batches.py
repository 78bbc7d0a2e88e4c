"""What a source hands the store: spans of processes, grouped in ingest batches; and the packed
form the store keeps them in (one `marshal` blob per trace of a process batch)."""

from __future__ import annotations

import marshal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# (trace_id, span_id, parent_id, name, start_ns, end_ns, in_progress, instant, attrs, error, thread)
# attrs: JSON object text (journal), or the span's raw OTLP protobuf bytes (see `decode_attrs`)
SpanTuple = tuple[
    str, str, "str | None", str, int, "int | None", int, int, "str | bytes | None", "str | None", "int | None"
]


MARSHAL_VERSION = 4  # read by every Python since 3.4; written explicitly so a newer default changes nothing
SPAN_FIELDS = 11  # len(SpanTuple)


def pack_spans(spans: list[SpanTuple]) -> bytes:
    return marshal.dumps(spans, MARSHAL_VERSION)


def unpack_spans(body: bytes) -> list[SpanTuple]:
    """Packed spans; ValueError when the blob is not a list of span tuples (a damaged file)."""
    try:
        spans = marshal.loads(body)
    except (EOFError, TypeError, ValueError) as exc:
        raise ValueError(f"unreadable span batch: {exc}") from None
    if type(spans) is not list or (spans and ({*map(type, spans)} != {tuple} or {*map(len, spans)} != {SPAN_FIELDS})):
        raise ValueError("unreadable span batch: not a list of span tuples")
    return spans


@dataclass
class PackedSpans:
    """Spans of one process and one trace, packed (`pack_spans`), with what the store's writer
    needs to know of them without unpacking: their ids, which are in progress, their time range."""

    trace_id: str
    span_ids: list[str]
    open_ids: list[str]  # those in progress
    first_ns: int
    last_ns: int
    body: bytes


# a start before 2000 (start_time_unix_nano=0 from a broken exporter) does not move a run's first
# time (the runs list, `since`): the span itself is named when the run is read (sources.plausible)
PLAUSIBLE_MIN_NS = 946_684_800 * 10**9


def _first_ns(group: list[SpanTuple]) -> int:
    starts = [s[4] for s in group]
    first = min(starts)
    if first < PLAUSIBLE_MIN_NS:
        first = min([t for t in starts if t >= PLAUSIBLE_MIN_NS], default=first)
    return first


def pack_by_trace(spans: list[SpanTuple]) -> list[PackedSpans]:
    """Spans (of one process) packed per trace id, in arrival order."""
    if not spans:
        return []
    trace_ids = list(dict.fromkeys([s[0] for s in spans]))
    groups = [spans] if len(trace_ids) == 1 else [[s for s in spans if s[0] == t] for t in trace_ids]
    return [
        PackedSpans(
            trace_id,
            [s[1] for s in group],
            [s[1] for s in group if s[6]],
            _first_ns(group),
            max([s[5] if s[5] is not None else s[4] for s in group]),
            pack_spans(group),
        )
        for trace_id, group in zip(trace_ids, groups, strict=True)
    ]


@dataclass
class ProcessBatch:
    """Spans of one process (one OTLP ResourceSpans, or one journal file): as tuples, or already
    packed (`packed`, e.g. by the service's decoder process); the store takes either."""

    source: str  # "otlp" | "journal"
    resource: dict[str, Any]
    spans: list[SpanTuple]
    run_id: str | None = None  # None: resolved from the resource, else from the trace id
    lane_id: str | None = None  # None: service.instance.id, else pid, else service name
    info: dict[str, Any] = field(default_factory=dict)  # exited, exit_code, warnings, preloaded, journal_path
    packed: list[PackedSpans] = field(default_factory=list)

    def span_count(self) -> int:
        return len(self.spans) + sum(len(p.span_ids) for p in self.packed)

    def packed_spans(self) -> list[PackedSpans]:
        """All its spans, packed per trace (the tuples packed here)."""
        return self.packed + pack_by_trace(self.spans) if self.spans else self.packed


@dataclass
class RunMeta:
    run_id: str
    trace_id: str | None
    meta: dict[str, Any]
    problems: list[str]
    service: str | None = None


@dataclass
class IngestBatch:
    processes: list[ProcessBatch]
    runs: list[RunMeta] = field(default_factory=list)
    replace_problems: bool = False
    done: threading.Event | None = None
    # called by the writer once the batch's transaction committed (None) or failed (the error's
    # text): the OTLP receiver acknowledges a request only then (docs/service.md, "Acknowledged")
    on_written: Callable[[str | None], None] | None = None

    def span_count(self) -> int:
        return sum(p.span_count() for p in self.processes)
