"""The run type: one startup run, as every source produces it and everything after reads it.

A `Run` is the processes of one traced startup (one OpenTelemetry trace), each with its identity
(resource: pid, role, rank, host, clock domain, ...) and its spans. Sources build it
(`sources.journal_reader` from a journal directory, `sources.store` from what the service
ingested over OTLP or from journals); analysis and every view take only this type.

Conventions every source follows:
- times are epoch nanoseconds; a span with `end_ns is None` (or `in_progress`) is still open;
- parents are resolved across processes (a child process's `process` span hangs under the span
  that launched or forked it);
- the run's root spans (`startup`) are kept apart in `root_spans` (one per node of a multi-node run),
  each with the resource of its process (`root_owner`);
- a `process` span ends where its startup ended (its own ready, its exit, or the run's ready).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the attributes the analysis reads of (nearly) every span
# a journal's own warnings that it ends early (a full disk): the reader's problems and the
# analysis's liveness (`lost`) both read them
JOURNAL_CUT_MARKS = ("cannot extend journal", "journal disabled")


def journal_cut(warnings: Iterable[str]) -> str | None:
    """The journal's own warning that it ends early, if any."""
    return next((w for w in warnings if any(m in w for m in JOURNAL_CUT_MARKS)), None)


# the reason a run's `problems` give for a launched child that is not Python (no journal expected;
# the text report folds these into one line)
NOT_PYTHON = "not a Python process"
HOT_KEYS = ("starttrace.phase", "starttrace.import.module", "starttrace.import.self_us")


def hot_values(attrs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """`attrs.get` of each of HOT_KEYS (None where absent). A source's own attribute mapping may
    answer them in one call, with a `hot()` method (`sources.lazy_attrs.LazyAttrs`)."""
    if type(attrs) is not dict:
        hot = getattr(attrs, "hot", None)
        if hot is not None:
            return hot()  # type: ignore[no-any-return]
    get = attrs.get
    return get(HOT_KEYS[0]), get(HOT_KEYS[1]), get(HOT_KEYS[2])


# How the model build may read HOT_KEYS straight from a span's stored protobuf bytes, in C
# (`analysis.lanes`): the attribute mapping type that keeps them in its `_raw` slot (with a `_peeked`
# dict slot), the byte patterns of the keys, and its markers for a missing key and one that cannot be
# read in place. Set by that source (`sources.lazy_attrs`); None: every span answers `hot_values`.
RAW_HOT_READER: tuple[type, tuple[bytes, ...], object, object] | None = None


def register_raw_hot_reader(mapping: type, patterns: tuple[bytes, ...], missing: object, unknown: object) -> None:
    global RAW_HOT_READER
    RAW_HOT_READER = (mapping, patterns, missing, unknown)


def int_or_none(value: Any) -> int | None:
    """An attribute value as an int (None for a missing, bool or non-numeric value)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a run or its model is built: that allocates several
    container objects per span (100k spans: ~1M objects, none of them garbage), and every
    generation-2 pass in between rescans them all (measured: +40-60 % CPU for 96k spans)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class Link:
    """A reference to a span elsewhere in the trace (e.g. the launch request of a forkserver child)."""

    span_id: str
    trace_id: str | None = None  # None: the run's trace
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)  # ~100k per run: no dict per span; the model build reads the slots (analysis.lanes)
class Span:
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int | None
    attrs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    thread: int | None = None
    instant: bool = False
    in_progress: bool = False  # still open; `end_ns` may then hold the last time it was seen
    # a tuple, shared empty by nearly every span (a list each was 72 bytes of fresh memory per span);
    # add one with `add_link`
    links: tuple[Link, ...] = ()

    @property
    def open(self) -> bool:
        return self.in_progress or self.end_ns is None

    def add_link(self, link: Link) -> None:
        self.links = (*self.links, link)

    @property
    def duration_ns(self) -> int | None:
        return None if self.open or self.end_ns is None else self.end_ns - self.start_ns


@dataclass
class Process:
    """One process of the run: one lane of the waterfall."""

    instance_id: str  # the lane key: unique per process within the run
    pid: int
    ppid: int
    journal_path: Path | None
    resource: dict[str, Any]
    process_span_id: str
    spans: list[Span]
    exited: bool | None = False
    exit_code: int | None = None
    warnings: list[str] = field(default_factory=list)
    preloaded: list[str] = field(default_factory=list)
    created_ns: int = 0
    activated_ns: int = 0
    alive: bool | None = None  # None: cannot tell (another host, or not from a journal)
    record: dict[str, Any] = field(default_factory=dict)  # the journal's process record, when read from one
    source: str = "journal"  # journal | otlp

    @property
    def role(self) -> str:
        return str(self.resource.get("starttrace.role") or "")

    @property
    def rank(self) -> int | None:
        rank = self.resource.get("starttrace.rank")
        return rank if isinstance(rank, int) and not isinstance(rank, bool) else None

    @property
    def host(self) -> str:
        return str(self.resource.get("host.name") or "")

    @property
    def clock_domain(self) -> str:
        return str(self.resource.get("starttrace.clock.domain") or self.host)

    @property
    def process_span(self) -> Span | None:
        for span in self.spans:
            if span.span_id == self.process_span_id:
                return span
        return None

    def label(self) -> str:
        """`role rank R pid P`, as every view names a lane."""
        text = self.role or "process"
        if self.rank is not None:
            text += f" rank {self.rank}"
        return f"{text} pid {self.pid}"


@dataclass
class Run:
    run_id: str
    trace_id: str
    root_span_id: str
    meta: dict[str, Any]
    processes: list[Process]
    problems: list[str]
    root_spans: list[Span]
    path: Path | None = None  # the journal directory, when read from one
    service: str | None = None
    source: str = "journal"  # journal | otlp | mixed
    version: int = 0  # the store's version of the run (changes with every ingest)
    updated_at: float | None = None  # epoch seconds of the newest ingest

    @property
    def startup(self) -> Span | None:
        return self.root_spans[0] if self.root_spans else None

    @property
    def root_process(self) -> Process | None:
        roots = [p for p in self.processes if p.resource.get("starttrace.start_method") == "root"]
        return (roots or self.processes or [None])[0]

    def root_owner(self, span: Span) -> Process | None:
        """The process a root span belongs to: the one whose `process` span hangs under it (each
        node of a multi-node run has its own root span), else the run's root process."""
        for process in self.processes:
            own = process.process_span
            if own is not None and own.parent_id == span.span_id:
                return process
        return self.root_process

    def all_spans(self) -> list[tuple[Process | None, Span]]:
        """Every span with its process; the run's root spans come first, with process None."""
        spans: list[tuple[Process | None, Span]] = [(None, s) for s in self.root_spans]
        for process in self.processes:
            spans.extend((process, s) for s in process.spans)
        return spans

    def span_count(self) -> int:
        return len(self.root_spans) + sum(len(p.spans) for p in self.processes)
