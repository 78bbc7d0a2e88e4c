"""The store's read rule: stored span batches, one at a time and in arrival order, as each lane's
spans of the run type, every span once.

A later copy of a span is merged into the first one, where it stands (`merge_copy`). Each batch
becomes spans (`Span`, its attributes a `LazyAttrs` over the stored bytes) as it is added, and its
blob and tuples are dropped before the next: the memory they took is the next batch's. The reader
runs over a run's batches read back from the database (`Store.load_rows`), or alongside the writer
while a new run is ingested (`Store`'s live reads), so that the first model of a run that has just
been ingested needs no read at all.

A batch whose every span the writer counted as new to its trace (`span_batches.spans`, the count a
run's span total is summed from) repeats no span before it, so it is only appended; the map of each
span id's first copy is built for a trace when one of its batches repeats a span, from the batches
before it (most runs: never). The `starttrace.launched_by` links are read last (`LaneReader.lanes`),
from the spans in place then: a blob keeps each span's attribute bytes or text as they are, so it is
one search per blob, then one per span of a blob that has the key.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterable
from typing import Any

from starttrace.run import Link, Span
from starttrace.sources.batches import SpanTuple, unpack_spans
from starttrace.sources.lazy_attrs import LazyAttrs
from starttrace.sources.otlp import span_attrs

try:  # rows -> spans in C (starttrace/_modelcore.c, built at install where a C compiler is there)
    from starttrace._modelcore import spans_from_rows as c_spans_from_rows  # type: ignore[import-not-found]
except ImportError:
    c_spans_from_rows = None

LAUNCHED_BY_B = b"starttrace.launched_by"
_LAUNCHED_BY_TEXT = '"starttrace.launched_by"'

_Place = tuple[list[Any], int]  # a lane's list, an index in it


def decode_attrs(value: str | bytes | None) -> dict[str, Any]:
    """A stored `attrs` value as a dict: JSON object text, or the raw bytes of an OTLP `Span`
    (its `attributes`; the receiver stores spans as received and decodes them only here)."""
    if not value:
        return {}
    if isinstance(value, str):
        return dict(json.loads(value))
    return span_attrs(bytes(value))


def lazy_attrs(value: str | bytes | None) -> dict[str, Any]:
    """`decode_attrs`, done on first use (`sources.lazy_attrs`): loading a run decodes nothing."""
    if not value:
        return {}
    if isinstance(value, str):
        return LazyAttrs(value, decode_attrs)
    return LazyAttrs(value if isinstance(value, bytes) else bytes(value), span_attrs)


def merge_copy(old: SpanTuple, new: SpanTuple) -> SpanTuple | None:
    """A span stored already, arriving again: the span it becomes, or None when
    the stored copy stands. The new copy wins if the stored one is in progress, or if both have
    ended and they differ in end or attributes; start, `instant` and thread stay the first copy's."""
    if old[6] or (not new[6] and (old[8] != new[8] or old[5] != new[5])):
        return (old[0], old[1], new[2], new[3], old[4], new[5], new[6], old[7], new[8], new[9], old[10])
    return None


class LaneReader:
    """Batches in, in arrival order (`add`); each lane's spans out (`lanes`)."""

    def __init__(self) -> None:
        self._lanes: dict[str, list[Any]] = {}  # spans (a batch's repeats: tuples while it is added)
        self._marked: dict[tuple[int, int], _Place] = {}  # (id(lane), index): spans with the key, links unread
        self._unmapped: dict[int, list[tuple[list[Any], int, int]]] = {}  # trace -> (lane, at, n) not in _seen
        self._seen: dict[int, dict[str, _Place]] = {}  # trace -> span id -> first copy
        self.unreadable = 0  # batches that could not be decoded
        self.spans = 0  # spans held

    def add(self, lane_id: str, trace_ref: int, new_spans: int, body: bytes) -> None:
        """One stored batch (`span_batches`: its lane's id, its trace, its new-span count, its blob)."""
        try:
            rows = unpack_spans(body)
        except ValueError:
            self.unreadable += 1
            return
        linked = LAUNCHED_BY_B in body
        out = self._lanes.get(lane_id)
        if out is None:
            out = self._lanes[lane_id] = []
        keys = self._seen.get(trace_ref)
        if new_spans == len(rows):  # all new: appended (mapped only once the trace has a copy)
            at = len(out)
            spans, found = spans_of(rows, linked)
            out.extend(spans)
            self.spans += len(spans)
            for i in found:
                self._marked[id(out), at + i] = (out, at + i)
            chunk = (out, at, len(spans))
            if keys is None:
                self._unmapped.setdefault(trace_ref, []).append(chunk)
            else:
                keys.update(_first_copies([chunk]))
            return
        if keys is None:
            keys = self._seen[trace_ref] = _first_copies(self._unmapped.pop(trace_ref, ()))
        # the batch's first copies and merged copies stand as tuples in their places until the
        # batch's end (a span may come twice in one batch), then become spans in one call
        pending: dict[tuple[int, int], _Place] = {}
        for sp in rows:
            first = keys.get(sp[1])
            if first is None:
                i = len(out)
                keys[sp[1]] = (out, i)
                out.append(sp)
                pending[id(out), i] = (out, i)
                self.spans += 1
                continue
            target, i = first
            old = target[i]
            merged = merge_copy(old if type(old) is tuple else span_row(old), sp)
            if merged is not None:
                target[i] = merged
                pending[id(target), i] = (target, i)
        places = list(pending.values())
        spans, found = spans_of([target[i] for target, i in places], linked)
        for (target, i), span in zip(places, spans, strict=True):
            target[i] = span
        for j in found:
            target, i = places[j]
            self._marked[id(target), i] = (target, i)

    def lanes(self) -> dict[str, list[Span]]:
        """Each lane's spans so far, in arrival order, their `starttrace.launched_by` links read.
        The lists are the reader's own: whoever takes them owns the reader too (no more `add`)."""
        for target, i in self._marked.values():
            _launched_by_link(target[i])
        self._marked.clear()
        return self._lanes


