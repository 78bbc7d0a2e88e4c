"""The run type: one startup run, as every source produces it and everything after reads it.

A `Run` is the processes of one traced startup (one OpenTelemetry trace), each with its identity
(resource: pid, role, rank, host, clock domain, ...), and ONE table of their spans (`Run.spans`, a
polars DataFrame of SPAN_SCHEMA: Perfetto's slice table, keyed by `lane`, the process's instance
id). Sources build it (`sources.journal_reader` from a journal directory, `sources.store` from what
the service ingested over OTLP or from journals, `sources.clickhouse.runs` from `otel_traces`); analysis
and every view take only this type.

Conventions every source follows:
- times are epoch nanoseconds (int64); a span with `end` null (or `in_progress`) is still open;
- parents are resolved across processes (a child process's `process` span hangs under the span
  that launched or forked it);
- the run's root spans (`startup`) are kept apart in `root_spans` (one per node of a multi-node run,
  a few `Span` objects), each with the resource of its process (`root_owners`);
- a `process` span ends where its startup ended (its own ready, its exit, or the run's ready).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

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


def int_or_none(value: Any) -> int | None:
    """An attribute value as an int (None for a missing, bool or non-numeric value)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


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
    links: tuple[Link, ...] = ()  # the `launched_by` link (`span_of`); the table keeps it as a column

    @property
    def open(self) -> bool:
        return self.in_progress or self.end_ns is None

    @property
    def duration_ns(self) -> int | None:
        return None if self.open or self.end_ns is None else self.end_ns - self.start_ns


# The attributes the analysis reads of (nearly) every span are columns of their own, read once by
# the source; the others stay as the source holds them (`attrs`: JSON object text, or `attrs_pb`: the
# span's OTLP attribute entries, as received) and are decoded for the few rows that ask (`span_attrs`).
PHASE_KEY = "starttrace.phase"
MODULE_KEY = "starttrace.import.module"
SELF_US_KEY = "starttrace.import.self_us"
LAUNCHED_BY_KEY = "starttrace.launched_by"
COLUMN_KEYS = (PHASE_KEY, MODULE_KEY, SELF_US_KEY, LAUNCHED_BY_KEY)

SPAN_SCHEMA: dict[str, pl.DataType] = {
    "lane": pl.String(),  # the process's instance id (Process.instance_id)
    "span_id": pl.String(),
    "parent_id": pl.String(),
    "name": pl.String(),
    "start": pl.Int64(),
    "end": pl.Int64(),  # null while open
    "in_progress": pl.Boolean(),
    "instant": pl.Boolean(),
    "error": pl.String(),
    "thread": pl.Int64(),
    "phase": pl.String(),  # the `starttrace.phase` attribute (null: none; the analysis names it by the span's name)
    "module": pl.String(),  # `starttrace.import.module`
    "self_us": pl.Float64(),  # `starttrace.import.self_us`
    "launched_by": pl.String(),  # `starttrace.launched_by`: the span id of the request that made this process
    "attrs": pl.String(),  # every attribute as JSON object text (journals), else null
    "attrs_pb": pl.Binary(),  # OTLP sources: its attribute entries (a `Span` of field 9 alone), else null
}

_I64_MAX = 2**63 - 1
_I64_MIN = -(2**63)


def as_int64(t: int) -> int:
    """A time as int64 (a journal can hold any integer; a table column cannot)."""
    return _I64_MAX if t > _I64_MAX else _I64_MIN if t < _I64_MIN else t


def empty_spans() -> pl.DataFrame:
    return pl.DataFrame(schema=SPAN_SCHEMA)


def column_values(attrs: dict[str, Any]) -> tuple[str | None, str | None, float | None, str | None]:
    """The column attributes of a span's attribute dict (None where absent or of another type)."""
    phase, module, self_us, launched = (attrs.get(k) for k in COLUMN_KEYS)
    return (
        phase if isinstance(phase, str) and phase else None,
        module if isinstance(module, str) else None,
        float(self_us) if isinstance(self_us, (int, float)) and not isinstance(self_us, bool) else None,
        launched if isinstance(launched, str) and launched else None,
    )


