"""SQLite store for runs, processes (lanes) and spans.

One writer thread owns the write connection and drains a bounded ingest queue (OTLP requests and
journal updates both go through it); readers use one connection per thread (WAL lets them read
while the writer writes). Every SQL statement takes its values as parameters.

Spans are stored packed: one row per (lane, trace) of each ingest batch (`span_batches`), its
spans one Arrow IPC stream of the run's span columns (`sources.batches`: `run.SPAN_SCHEMA` but the
lane), in arrival order. A row per span made SQLite's insert the bound of ingest
(docs/benchmarks.md); one row per batch leaves it a blob write. A run is read back as one table:
its batches' streams read as one, the lane a column from the batch rows (`load_rows`); the newest
batches the writer committed it also keeps as tables (`_FreshBatches`), so a run read right after
its ingest reads no blob back.

A span is unique by (trace_id, lane, span_id): the same span arriving twice (twice the same OTLP
batch, or through the journal and through an exporter: both name the process by its instance id)
is one span of the run; two processes that reuse a span id keep two spans (the model names them).
A span still in progress is replaced when it arrives again; an ended span is replaced only by an ended copy that differs
(end or attributes), and never by an in-progress copy of itself. The writer knows each trace's
stored span ids in memory (`_SpanKeys`, read back from the trace's batches when a trace is first
touched after a start), counts only new spans (`span_batches.spans`: a run's span count is their
sum) and drops a copy that could never win; the reader applies the rule (`merge_copies`, a table
operation, only when a batch repeats spans) keeping each span at its first position.

Schema version (`PRAGMA user_version`): 5. A version-4 file (batches as `marshal` blobs of tuples)
is converted in place when opened (`upgrade_marshal_batches`: each blob rewritten as columns, its
column attributes read once); a version-3 or version-2 file (one row per span in `spans`) is
upgraded in place (its rows packed into batches, `spans` dropped); an older file (spans without
`lane`) is refused with `SchemaError`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import operator
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from starttrace.run import SPAN_SCHEMA, Process, Run, Span, decode_attrs, int_or_none, span_of
from starttrace.sources.batches import (
    IngestBatch,
    PackedSpans,
    ProcessBatch,
    SpanTuple,
    pack_spans,
    read_packed,
    unpack_spans,
    write_packed,
)
from starttrace.sources.plausible import drop_implausible

__all__ = [
    "IngestBatch",
    "ProcessBatch",
    "RunRows",
    "SchemaError",
    "SpanTuple",
    "Store",
    "decode_attrs",
    "merge_copies",
    "run_from_rows",
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    trace_id TEXT,
    service TEXT,
    source TEXT,
    first_ns INTEGER,
    last_ns INTEGER,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    version INTEGER NOT NULL DEFAULT 0,
    meta TEXT
);
CREATE INDEX IF NOT EXISTS runs_trace ON runs(trace_id);
CREATE INDEX IF NOT EXISTS runs_first ON runs(first_ns);
CREATE TABLE IF NOT EXISTS processes (
    run_id TEXT NOT NULL,
    lane_id TEXT NOT NULL,
    pid INTEGER,
    ppid INTEGER,
    service TEXT,
    role TEXT,
    rank INTEGER,
    start_method TEXT,
    resource TEXT,
    source TEXT,
    exited INTEGER,
    exit_code INTEGER,
    warnings TEXT,
    preloaded TEXT,
    journal_path TEXT,
    PRIMARY KEY (run_id, lane_id)
);
CREATE TABLE IF NOT EXISTS traces (
    id INTEGER PRIMARY KEY,
    trace_id TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS lanes (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    lane_id TEXT NOT NULL,
    source TEXT NOT NULL,
    UNIQUE (run_id, lane_id, source)
);
CREATE TABLE IF NOT EXISTS span_batches (
    seq INTEGER PRIMARY KEY,  -- arrival order
    lane INTEGER NOT NULL,  -- lanes.id: (run_id, lane_id, source) of the process that sent them
    trace INTEGER NOT NULL,  -- traces.id
    spans INTEGER NOT NULL,  -- how many of them were not stored before (a run's span count: the sum)
    body BLOB NOT NULL,  -- sources.batches.write_packed: an Arrow IPC stream of the span columns
    rows INTEGER NOT NULL DEFAULT 0  -- the spans in body (new or not)
);
CREATE INDEX IF NOT EXISTS span_batches_lane ON span_batches(lane);
CREATE INDEX IF NOT EXISTS span_batches_trace ON span_batches(trace);
CREATE TABLE IF NOT EXISTS problems (
    run_id TEXT NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (run_id, message)
);
CREATE TABLE IF NOT EXISTS views (
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    version INTEGER NOT NULL,  -- runs.version it was rendered from
    body BLOB NOT NULL,
    PRIMARY KEY (run_id, kind)
);
"""


@dataclass
class RunRows:
    """Everything stored about one run, as read back for analysis."""

    run_id: str
    trace_id: str | None
    service: str | None
    source: str | None
    version: int
    updated_at: float
    meta: dict[str, Any]
    problems: list[str]
    processes: list[dict[str, Any]]
    # every span of the run once (`merge_copies`), in arrival order: run.SPAN_SCHEMA
    spans: pl.DataFrame
    unreadable: int = 0  # stored batches that could not be decoded (reported as a problem of the run)


SCHEMA_VERSION = 5
# span ids the writer keeps in memory (`_SpanKeys`); past this, the least recently written traces
# are forgotten (and read back from the store if they are written again)
MAX_KEPT_KEYS = 2_000_000  # ~100 bytes each: ~200 MB at most (the model cache holds up to 2M spans too)
# spans per packed row when a version-3 file is upgraded
UPGRADE_BATCH_SPANS = 4096

_RUN_LANES = "SELECT id FROM lanes WHERE run_id = ?"
_RUN_LANE_IDS = "SELECT id, lane_id FROM lanes WHERE run_id = ?"
# in the lane index's order, sorted by seq in Python: an ORDER BY here copied every blob into a
# temporary B-tree (four copies of the run's bytes)
_RUN_BATCHES = (
    "SELECT seq, lane, trace, spans, rows FROM span_batches WHERE lane IN (SELECT id FROM lanes WHERE run_id = ?)"
)
_RUN_BODIES = (  # the bodies of a run's batches up to a seq (those `_FreshBatches` no longer holds)
    "SELECT seq, body FROM span_batches WHERE seq <= ? AND lane IN (SELECT id FROM lanes WHERE run_id = ?)"
)
_SEQ = operator.itemgetter(0)
_BATCH_INSERT = "INSERT INTO span_batches(lane, trace, spans, body, rows) VALUES (?, ?, ?, ?, ?)"