def _first_copies(chunks: Iterable[tuple[list[Any], int, int]]) -> dict[str, _Place]:
    """Span id -> (lane, index) of the spans of these appended batches (lane, first index, count)."""
    keys: dict[str, _Place] = {}
    for out, at, n in chunks:
        ids = [s.span_id for s in out[at : at + n]]
        keys.update(zip(ids, zip(itertools.repeat(out, n), range(at, at + n), strict=True), strict=True))
    return keys


def span_row(span: Span) -> SpanTuple:
    """A span of the run type as the tuple it was stored as (its trace id None): what the merge
    rule compares, and `RunRows.spans`. Attributes not read yet are their stored bytes or text."""
    attrs = span.attrs
    raw: Any = attrs.stored() if type(attrs) is LazyAttrs else (dict(attrs) or None)
    return (
        None, span.span_id, span.parent_id, span.name, span.start_ns, span.end_ns, int(span.in_progress),
        int(span.instant), raw, span.error, span.thread,
    )  # type: ignore[return-value]  # fmt: skip


def spans_of(rows: list[SpanTuple], linked: bool) -> tuple[list[Span], list[int]]:
    """Span tuples as the run type, and the indices of those whose attributes hold the
    `starttrace.launched_by` key (looked for only when `linked`)."""
    if c_spans_from_rows is not None:  # the same loop in C (starttrace/_modelcore.c)
        return c_spans_from_rows(  # type: ignore[no-any-return]
            rows, Span, LazyAttrs, span_attrs, lazy_attrs, LAUNCHED_BY_B, _LAUNCHED_BY_TEXT, linked
        )
    spans: list[Span] = []
    found: list[int] = []
    marker, text_marker = LAUNCHED_BY_B, _LAUNCHED_BY_TEXT
    for r in rows:
        raw = r[8]
        if type(raw) is bytes and raw:
            attrs: dict[str, Any] = LazyAttrs(raw, span_attrs)
        else:
            attrs = lazy_attrs(raw)
        # no attribute lookup for most spans
        if linked and raw and (marker in raw if isinstance(raw, bytes) else text_marker in raw):
            found.append(len(spans))
        spans.append(Span(r[1], r[2], r[3], r[4], r[5], attrs, r[9], r[10], bool(r[7]), bool(r[6])))
    return spans, found


def _launched_by_link(span: Span) -> None:
    launched_by = span.attrs.get("starttrace.launched_by")
    if isinstance(launched_by, str) and launched_by:
        span.add_link(Link(launched_by, attrs={"starttrace.link": "launched_by"}))


LIVE_READ_SPANS = 1_000_000  # spans held by the readers of runs being ingested (~750 bytes each), at most


class LiveReads:
    """Readers the store's writer feeds alongside its writes, one per run it creates (a run's first
    write), each at the run version its last write made (`Store`: runs.version). The first load of
    the run at that version takes its reader (`take`): the spans are read already, while they were
    ingested. Past LIVE_READ_SPANS the oldest readers are dropped (their runs are read back from the
    database, as any run is once its reader has been taken or dropped)."""

    def __init__(self, max_spans: int = LIVE_READ_SPANS) -> None:
        self.max_spans = max_spans
        self.lock = threading.Lock()  # the writer holds it over its commit and the feed that follows
        self._runs: dict[str, tuple[LaneReader, int]] = {}  # run id -> reader, version it holds

    def begin(self, run_id: str) -> None:
        self._runs[run_id] = (LaneReader(), 0)

    def reader(self, run_id: str) -> LaneReader | None:
        entry = self._runs.get(run_id)
        return None if entry is None else entry[0]

    def committed(self, versions: dict[str, int]) -> None:
        """The writes that fed the readers are committed: each run at its new version."""
        for run_id, version in versions.items():
            entry = self._runs.get(run_id)
            if entry is not None:
                self._runs[run_id] = (entry[0], version)
        held = sum(reader.spans for reader, _ in self._runs.values())
        while held > self.max_spans and self._runs:
            oldest = next(iter(self._runs))
            held -= self._runs.pop(oldest)[0].spans

    def drop(self, run_ids: Iterable[str]) -> None:
        for run_id in run_ids:
            self._runs.pop(run_id, None)

    def clear(self) -> None:
        self._runs.clear()

    def take(self, run_id: str, version: int) -> LaneReader | None:
        """The run's reader if it holds exactly `version` (what the caller's read transaction sees);
        it is the caller's then."""
        with self.lock:
            entry = self._runs.get(run_id)
            if entry is None or entry[1] != version:
                return None
            del self._runs[run_id]
            return entry[0]

    @property
    def runs(self) -> list[str]:
        return list(self._runs)
