"""What a source hands the store: spans of processes, grouped in ingest batches; and the packed
form the store keeps them in: one Arrow IPC stream per trace of a process batch, its columns the
run's span table's (`run.SPAN_SCHEMA`) but `lane` (`STORED_SCHEMA`).

A source hands spans as tuples (`SpanTuple`): the OTLP decoder with the span's column attributes
read once from the parsed span (`SpanTuple` of 15 fields), tests and tools with attributes as JSON
text (11 fields: the columns are read from the text here). `pack_by_trace` turns them into columns
and writes them; a source that has a table already (the journal watcher) packs it (`pack_frame`).
The store keeps the stream as it came and reads a run's streams back as one table (`read_packed`):
no Python object per span on the way out.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from starttrace.run import SPAN_SCHEMA, as_int64, column_values, decode_attrs

# (trace_id, span_id, parent_id, name, start_ns, end_ns, in_progress, instant, attrs, error, thread
#  [, phase, module, self_us, launched_by])
# attrs: JSON object text (journal), or the OTLP bytes of its attribute entries; the last four (the
# column attributes, `run.COLUMN_KEYS`) when the source read them already, else read from attrs here
SpanTuple = tuple[Any, ...]
SPAN_FIELDS = 11  # a SpanTuple without its column attributes
SPAN_FIELDS_COLUMNS = 15  # with them

STORED_SCHEMA: dict[str, pl.DataType] = {k: v for k, v in SPAN_SCHEMA.items() if k != "lane"}
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # an Arrow IPC stream's end
# each column buffer LZ4-compressed (Arrow IPC's own buffer compression): a 6000-span lane's batches
# ~3.5x smaller than uncompressed (~480 bytes a span, most of it the span's protobuf bytes) for
# ~0.7 µs a span more in the decoder worker, and read back faster (less for SQLite to copy)
COMPRESSION = "lz4"


def _thread(value: Any) -> int | None:
    return value if type(value) is int and _I64_MIN <= value <= _I64_MAX else None


def span_frame(spans: Sequence[SpanTuple]) -> pl.DataFrame:
    """SpanTuples (all of one length) as a STORED_SCHEMA frame. Spans as the OTLP decoder makes them
    (15 fields, times and flags checked there) become columns as they are; others (a journal's
    11-field tuples, or values a column cannot hold) through `span_columns`, value by value."""
    if spans and len(spans[0]) >= SPAN_FIELDS_COLUMNS:
        cols = list(zip(*spans, strict=True))
        attrs = cols[8]
        if all(type(a) is bytes for a in attrs):
            try:
                frame = pl.DataFrame(
                    dict(zip(_FAST_ORDER, [*cols[1:8], [None] * len(spans), cols[9], cols[10], *cols[11:15], attrs],
                             strict=True)),
                    schema=STORED_SCHEMA,
                )  # fmt: skip
            except (TypeError, OverflowError, ValueError, pl.exceptions.PolarsError):
                pass  # a value of another kind: value by value below
            else:
                if frame["end"].null_count():
                    frame = frame.with_columns(pl.col("in_progress") | pl.col("end").is_null())
                return frame
    return pl.DataFrame(span_columns(spans), schema=STORED_SCHEMA)


# the fast path's columns, in SpanTuple order from the span id
_FAST_ORDER = ["span_id", "parent_id", "name", "start", "end", "in_progress", "instant", "attrs", "error", "thread",
               "phase", "module", "self_us", "launched_by", "attrs_pb"]  # fmt: skip


def span_columns(spans: Sequence[SpanTuple]) -> dict[str, Any]:
    """SpanTuples (all of one length) as STORED_SCHEMA columns (lists)."""
    if not spans:
        return {k: [] for k in STORED_SCHEMA}
    cols = list(zip(*spans, strict=True))
    attrs = cols[8]
    kinds = {type(a) for a in attrs} - {type(None)}
    if len(spans[0]) >= SPAN_FIELDS_COLUMNS:
        phase, module, self_us, launched = cols[11:15]
    else:  # read the column attributes from what is stored (journal text; bytes: tests and tools)
        values = [
            column_values(decode_attrs(a if type(a) is str else None, a if type(a) is not str else None)) for a in attrs
        ]
        phase, module, self_us, launched = zip(*values, strict=True)
    if kinds <= {bytes}:
        text, raw = [None] * len(spans), [a or None for a in attrs]
    elif kinds <= {str}:
        text, raw = [a or None for a in attrs], [None] * len(spans)
    else:
        text = [a if type(a) is str and a else None for a in attrs]
        raw = [bytes(a) if isinstance(a, (bytes, bytearray, memoryview)) and a else None for a in attrs]
    starts, ends = cols[4], cols[5]
    if any(type(t) is not int or not _I64_MIN <= t <= _I64_MAX for t in starts):
        starts = [as_int64(int(t)) for t in starts]
    if any(t is not None and (type(t) is not int or not _I64_MIN <= t <= _I64_MAX) for t in ends):
        ends = [None if t is None else as_int64(int(t)) for t in ends]
    threads = cols[10]
    if any(t is not None for t in threads):
        threads = [_thread(t) for t in threads]
    return {
        "span_id": cols[1],
        "parent_id": cols[2],
        "name": cols[3],
        "start": starts,
        "end": ends,
        "in_progress": [bool(x) or e is None for x, e in zip(cols[6], ends, strict=True)],
        "instant": [bool(x) for x in cols[7]],
        "error": cols[9],
        "thread": threads,
        "phase": phase,
        "module": module,
        "self_us": self_us,
        "launched_by": launched,
        "attrs": text,
        "attrs_pb": raw,
    }


def write_packed(frame: pl.DataFrame) -> bytes:
    """A STORED_SCHEMA frame as the store keeps it: one Arrow IPC stream."""
    buf = io.BytesIO()
    frame.write_ipc_stream(buf, compression=COMPRESSION)
    return buf.getvalue()


def pack_spans(spans: Sequence[SpanTuple]) -> bytes:
    return write_packed(span_frame(spans))


def _schema_length(body: bytes) -> int:
    """Bytes of the stream's first message (its schema: a message without a body)."""
    if len(body) < 16 or body[:4] != b"\xff\xff\xff\xff":
        raise ValueError("unreadable span batch: not an Arrow IPC stream")
    size = 8 + int.from_bytes(body[4:8], "little")
    if size > len(body) - 8 or body[-8:] != _EOS:
        raise ValueError("unreadable span batch: a damaged Arrow IPC stream")
    return size