# the newest batches the writer stored, kept as columns (`_FreshBatches`): ~250 bytes a span
FRESH_SPANS = 500_000
FRESH_READ_SPANS = 10_000  # their streams read in one call per this many spans (or by a reader)


class _FreshBatches:
    """The newest stored batches as columns (seq -> table), so that a run read right after its
    ingest reads no blob back (the first answer after a bulk ingest). The writer hands each
    committed batch over as it stored it; their streams are read in one call per FRESH_READ_SPANS
    spans, or by the first reader that wants them. The oldest go first past `max_spans`. SQLite may
    give a deleted batch's seq to a new one: a delete empties it, and a table is taken only for a
    batch row of its trace and row count (another process may write the file too)."""

    def __init__(self, max_spans: int, errors: list[str]) -> None:
        self.max_spans = max_spans
        self.errors = errors  # the store's: a failure is reported once, and the blobs read instead
        self._frames: dict[int, tuple[int, pl.DataFrame]] = {}  # seq -> (trace, its spans)
        self._spans = 0
        self._unread: list[tuple[int, int, bytes, int]] = []  # (seq, trace, body, rows), not read yet
        self._unread_spans = 0
        self._lock = threading.Lock()

    def add(self, seqs: list[int], batches: list[tuple[int, int, int, bytes, int]]) -> None:
        """Batch rows (lane, trace, new spans, body, rows) the writer committed, with their seqs."""
        with self._lock:
            self._unread.extend((seq, b[1], b[3], b[4]) for seq, b in zip(seqs, batches, strict=True))
            self._unread_spans += sum(b[4] for b in batches)
            if self._unread_spans >= FRESH_READ_SPANS:
                self._read()

    def _read(self) -> None:
        unread, self._unread, self._unread_spans = self._unread, [], 0
        if not unread or not self.max_spans:
            return
        try:
            frame, counts = read_packed([u[2] for u in unread], [u[3] for u in unread])
        except Exception as exc:  # only a shortcut: these are read from their blobs
            if not any(e.startswith("fresh batches") for e in self.errors):
                self.errors.append(f"fresh batches not kept: {type(exc).__name__}: {exc}")
            return
        offset = 0
        for (seq, trace, _, _), n in zip(unread, counts, strict=True):
            if n:
                replaced = self._frames.pop(seq, None)  # a seq another writer reused
                self._spans += n - (replaced[1].height if replaced else 0)
                self._frames[seq] = (trace, frame.slice(offset, n))
                offset += n
        while self._spans > self.max_spans and self._frames:
            self._spans -= self._frames.pop(next(iter(self._frames)))[1].height

    def get(self, batches: Iterable[tuple[Any, ...]]) -> dict[int, pl.DataFrame]:
        """The tables of batch rows (seq, lane, trace, new spans, rows) it holds, by seq."""
        with self._lock:
            self._read()
            return {
                b[0]: got[1]
                for b in batches
                if (got := self._frames.get(b[0])) is not None and got[0] == b[2] and got[1].height == b[4]
            }

    def clear(self) -> None:
        with self._lock:
            self._frames.clear()
            self._unread.clear()
            self._spans = self._unread_spans = 0


class SchemaError(RuntimeError):
    """The database file was written by an older, incompatible version of the store."""


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not done so itself: on SQLITE_FULL it may have,
    and a ROLLBACK then fails with "no transaction is active", hiding the error that matters."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def write_error_text(exc: BaseException, path: str = "") -> str:
    """What a failed store write says (/healthz, 503 answers): a full disk says "disk full"."""
    text = f"{type(exc).__name__}: {exc}"
    code = getattr(exc, "sqlite_errorcode", None)
    if code == getattr(sqlite3, "SQLITE_FULL", 13) or getattr(exc, "errno", None) == errno.ENOSPC:
        where = f" where the store is ({path})" if path and path != ":memory:" else ""
        return f"disk full: no space left{where} ({text})"
    return text


# WAL checkpoints (see Store.__init__): after this many seconds without ingest, or this many spans
CHECKPOINT_IDLE_S = 0.5
CHECKPOINT_SPANS = 500_000
READER_CACHE_KIB = 8192  # each reader connection's SQLite page cache (the writer's: 128 MB)


class _SpanKeys:
    """The writer's map of stored spans: per run and trace (traces.id), (lane, span id) -> 1 while the
    span's stored copy is in progress, 0 once it has ended. Per run: a span sent under two run ids
    (two runs sharing a trace) is a span of each, counted once in each, as each run's model holds
    it. A (run, trace) not in memory is read back from its batches on first use; the least
    recently written are forgotten past MAX_KEPT_KEYS ids."""

    def __init__(self) -> None:
        # insertion order: least recently written first
        self._by_trace: dict[tuple[str, int], dict[str, int]] = {}
        self._count = 0

    def reset(self) -> None:
        """Forget everything (after a rollback, a delete, a run moved)."""
        self._by_trace.clear()
        self._count = 0

    def of(self, conn: sqlite3.Connection, run_id: str, trace: int) -> dict[tuple[int, str], int]:
        keys = self._by_trace.pop((run_id, trace), None)
        if keys is None:
            keys = {}
            rows = conn.execute(
                "SELECT lane, body FROM span_batches"
                " WHERE trace = ? AND lane IN (SELECT id FROM lanes WHERE run_id = ?) ORDER BY seq",
                (trace, run_id),
            )
            for lane, body in rows:
                try:
                    frame = unpack_spans(body)
                except ValueError:
                    continue  # the reader reports it
                for sid, is_open in zip(frame["span_id"].to_list(), frame["in_progress"].to_list(), strict=True):
                    keys[(lane, sid)] = int(is_open) if keys.get((lane, sid), 1) else 0
            self._count += len(keys)
        self._by_trace[(run_id, trace)] = keys  # now the most recently written
        return keys

    def trim(self) -> None:
        while self._count > MAX_KEPT_KEYS and len(self._by_trace) > 1:
            oldest = next(iter(self._by_trace))
            self._count -= len(self._by_trace.pop(oldest))

    def added(self, n: int) -> None:
        self._count += n


def span_cols_of(conn: sqlite3.Connection) -> set[str]:
    """The columns of a version-2/3 `spans` table (one row per span); empty when there is none."""
    return {r[1] for r in conn.execute("PRAGMA table_info(spans)")}