def spans_table(spans: Iterable[tuple[str, Span]]) -> pl.DataFrame:
    """(lane, span) pairs as a span table: what a source that reads span by span (a journal) hands on."""
    cols: dict[str, list[Any]] = {k: [] for k in SPAN_SCHEMA}
    for lane, s in spans:
        attrs = s.attrs or {}
        phase, module, self_us, launched = column_values(attrs)
        cols["lane"].append(lane)
        cols["span_id"].append(s.span_id)
        cols["parent_id"].append(s.parent_id)
        cols["name"].append(s.name)
        cols["start"].append(as_int64(s.start_ns))
        cols["end"].append(None if s.end_ns is None else as_int64(s.end_ns))
        cols["in_progress"].append(bool(s.in_progress or s.end_ns is None))
        cols["instant"].append(bool(s.instant))
        cols["error"].append(s.error)
        cols["thread"].append(s.thread if isinstance(s.thread, int) and _I64_MIN <= s.thread <= _I64_MAX else None)
        cols["phase"].append(phase)
        cols["module"].append(module)
        cols["self_us"].append(self_us)
        cols["launched_by"].append(launched)
        cols["attrs"].append(json.dumps(attrs, default=str) if attrs else None)
        cols["attrs_pb"].append(None)
    return pl.DataFrame(cols, schema=SPAN_SCHEMA)


def decode_attrs(text: str | None, raw: bytes | None) -> dict[str, Any]:
    """A span's attributes from its `attrs` / `attrs_pb` cells."""
    if raw:
        from starttrace.run.otlp_attrs import span_attrs  # protobuf: imported only for OTLP rows

        return span_attrs(bytes(raw))
    if text:
        value = json.loads(text)
        return dict(value) if isinstance(value, dict) else {}
    return {}


def span_of(row: dict[str, Any]) -> Span:
    """One row of a span table (`iter_rows(named=True)`) as a `Span`, its attributes decoded: for
    the few rows a pass or an export walks one by one."""
    end = row["end"]
    return Span(
        span_id=row["span_id"],
        parent_id=row["parent_id"],
        name=row["name"],
        start_ns=row["start"],
        end_ns=end,
        attrs=decode_attrs(row.get("attrs"), row.get("attrs_pb")),
        error=row["error"],
        thread=row["thread"],
        instant=bool(row["instant"]),
        in_progress=bool(row["in_progress"]) or end is None,
        links=(Link(row["launched_by"], attrs={"starttrace.link": "launched_by"}),) if row.get("launched_by") else (),
    )


@dataclass
class Process:
    """One process of the run: one lane of the waterfall. Its spans are the run's table's rows
    with `lane == instance_id` (`Run.spans_of`)."""

    instance_id: str  # the lane key: unique per process within the run
    pid: int
    ppid: int
    journal_path: Path | None
    resource: dict[str, Any]
    process_span_id: str
    exited: bool | None = False
    exit_code: int | None = None
    warnings: list[str] = field(default_factory=list)
    preloaded: list[str] = field(default_factory=list)
    created_ns: int = 0
    activated_ns: int = 0
    alive: bool | None = None  # None: cannot tell (another host, or not from a journal)
    record: dict[str, Any] = field(default_factory=dict)  # the journal's process record, when read from one
    source: str = "journal"  # journal | otlp | clickhouse

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
    spans: pl.DataFrame = field(default_factory=empty_spans)  # every other span: SPAN_SCHEMA
    path: Path | None = None  # the journal directory, when read from one
    service: str | None = None
    source: str = "journal"  # journal | otlp | mixed | clickhouse
    version: int = 0  # the store's version of the run (changes with every ingest)
    updated_at: float | None = None  # epoch seconds of the newest ingest

    @property
    def startup(self) -> Span | None:
        return self.root_spans[0] if self.root_spans else None

    @property
    def root_process(self) -> Process | None:
        roots = [p for p in self.processes if p.resource.get("starttrace.start_method") == "root"]
        return (roots or self.processes or [None])[0]

    def spans_of(self, process: Process) -> pl.DataFrame:
        """The process's rows of the span table."""
        return self.spans.filter(pl.col("lane") == process.instance_id)

    def process_span(self, process: Process) -> Span | None:
        rows = self.spans.filter(
            (pl.col("lane") == process.instance_id) & (pl.col("span_id") == process.process_span_id)
        )
        return span_of(rows.row(0, named=True)) if process.process_span_id and rows.height else None

    def root_owners(self) -> dict[str, Process | None]:
        """The process each root span belongs to, by its span id: the one whose `process` span hangs
        under it (each node of a multi-node run has its own root span), else the run's root process."""
        ids = [s.span_id for s in self.root_spans]
        under = self.spans.filter((pl.col("name") == "process") & pl.col("parent_id").is_in(ids))
        lanes = {p.instance_id: p for p in self.processes}
        owners: dict[str, Process | None] = {}
        for lane, sid, parent in under.select("lane", "span_id", "parent_id").iter_rows():
            process = lanes.get(lane)
            if parent not in owners and process is not None and process.process_span_id == sid:
                owners[parent] = process
        root = self.root_process
        return {i: owners.get(i, root) for i in ids}

    def span_count(self) -> int:
        return len(self.root_spans) + self.spans.height