def unpack_spans(body: bytes) -> pl.DataFrame:
    """One packed batch as a STORED_SCHEMA frame; ValueError when it cannot be read (a damaged file)."""
    _schema_length(body)
    try:
        frame = pl.read_ipc_stream(body)
    except Exception as exc:  # polars raises its own kinds for a damaged stream
        raise ValueError(f"unreadable span batch: {exc}") from None
    if frame.schema != pl.Schema(STORED_SCHEMA):
        raise ValueError("unreadable span batch: not the span columns")
    return frame


def read_packed(bodies: Sequence[bytes], rows: Sequence[int]) -> tuple[pl.DataFrame, list[int]]:
    """Packed batches (each with its stored row count) as one STORED_SCHEMA frame, in their order,
    and each batch's row count in it (0 for one that could not be read: left out). The streams'
    record batches are read as one stream (the schema once, then every batch's messages): one read
    for the whole run, not one per batch. Batches of another schema message (written by another
    polars) or a damaged one: each read on its own."""
    schema: bytes | None = None
    stream = io.BytesIO()  # written, not joined: polars reads it without another copy
    for body in bodies:
        try:
            size = _schema_length(body)
        except ValueError:
            break
        if schema is None:
            schema = body[:size]
            stream.write(schema)
        elif body[:size] != schema:
            break
        stream.write(memoryview(body)[size:-8])
    else:
        if schema is not None:
            stream.write(_EOS)
            stream.seek(0)
            try:
                frame = pl.read_ipc_stream(stream)
            except Exception:  # a damaged batch: read them one by one below
                frame = None
            if frame is not None and frame.schema == pl.Schema(STORED_SCHEMA) and frame.height == sum(rows):
                return frame, list(rows)
    frames: list[pl.DataFrame] = []
    counts: list[int] = []
    for body in bodies:
        try:
            frames.append(unpack_spans(body))
            counts.append(frames[-1].height)
        except ValueError:
            counts.append(0)
    if not frames:
        return pl.DataFrame(schema=STORED_SCHEMA), counts
    return pl.concat(frames, how="vertical_relaxed"), counts


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


def pack_by_trace(spans: list[SpanTuple]) -> list[PackedSpans]:
    """Spans (of one process) packed per trace id, in arrival order."""
    if not spans:
        return []
    trace_ids = list(dict.fromkeys([s[0] for s in spans]))
    groups = [spans] if len(trace_ids) == 1 else [[s for s in spans if s[0] == t] for t in trace_ids]
    out = []
    for trace_id, group in zip(trace_ids, groups, strict=True):
        # what the writer needs to know, from the tuples themselves (their strings exist already)
        starts = [s[4] for s in group]
        first = min(starts)
        if first < PLAUSIBLE_MIN_NS:
            first = min([t for t in starts if t >= PLAUSIBLE_MIN_NS], default=first)
        ends = [s[5] for s in group]
        last = max(max(starts), max([t for t in ends if t is not None], default=first))
        out.append(
            PackedSpans(
                trace_id,
                [s[1] for s in group],
                [s[1] for s in group if s[6] or s[5] is None],
                as_int64(first),
                as_int64(last),
                write_packed(span_frame(group)),
            )
        )
    return out


def pack_frame(trace_id: str, frame: pl.DataFrame) -> PackedSpans:
    """A STORED_SCHEMA frame of one process's spans of one trace, packed, with what the writer needs
    to know of them (as `pack_by_trace` gives for tuples): a source that has its spans as a table
    (a journal's run) hands them on with no Python object per span."""
    first, plausible, last = frame.select(
        pl.col("start").min(),
        pl.col("start").filter(pl.col("start") >= PLAUSIBLE_MIN_NS).min().alias("plausible"),
        pl.max_horizontal(pl.col("start").max(), pl.col("end").max()).alias("last"),
    ).row(0)
    if first < PLAUSIBLE_MIN_NS and plausible is not None:
        first = plausible
    return PackedSpans(
        trace_id,
        frame["span_id"].to_list(),
        frame.filter(pl.col("in_progress"))["span_id"].to_list(),
        first,
        last,
        write_packed(frame),
    )


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


__all__ = [
    "IngestBatch",
    "PackedSpans",
    "ProcessBatch",
    "RunMeta",
    "SpanTuple",
    "pack_by_trace",
    "pack_frame",
    "pack_spans",
    "read_packed",
    "span_columns",
    "unpack_spans",
    "write_packed",
]