def upgrade_span_rows(conn: sqlite3.Connection) -> None:
    """Pack a version-2/3 file's span rows into batches (per lane and trace, in their arrival order,
    UPGRADE_BATCH_SPANS spans each; those files stored every span once), then drop `spans`. One
    transaction: an interrupted upgrade leaves the old file as it was."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        chunks: dict[tuple[int, int], list[SpanTuple]] = {}

        def flush(key: tuple[int, int]) -> None:
            spans = chunks.pop(key)
            conn.execute(_BATCH_INSERT, (key[0], key[1], len(spans), pack_spans(spans), len(spans)))

        rows = conn.execute(
            "SELECT s.lane, s.trace, t.trace_id, s.span_id, s.parent_id, s.name, s.start_ns, s.end_ns, s.in_progress,"
            " s.instant, s.attrs, s.error, s.thread FROM spans s JOIN traces t ON t.id = s.trace ORDER BY s.seq"
        )
        for row in rows:  # streamed: a large file is not read into memory at once
            key = (int(row[0]), int(row[1]))
            chunk = chunks.setdefault(key, [])
            attrs = row[10]
            chunk.append((*row[2:10], bytes(attrs) if isinstance(attrs, memoryview) else attrs, *row[11:]))
            if len(chunk) >= UPGRADE_BATCH_SPANS:
                flush(key)
        for key in list(chunks):
            flush(key)
        conn.execute("DROP TABLE spans")
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def batch_cols_of(conn: sqlite3.Connection) -> set[str]:
    return {r[1] for r in conn.execute("PRAGMA table_info(span_batches)")}


def _marshal_spans(body: bytes) -> list[SpanTuple]:
    """A version-4 batch: a `marshal` blob of 11-field span tuples (ValueError: not one)."""
    import marshal

    try:
        spans = marshal.loads(body)
    except (EOFError, TypeError, ValueError) as exc:
        raise ValueError(f"unreadable span batch: {exc}") from None
    if type(spans) is not list or any(type(s) is not tuple or len(s) != 11 for s in spans):
        raise ValueError("unreadable span batch: not a list of span tuples")
    return spans


def upgrade_marshal_batches(conn: sqlite3.Connection) -> int:
    """Rewrite a version-4 file's batches (`marshal` blobs of span tuples) as span columns, each
    span's column attributes read once from its stored attributes (`pack_spans`), and count their
    rows; a blob that cannot be read is left as it is (the reader reports it). One transaction: an
    interrupted upgrade leaves the old file as it was. Returns the batches rewritten."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("ALTER TABLE span_batches ADD COLUMN rows INTEGER NOT NULL DEFAULT 0")
        done = 0
        seqs = [int(r[0]) for r in conn.execute("SELECT seq FROM span_batches ORDER BY seq")]
        for seq in seqs:  # one blob at a time: a large file is not read into memory at once
            (body,) = conn.execute("SELECT body FROM span_batches WHERE seq = ?", (seq,)).fetchone()
            try:
                spans = _marshal_spans(body)
            except ValueError:
                continue
            conn.execute(
                "UPDATE span_batches SET body = ?, rows = ? WHERE seq = ?", (pack_spans(spans), len(spans), seq)
            )
            done += 1
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
    return done


def _acknowledge(batches: list[IngestBatch]) -> None:
    """Tell each batch's sender that its transaction committed (each told once: `on_written` is
    cleared, so a later failure of the same write is not reported for it)."""
    for b in batches:
        callback, b.on_written = b.on_written, None
        if callback is not None:
            with contextlib.suppress(Exception):
                callback(None)


class StoreSaturated(Exception):
    """The ingest queue is full: the client should retry later."""


class Store:
    def __init__(
        self,
        path: Path | str,
        queue_max_spans: int = 400_000,
        on_stored: Callable[[str, int], None] | None = None,
        on_runs_written: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.queue_max_spans = queue_max_spans
        self.on_stored = on_stored
        self._iid_owners: dict[tuple[str, str], tuple[str, int | None]] = {}  # see _instance_lane
        self.on_runs_written = on_runs_written  # after each committed write, with the run ids it touched
        self._queue: queue.Queue[IngestBatch | None] = queue.Queue()
        self._queued_spans = 0
        self.peak_queued_spans = 0  # the most spans the ingest queue held at once (/healthz)
        self._queued_lock = threading.Lock()
        self.write_lock = threading.Lock()  # held by the writer while it writes (tests hold it to stall it)
        self._local = threading.local()
        self._trace_runs: dict[str, str] = {}
        self._lane_ids: dict[tuple[str, str, str], int] = {}  # (run_id, lane_id, source) -> lanes.id
        self._trace_ids: dict[str, int] = {}  # trace id -> traces.id
        if self.path != ":memory:" and Path(self.path).exists():
            # check before _connect() switches the file to WAL: a refused file stays untouched
            with contextlib.closing(sqlite3.connect(self.path)) as probe:
                span_cols = span_cols_of(probe)
            if span_cols and "lane" not in span_cols:
                raise SchemaError(
                    f"{self.path}: database written by an older starttrace service (spans table without"
                    " lanes); it is not migrated: delete the file or choose another --db"
                )
        self._writer_conn = self._connect()
        old_batches = batch_cols_of(self._writer_conn)
        self._writer_conn.executescript(SCHEMA)
        if old_batches and "rows" not in old_batches:
            upgrade_marshal_batches(self._writer_conn)  # schema 4: marshal blobs of tuples
        if span_cols_of(self._writer_conn):
            upgrade_span_rows(self._writer_conn)  # schema 2 or 3: one row per span
        self._writer_conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._span_keys = _SpanKeys()
        # The writer checkpoints the WAL itself: when ingest goes idle, else every
        # CHECKPOINT_SPANS spans (SQLite's automatic checkpoint would copy pages to the database
        # file, and fsync it, in the middle of a burst, on the writer's critical path).
        self._writer_conn.execute("PRAGMA wal_autocheckpoint=0")
        self._unchecked_spans = 0
        self._deferring = 0  # Store.deferring_checkpoints
        for trace_id, run_id in self._writer_conn.execute("SELECT trace_id, run_id FROM runs"):
            if trace_id:
                self._trace_runs.setdefault(trace_id, run_id)
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self._fresh = _FreshBatches(FRESH_SPANS, self.errors)

    # connections ---------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA cache_size=-131072")
        conn.execute("PRAGMA wal_autocheckpoint=8192")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            # a reader's page cache, small: it reads a run's batches once, in one pass (its blobs
            # then live in the model); a 128 MB cache only held a second copy of a large run's
            # bytes, in fresh memory, and its page faults cost more than reading the pages again
            conn.execute(f"PRAGMA cache_size=-{READER_CACHE_KIB}")
            self._local.conn = conn
        return conn

    # lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run_writer, name="starttrace-store-writer", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Drain the queue, then stop the writer thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None

    def close(self) -> None:
        self.stop()
        self._writer_conn.close()

    # ingest --------------------------------------------------------------------------------
    @property
    def queued_spans(self) -> int:
        return self._queued_spans

    def submit(self, batch: IngestBatch, block: bool = False) -> None:
        """Queue a batch for the writer. Raises StoreSaturated when the queue is full (unless
        `block`, used by the journal watcher, which may simply wait). A batch larger than the whole
        queue is accepted when the queue is empty, so no request is refused forever."""
        n = batch.span_count()
        while True:
            with self._queued_lock:
                if self._queued_spans == 0 or self._queued_spans + n <= self.queue_max_spans:
                    self._queued_spans += n
                    self.peak_queued_spans = max(self.peak_queued_spans, self._queued_spans)
                    break
            if not block:
                raise StoreSaturated()
            time.sleep(0.05)
        if self._thread is None:  # no writer thread (tests, one-shot use): write synchronously
            try:
                self._write_batches([batch])
            except Exception as exc:
                if batch.on_written is None:
                    raise
                batch.on_written(write_error_text(exc, self.path))
                return
            if batch.on_written is not None:
                batch.on_written(None)
            return
        self._queue.put(batch)

    def ingest_now(self, batch: IngestBatch) -> None:
        """Write a batch synchronously (tests, CLI)."""
        with self._queued_lock:
            self._queued_spans += batch.span_count()
        self._write_batches([batch])

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything queued so far is written."""
        if self._thread is None:
            return True
        event = threading.Event()
        self._queue.put(IngestBatch(processes=[], done=event))
        return event.wait(timeout)

    @contextlib.contextmanager
    def deferring_checkpoints(self) -> Iterator[None]:
        """While a run is loaded and its model built for someone waiting, the writer's idle WAL
        checkpoint waits: it copied a whole ingest's pages (~100 MB for a 64-rank run) next to the
        first request. A checkpoint forced by the WAL's size (CHECKPOINT_SPANS) still runs."""
        with self._queued_lock:
            self._deferring += 1
        try:
            yield
        finally:
            with self._queued_lock:
                self._deferring -= 1

    def _checkpoint(self) -> None:
        self._unchecked_spans = 0
        try:
            with self.write_lock:
                self._writer_conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:
            self.errors.append(f"checkpoint: {type(exc).__name__}: {exc}")
            del self.errors[:-20]

    def _run_writer(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=CHECKPOINT_IDLE_S if self._unchecked_spans else None)
            except queue.Empty:
                if not self._deferring:  # idle: nothing queued for a while, and no model being built
                    self._checkpoint()
                continue
            batches: list[IngestBatch] = []
            stop = item is None
            if item is not None:
                batches.append(item)
            # coalesce what is already waiting into one transaction
            while not stop and len(batches) < 256:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                else:
                    batches.append(nxt)
            if batches:
                failed: str | None = None
                try:
                    self._write_batches(batches)
                except Exception as exc:  # keep the writer alive; report through /healthz
                    failed = write_error_text(exc, self.path)
                    self.errors.append(failed)
                    del self.errors[:-20]
                    with self._queued_lock:
                        self._queued_spans = max(0, self._queued_spans - sum(b.span_count() for b in batches))
                for b in batches:
                    if b.on_written is not None:
                        with contextlib.suppress(Exception):
                            b.on_written(failed)
                    if b.done is not None:
                        b.done.set()
            if stop:
                return
            if self._unchecked_spans >= CHECKPOINT_SPANS:
                self._checkpoint()

    def _resolve_run(self, conn: sqlite3.Connection, run_id: str, trace_id: str | None) -> None:
        """Remember trace -> run, and merge a run that was filed under the bare trace id."""
        if not trace_id:
            return
        known = self._trace_runs.get(trace_id)
        if known == run_id:
            return
        if known is None:
            self._trace_runs[trace_id] = run_id
            return
        if known == trace_id and run_id != trace_id:
            # spans without starttrace.run_id (e.g. vLLM's own) arrived first: move them over
            # each lane of the old run becomes (or, if the new run has it already, joins) the same
            # lane of the new run; lane ids are kept where possible (rows of this transaction use them)
            self._lane_ids.clear()
            self._iid_owners.clear()
            conn.execute("UPDATE OR IGNORE lanes SET run_id = ? WHERE run_id = ?", (run_id, known))
            for old_id, lane_id, source in conn.execute(
                "SELECT id, lane_id, source FROM lanes WHERE run_id = ?", (known,)
            ).fetchall():
                new_id = self._lane_ref(conn, run_id, lane_id, source)
                conn.execute("UPDATE span_batches SET lane = ? WHERE lane = ?", (new_id, old_id))
            conn.execute("DELETE FROM lanes WHERE run_id = ?", (known,))
            conn.execute("UPDATE OR IGNORE processes SET run_id = ? WHERE run_id = ?", (run_id, known))
            conn.execute("DELETE FROM processes WHERE run_id = ?", (known,))
            conn.execute("DELETE FROM runs WHERE run_id = ?", (known,))
            self._trace_runs[trace_id] = run_id
            self._span_keys.reset()  # the moved batches' spans are the new run's now

    def _write_batches(self, batches: list[IngestBatch]) -> None:
        # Long by design: one SQLite transaction: everything inside it must commit or roll back together.
        conn = self._writer_conn
        now = time.time()
        stored: dict[str, int] = {}
        touched: dict[str, list[Any]] = {}  # run_id -> [trace_id, service, source, first, last]
        pending: list[tuple[int, int, int, bytes, int]] = []  # span_batches rows (lane, trace, new spans, body, rows)
        with self.write_lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for batch in batches:
                    for meta in batch.runs:
                        self._resolve_run(conn, meta.run_id, meta.trace_id)
                        conn.execute(
                            "INSERT INTO runs(run_id, trace_id, service, source, created_at, updated_at, meta)"
                            " VALUES (?,?,?,?,?,?,?) ON CONFLICT(run_id) DO UPDATE SET"
                            " trace_id = COALESCE(runs.trace_id, excluded.trace_id),"
                            " service = COALESCE(excluded.service, runs.service),"
                            " meta = excluded.meta, updated_at = excluded.updated_at",
                            (meta.run_id, meta.trace_id, meta.service, "journal", now, now, json.dumps(meta.meta)),
                        )
                        if batch.replace_problems:
                            conn.execute("DELETE FROM problems WHERE run_id = ?", (meta.run_id,))
                        conn.executemany(
                            "INSERT OR IGNORE INTO problems(run_id, message) VALUES (?, ?)",
                            [(meta.run_id, p) for p in meta.problems],
                        )
                        touched.setdefault(meta.run_id, [meta.trace_id, meta.service, "journal", None, None])
                    for proc in batch.processes:
                        self._write_process(conn, proc, touched, stored, pending)
                seqs = [conn.execute(_BATCH_INSERT, row).lastrowid for row in pending]
                self._span_keys.trim()
                for run_id, (trace_id, service, source, first, last) in touched.items():
                    conn.execute(
                        "INSERT INTO runs(run_id, trace_id, service, source, first_ns, last_ns, created_at,"
                        " updated_at, version) VALUES (?,?,?,?,?,?,?,?,1) ON CONFLICT(run_id) DO UPDATE SET"
                        " trace_id = COALESCE(runs.trace_id, excluded.trace_id),"
                        " service = COALESCE(runs.service, excluded.service),"
                        " source = CASE WHEN runs.source IS NULL OR runs.source = excluded.source"
                        "   THEN excluded.source ELSE 'mixed' END,"
                        " first_ns = MIN(COALESCE(runs.first_ns, excluded.first_ns),"
                        "   COALESCE(excluded.first_ns, runs.first_ns)),"
                        " last_ns = MAX(COALESCE(runs.last_ns, excluded.last_ns),"
                        "   COALESCE(excluded.last_ns, runs.last_ns)),"
                        " updated_at = excluded.updated_at, version = runs.version + 1",
                        (run_id, trace_id, service, source, first, last, now, now),
                    )
                conn.execute("COMMIT")
                _acknowledge(batches)  # on disk now: the receiver answers while the rest goes on
            except BaseException:
                _rollback(conn)
                self._lane_ids.clear()  # ids created by the rolled-back transaction
                self._iid_owners.clear()
                self._trace_ids.clear()
                self._span_keys.reset()
                raise
            finally:
                with self._queued_lock:
                    self._queued_spans = max(0, self._queued_spans - sum(b.span_count() for b in batches))
            # committed: outside the rollback, under the write lock (no delete comes in between)
            self._fresh.add(seqs, pending)
        self._unchecked_spans += sum(stored.values()) + 1
        if self._thread is None and self._unchecked_spans >= CHECKPOINT_SPANS:
            self._checkpoint()  # no writer thread (synchronous use): checkpoint here
        if self.on_stored is not None:
            for source, n in stored.items():
                self.on_stored(source, n)
        if self.on_runs_written is not None and touched:
            self.on_runs_written(list(touched))

    def _lane_ref(self, conn: sqlite3.Connection, run_id: str, lane_id: str, source: str) -> int:
        """lanes.id of (run_id, lane_id, source), created if new (inside the writer's transaction)."""
        key = (run_id, lane_id, source)
        ref = self._lane_ids.get(key)
        if ref is None:
            conn.execute("INSERT OR IGNORE INTO lanes(run_id, lane_id, source) VALUES (?, ?, ?)", key)
            row = conn.execute("SELECT id FROM lanes WHERE run_id = ? AND lane_id = ? AND source = ?", key).fetchone()
            ref = self._lane_ids[key] = int(row[0])
        return ref

    def _trace_ref(self, conn: sqlite3.Connection, trace_id: str) -> int:
        """traces.id of a trace id, created if new (inside the writer's transaction)."""
        ref = self._trace_ids.get(trace_id)
        if ref is None:
            conn.execute("INSERT OR IGNORE INTO traces(trace_id) VALUES (?)", (trace_id,))
            row = conn.execute("SELECT id FROM traces WHERE trace_id = ?", (trace_id,)).fetchone()
            ref = self._trace_ids[trace_id] = int(row[0])
        return ref

    def _lane_for(self, conn: sqlite3.Connection, run_id: str, proc: ProcessBatch) -> str:
        if proc.lane_id:
            return proc.lane_id
        res = proc.resource
        iid = res.get("service.instance.id")
        pid = int_or_none(res.get("process.pid"))
        if iid not in (None, ""):
            return self._instance_lane(conn, run_id, str(iid), str(res.get("host.name") or ""), pid)
        if pid is not None:
            row = conn.execute(
                "SELECT lane_id FROM processes WHERE run_id = ? AND pid = ? LIMIT 1", (run_id, pid)
            ).fetchone()
            return str(row[0]) if row else f"pid:{pid}"
        return "service:" + str(res.get("service.name") or "unknown")

    def _instance_lane(self, conn: sqlite3.Connection, run_id: str, iid: str, host: str, pid: int | None) -> str:
        """The lane of a process is (`service.instance.id`, host, pid): the OpenTelemetry SDK draws
        one instance id per interpreter and fork children inherit it (gunicorn or Celery prefork
        workers), so the first process seen with an instance id keeps it as its lane id and every
        other process with the same instance id gets `iid/host/pid`."""
        key = (run_id, iid)
        owner = self._iid_owners.get(key)
        if owner is None:
            row = conn.execute(
                "SELECT pid, resource FROM processes WHERE run_id = ? AND lane_id = ?", (run_id, iid)
            ).fetchone()
            if row is None:
                owner = (host, pid)
            else:
                stored = json.loads(row[1]) if row[1] else {}
                owner = (str(stored.get("host.name") or ""), int_or_none(row[0]))
            self._iid_owners[key] = owner
        if owner == (host, pid) or pid is None or owner[1] is None:
            return iid
        return f"{iid}/{host}/{pid}"

    def _write_process(
        self,
        conn: sqlite3.Connection,
        proc: ProcessBatch,
        touched: dict[str, list[Any]],
        stored: dict[str, int],
        pending: list[tuple[int, int, int, bytes, int]],
    ) -> None:
        # Long by design: one process's rows inside the writer's transaction; the long part is one SQL upsert statement
        # and its parameters.
        res = proc.resource
        # group the spans by run: the resource's run id, else the run that owns the trace id
        groups = proc.packed_spans()
        by_run: dict[str, list[PackedSpans]] = {}
        fixed = proc.run_id or res.get("starttrace.run_id")
        if fixed:
            fixed = str(fixed)
            for g in groups:
                self._resolve_run(conn, fixed, g.trace_id)
            by_run[fixed] = groups
        else:
            for g in groups:
                rid = self._trace_runs.get(g.trace_id)
                if rid is None:
                    rid = self._trace_runs[g.trace_id] = g.trace_id
                by_run.setdefault(rid, []).append(g)
        if not by_run and fixed is None:
            return
        if not by_run and fixed:
            by_run[fixed] = []
        service = res.get("service.name")
        info = proc.info
        for run_id, run_groups in by_run.items():
            lane = self._lane_for(conn, run_id, proc)
            conn.execute(
                "INSERT INTO processes(run_id, lane_id, pid, ppid, service, role, rank, start_method, resource,"
                " source, exited, exit_code, warnings, preloaded, journal_path) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT(run_id, lane_id) DO UPDATE SET"
                " pid = COALESCE(excluded.pid, processes.pid), ppid = COALESCE(excluded.ppid, processes.ppid),"
                " service = COALESCE(excluded.service, processes.service),"
                " role = COALESCE(excluded.role, processes.role), rank = COALESCE(excluded.rank, processes.rank),"
                " start_method = COALESCE(excluded.start_method, processes.start_method),"
                " resource = excluded.resource,"
                " exited = COALESCE(excluded.exited, processes.exited),"
                " exit_code = COALESCE(excluded.exit_code, processes.exit_code),"
                " warnings = COALESCE(excluded.warnings, processes.warnings),"
                " preloaded = COALESCE(excluded.preloaded, processes.preloaded),"
                " journal_path = COALESCE(excluded.journal_path, processes.journal_path)",
                (
                    run_id,
                    lane,
                    int_or_none(res.get("process.pid")),
                    int_or_none(res.get("process.parent_pid")),
                    service,
                    res.get("starttrace.role"),
                    int_or_none(res.get("starttrace.rank")),
                    res.get("starttrace.start_method"),
                    json.dumps(res, default=str),
                    proc.source,
                    None if info.get("exited") is None else int(bool(info.get("exited"))),
                    int_or_none(info.get("exit_code")),
                    json.dumps(info["warnings"]) if info.get("warnings") else None,
                    json.dumps(info["preloaded"]) if info.get("preloaded") else None,
                    info.get("journal_path"),
                ),
            )
            n = 0
            if run_groups:
                lane_ref = self._lane_ref(conn, run_id, lane, proc.source)
                for g in run_groups:
                    self._span_batch(conn, g, lane_ref, pending, run_id)
                    n += len(g.span_ids)
                first: int | None = min(g.first_ns for g in run_groups)
                last: int | None = max(g.last_ns for g in run_groups)
            else:
                first = last = None
            t = touched.get(run_id)
            trace_id = run_groups[0].trace_id if run_groups else None
            if t is None:
                touched[run_id] = [trace_id, service, proc.source, first, last]
            else:
                t[0] = t[0] or trace_id
                t[1] = t[1] or service
                if first is not None:
                    t[3] = first if t[3] is None else min(t[3], first)
                    t[4] = last if t[4] is None else max(t[4], last)
            stored[proc.source] = stored.get(proc.source, 0) + n

    def _span_batch(
        self,
        conn: sqlite3.Connection,
        g: PackedSpans,
        lane_ref: int,
        pending: list[tuple[int, int, int, bytes, int]],
        run_id: str,
    ) -> None:
        """One process's spans of one trace as a packed row. A span stored already goes in again
        for the reader's rule (`merge_copies`), unless it is an in-progress copy of a span that has
        ended (that copy never wins); it is not counted again. Spans all new (the common case) are
        noted with no Python loop per span, the body stored as it came."""
        trace = self._trace_ids.get(g.trace_id)
        if trace is None:
            trace = self._trace_ref(conn, g.trace_id)
        keys = self._span_keys.of(conn, run_id, trace)
        ids = dict.fromkeys(((lane_ref, sid) for sid in g.span_ids), 0)
        if len(ids) == len(g.span_ids) and keys.keys().isdisjoint(ids):
            if g.open_ids:
                ids.update(dict.fromkeys(((lane_ref, sid) for sid in g.open_ids), 1))
            keys.update(ids)
            added, body, rows = len(ids), g.body, len(g.span_ids)
        else:
            frame = unpack_spans(g.body)
            keep, added = [], 0
            for sid, is_open in zip(frame["span_id"].to_list(), frame["in_progress"].to_list(), strict=True):
                key = (lane_ref, sid)
                old = keys.get(key)
                if old is None:
                    keys[key] = int(is_open)
                    added += 1
                elif old:
                    keys[key] = int(is_open)
                elif is_open:
                    keep.append(False)  # an in-progress copy of an ended span
                    continue
                keep.append(True)
            rows = sum(keep)
            if not rows:
                return
            body = g.body if rows == frame.height else write_packed(frame.filter(pl.Series(keep)))
        pending.append((lane_ref, trace, added, body, rows))
        self._span_keys.added(added)

    # reads ---------------------------------------------------------------------------------
    def run_version(self, run_id: str) -> int | None:
        row = self._reader().execute("SELECT version FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else int(row[0])

    def latest_run_id(self) -> str | None:
        row = (
            self._reader()
            .execute("SELECT run_id FROM runs ORDER BY COALESCE(first_ns, 0) DESC, created_at DESC LIMIT 1")
            .fetchone()
        )
        return None if row is None else str(row[0])

    def list_runs(
        self,
        service: str | None = None,
        since_ns: int | None = None,
        until_ns: int | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        sql = (
            "SELECT r.run_id, r.trace_id, r.service, r.source, r.first_ns, r.last_ns, r.updated_at, r.version,"
            " (SELECT COUNT(*) FROM processes p WHERE p.run_id = r.run_id),"
            " (SELECT COALESCE(SUM(b.spans), 0) FROM lanes l JOIN span_batches b ON b.lane = l.id"
            "  WHERE l.run_id = r.run_id)"
            " FROM runs r WHERE 1 = 1"
        )
        params: list[Any] = []
        if service is not None:
            sql += (
                " AND (r.service = ? OR EXISTS (SELECT 1 FROM processes p WHERE p.run_id = r.run_id AND p.service = ?))"
            )
            params += [service, service]
        if since_ns is not None:
            sql += " AND r.first_ns >= ?"
            params.append(since_ns)
        if until_ns is not None:
            sql += " AND r.first_ns <= ?"
            params.append(until_ns)
        sql += " ORDER BY COALESCE(r.first_ns, 0) DESC, r.created_at DESC LIMIT ?"
        params.append(limit)
        out = []
        for row in self._reader().execute(sql, params):
            out.append(
                {
                    "run_id": row[0],
                    "trace_id": row[1],
                    "service": row[2],
                    "source": row[3],
                    "start_ns": row[4],
                    "end_ns": row[5],
                    "updated_at": row[6],
                    "version": row[7],
                    "processes": row[8],
                    "spans": row[9],
                }
            )
        return out

    def newest_run_ids(self, n: int) -> list[str]:
        rows = self._reader().execute(
            "SELECT run_id FROM runs ORDER BY COALESCE(first_ns, 0) DESC, created_at DESC LIMIT ?", (n,)
        )
        return [str(r[0]) for r in rows]

    def load_run(self, run_id: str) -> Run | None:
        """The stored run as the run type (None: unknown run id)."""
        rows = self.load_rows(run_id)
        return None if rows is None else run_from_rows(rows)

    def load_rows(self, run_id: str) -> RunRows | None:
        conn = self._reader()
        conn.execute("BEGIN")
        try:
            row = conn.execute(
                "SELECT run_id, trace_id, service, source, version, updated_at, meta FROM runs WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            if row is None:
                return None
            cols = (
                "lane_id, pid, ppid, service, role, rank, start_method, resource, source, exited, exit_code,"
                " warnings, preloaded, journal_path"
            )
            names = [c.strip() for c in cols.split(",")]
            rows = conn.execute(f"SELECT {cols} FROM processes WHERE run_id = ?", (run_id,))
            procs = [dict(zip(names, r, strict=True)) for r in rows]
            problems = [str(r[0]) for r in conn.execute("SELECT message FROM problems WHERE run_id = ?", (run_id,))]
            lane_names = dict(conn.execute(_RUN_LANE_IDS, (run_id,)).fetchall())
            batches = conn.execute(_RUN_BATCHES, (run_id,)).fetchall()
            tables: dict[int, pl.DataFrame | bytes] = dict(self._fresh.get(batches))
            missing = [b[0] for b in batches if b[0] not in tables]
            if missing:
                for seq, body in conn.execute(_RUN_BODIES, (max(missing), run_id)):
                    tables.setdefault(seq, body)
        finally:
            conn.execute("COMMIT")
        for p in procs:
            for key in ("resource", "warnings", "preloaded"):
                p[key] = json.loads(p[key]) if p[key] else ({} if key == "resource" else [])
        batches.sort(key=_SEQ)  # arrival order (one row per batch: a few hundred)
        spans, unreadable = spans_of_batches(
            [(lane_names.get(b[1], f"lane:{b[1]}"), int(b[2]), int(b[3]), int(b[4]), tables[b[0]]) for b in batches]
        )
        if unreadable:
            problems.append(f"{unreadable} stored span batch(es) of this run could not be read and were left out")
        return RunRows(
            run_id=row[0],
            trace_id=row[1],
            service=row[2],
            source=row[3],
            version=int(row[4]),
            updated_at=float(row[5]),
            meta=json.loads(row[6]) if row[6] else {},
            problems=problems,
            processes=procs,
            spans=spans,
            unreadable=unreadable,
        )

    def save_view(self, run_id: str, kind: str, version: int, body: bytes) -> bool:
        """Keep a rendered view of the run (e.g. the page's first answer) for its `version`;
        nothing is kept (False) when the run has changed meanwhile."""
        with self.write_lock:
            conn = self._writer_conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                cur = conn.execute(
                    "INSERT INTO views(run_id, kind, version, body) SELECT ?, ?, ?, ?"
                    " WHERE EXISTS (SELECT 1 FROM runs WHERE run_id = ? AND version = ?)"
                    " ON CONFLICT(run_id, kind) DO UPDATE SET version = excluded.version, body = excluded.body",
                    (run_id, kind, version, body, run_id, version),
                )
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
        return cur.rowcount > 0

    def load_view(self, run_id: str, kind: str) -> tuple[int, bytes] | None:
        """(version, body) of a kept view; compare the version with `run_version`."""
        row = (
            self._reader()
            .execute("SELECT version, body FROM views WHERE run_id = ? AND kind = ?", (run_id, kind))
            .fetchone()
        )
        return None if row is None else (int(row[0]), bytes(row[1]))

    def count_spans(self, run_id: str | None = None) -> int:
        if run_id is None:
            row = self._reader().execute("SELECT SUM(spans) FROM span_batches").fetchone()
        else:
            row = (
                self._reader()
                .execute(f"SELECT SUM(spans) FROM span_batches WHERE lane IN ({_RUN_LANES})", (run_id,))
                .fetchone()
            )
        return int(row[0] or 0)

    def delete_runs(self, run_ids: Iterable[str]) -> int:
        ids = list(run_ids)
        if not ids:
            return 0
        with self.write_lock:
            conn = self._writer_conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                for rid in ids:
                    conn.execute(f"DELETE FROM span_batches WHERE lane IN ({_RUN_LANES})", (rid,))
                    conn.execute("DELETE FROM lanes WHERE run_id = ?", (rid,))
                    conn.execute("DELETE FROM processes WHERE run_id = ?", (rid,))
                    conn.execute("DELETE FROM problems WHERE run_id = ?", (rid,))
                    conn.execute("DELETE FROM views WHERE run_id = ?", (rid,))
                    conn.execute("DELETE FROM runs WHERE run_id = ?", (rid,))
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            finally:
                self._lane_ids.clear()
                self._iid_owners.clear()
                self._span_keys.reset()
                self._fresh.clear()
        self._unchecked_spans += len(ids)
        for rid in ids:
            for t, r in list(self._trace_runs.items()):
                if r == rid:
                    del self._trace_runs[t]
        return len(ids)

    def expire(self, max_age_s: float, now: float | None = None) -> list[str]:
        """Drop runs whose newest span (else newest ingest) is older than `max_age_s` seconds."""
        cutoff = (time.time() if now is None else now) - max_age_s
        rows = (
            self._reader()
            .execute("SELECT run_id FROM runs WHERE COALESCE(last_ns / 1e9, updated_at) < ?", (cutoff,))
            .fetchall()
        )
        ids = [str(r[0]) for r in rows]
        self.delete_runs(ids)
        return ids


def spans_of_batches(batches: list[tuple[str, int, int, int, bytes | pl.DataFrame]]) -> tuple[pl.DataFrame, int]:
    """Stored batches (lane id, trace ref, new spans, rows, body or its table), in arrival order, as
    the run's span table (run.SPAN_SCHEMA), every span once (`merge_copies`, only when a batch
    repeats spans), and how many batches could not be read."""
    bodies = [b for b in batches if isinstance(b[4], bytes)]
    frame, counts = read_packed([b[4] for b in bodies], [b[3] for b in bodies])  # type: ignore[misc]
    if len(bodies) < len(batches):  # some read already (`_FreshBatches`): the tables in order
        read, offset, parts = iter(counts), 0, []
        for b in batches:
            if isinstance(b[4], pl.DataFrame):
                parts.append(b[4])
            else:
                n = next(read)
                parts.append(frame.slice(offset, n))
                offset += n
        counts = [part.height for part in parts]
        frame = pl.concat(parts, how="vertical", rechunk=False).clone()  # a frame of its own: columns go in below
    unreadable = sum(1 for b, n in zip(batches, counts, strict=True) if n == 0 and b[3])
    kept = [(b[0], b[1], n) for b, n in zip(batches, counts, strict=True) if n]
    repeats = any(b[2] < n for b, n in zip(batches, counts, strict=True) if n)
    if not kept:
        return pl.DataFrame(schema=SPAN_SCHEMA), unreadable
    # each row's batch, as an index into the batches kept: the lane (and trace) columns gathered by it
    which = pl.select(
        pl.int_range(len(kept), dtype=pl.UInt32).repeat_by(pl.Series([k[2] for k in kept])).explode(empty_as_null=False)
    )
    which = which.to_series()
    lane = pl.Series("lane", [k[0] for k in kept], dtype=pl.String).gather(which)
    if not repeats:
        return frame.insert_column(0, lane), unreadable
    trace = pl.Series("_trace", [k[1] for k in kept], dtype=pl.Int64).gather(which)
    spans = merge_copies(frame.insert_column(0, lane).with_columns(trace))
    return spans.select(list(SPAN_SCHEMA)), unreadable


_FIRST_COPY = ["lane", "start", "instant", "thread"]  # kept from a span's first copy


def merge_copies(spans: pl.DataFrame) -> pl.DataFrame:
    """Spans (with `_trace`, in arrival order) each once: a span (trace, lane, span id) that came more
    than once is one row, at its first copy's place, with the first copy's lane, start, `instant`
    and thread, and the rest of the copy that won. Copies are taken in arrival order: a later copy
    wins if the span so far is in progress, or if both have ended and they differ in end or
    attributes. So once a copy has ended, only ended copies win, and the values the span ends with
    are the last ended copy's; the copy that won is the last ended one that differs from the ended
    copy before it (or is the first ended), else (none ended) the last copy."""
    key = ["_trace", "lane", "span_id"]  # a span id another process reused is another span
    spans = spans.with_row_index("_pos")
    dup_mask = spans.select(pl.struct(key).is_duplicated()).to_series()
    if not dup_mask.any():
        return spans.drop("_pos")
    dup = spans.filter(dup_mask)
    changed = (
        dup.filter(~pl.col("in_progress"))
        .filter(
            (pl.int_range(pl.len()).over(key) == 0)
            | pl.col("end").ne_missing(pl.col("end").shift(1).over(key))
            | pl.col("attrs").ne_missing(pl.col("attrs").shift(1).over(key))
            | pl.col("attrs_pb").ne_missing(pl.col("attrs_pb").shift(1).over(key))
        )
        .group_by(key)
        .agg(pl.col("_pos").max().alias("_won"))
    )
    copies = dup.group_by(key).agg(pl.col("_pos").min().alias("_first"), pl.col("_pos").max().alias("_last"))
    won = copies.join(changed, on=key, how="left").select("_first", pl.coalesce("_won", "_last").alias("_won"))
    firsts = dup.join(won, left_on="_pos", right_on="_first", how="inner").select("_pos", *_FIRST_COPY, "_won")
    merged = firsts.join(dup.drop(*_FIRST_COPY).rename({"_pos": "_won"}), on="_won", how="left").drop("_won")
    rest = spans.filter(~dup_mask)
    return pl.concat([rest, merged.select(rest.columns)]).sort("_pos").drop("_pos")


def run_from_rows(rows: RunRows) -> Run:
    """Stored rows as the run type. The run's root spans (`startup` spans whose parent is not in
    the run, of a lane with a process row) are kept apart, as the journal reader does. The span
    table's rows come lane by lane in the processes' order, each lane's by start (then arrival)."""
    spans = rows.spans
    known = [p["lane_id"] for p in rows.processes]
    root_spans: list[Span] = []
    startups = spans.with_row_index("_i").filter((pl.col("name") == "startup") & pl.col("lane").is_in(known))
    if startups.height:
        parents = startups.get_column("parent_id").drop_nulls().unique()
        present = spans.filter(pl.col("span_id").is_in(parents.implode())).get_column("span_id").unique()
        roots = startups.filter(pl.col("parent_id").is_null() | ~pl.col("parent_id").is_in(present.implode()))
        if roots.height:
            root_spans = [span_of(r) for r in roots.iter_rows(named=True)]
            gone = roots.get_column("_i")
            spans = spans.with_row_index("_i").filter(~pl.col("_i").is_in(gone.implode())).drop("_i")
    # per lane: its first start, and its `process` span (the first by start, then arrival)
    facts = spans.group_by("lane").agg(
        pl.col("start").min().alias("first"),
        pl.col("span_id").filter(pl.col("name") == "process").first().alias("own"),
        pl.col("start").filter(pl.col("name") == "process").first().alias("own_start"),
        (pl.col("name") == "process").sum().alias("owns"),
    )
    own: dict[str, tuple[str, int]] = {}
    first: dict[str, int] = {}
    several: list[str] = []
    for lane, first_ns, sid, start, owns in facts.iter_rows():
        first[lane] = first_ns
        if owns > 1:
            several.append(lane)
        elif sid is not None:
            own[lane] = (sid, start)
    if several:  # more than one `process` span in a lane (rare): the first by start, then arrival
        for lane, sid, start in (
            spans.filter(pl.col("lane").is_in(several) & (pl.col("name") == "process"))
            .sort("start", maintain_order=True)
            .group_by("lane", maintain_order=True)
            .first()
            .select("lane", "span_id", "start")
            .iter_rows()
        ):
            own[lane] = (sid, start)
    processes = [_process_from_row(p, own.get(p["lane_id"]), first.get(p["lane_id"])) for p in rows.processes]
    # spans of a lane without a process row: a process of its own (lanes in arrival order)
    known_set = set(known)
    extra = [lane for lane in spans.get_column("lane").unique(maintain_order=True).to_list() if lane not in known_set]
    for lane_id in extra:
        processes.append(_process_from_row({"lane_id": lane_id, "resource": {}}, own.get(lane_id), first.get(lane_id)))
    processes.sort(key=lambda p: (p.created_ns, p.instance_id))
    # one gather of the whole table (a join, then a sort, copied every column twice: ~130 MB each for
    # a 64 x 6000 run, in fresh memory), its order from the two columns it is sorted by
    order = {p.instance_id: i for i, p in enumerate(processes)}
    at = spans.select(
        pl.arg_sort_by(pl.col("lane").replace_strict(order, return_dtype=pl.UInt32), "start", maintain_order=True)
    ).to_series()
    spans = spans[at]
    meta = rows.meta
    run = Run(
        run_id=rows.run_id,
        trace_id=rows.trace_id or "",
        root_span_id=str(meta.get("root_span_id") or (root_spans[0].span_id if root_spans else "")),
        meta=meta,
        processes=processes,
        problems=list(rows.problems),
        root_spans=sorted(root_spans, key=lambda s: s.start_ns),
        spans=spans,
        service=rows.service,
        source=rows.source or "otlp",
        version=rows.version,
        updated_at=rows.updated_at,
    )
    drop_implausible(run)  # a span at 1970 (start_time_unix_nano=0) is named, not counted
    return run


def _process_from_row(p: dict[str, Any], own: tuple[str, int] | None, first_ns: int | None) -> Process:
    resource = p.get("resource") or {}
    return Process(
        instance_id=str(p["lane_id"]),
        pid=int_or_none(p.get("pid")) or int_or_none(resource.get("process.pid")) or 0,
        ppid=int_or_none(p.get("ppid")) or int_or_none(resource.get("process.parent_pid")) or 0,
        journal_path=Path(p["journal_path"]) if p.get("journal_path") else None,
        resource=resource,
        process_span_id=own[0] if own is not None else "",
        exited=None if p.get("exited") is None else bool(p["exited"]),
        exit_code=p.get("exit_code"),
        warnings=list(p.get("warnings") or []),
        preloaded=list(p.get("preloaded") or []),
        created_ns=own[1] if own is not None else (first_ns or 0),
        source=str(p.get("source") or "otlp"),
    )
