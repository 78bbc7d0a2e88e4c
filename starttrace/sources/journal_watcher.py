"""Watch a journal root (`ROOT/<run_id>/`) and feed new runs and new lines into the store.

Every `poll_s` each run folder's signature (`journal_files.journal_signature`: one `stat` per
unchanged file) is compared with the last; a changed run is re-read whole (`read_run` resolves
cross-process links) and only its new or changed spans (an anti-join of its span table with what
was sent) go to the store, as `ProcessBatch`es packed from that table (`batches.pack_frame`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from starttrace.run import Run, spans_table
from starttrace.sources.batches import STORED_SCHEMA, IngestBatch, ProcessBatch, RunMeta, pack_frame
from starttrace.sources.journal_files import journal_signature
from starttrace.sources.store import Store

log = logging.getLogger("starttrace.service")

Signature = tuple[tuple[str, int, int], ...]

# the span table's columns whose change makes a span worth sending again
_SIGNATURE = ["span_id", "end", "parent_id", "error", "attrs"]
# the stored columns that are not the table's as they are: a span without an end is open, an empty
# attribute text none, and a journal has no OTLP attribute bytes
_STORED_COLUMNS = {
    "in_progress": pl.col("end").is_null(),
    "instant": pl.col("instant").fill_null(False),
    "attrs": pl.when(pl.col("attrs") != "").then(pl.col("attrs")),
    "attrs_pb": pl.lit(None, pl.Binary),
}
_USED: dict[str, dict[str, int]] = {}  # run folder -> journal file -> bytes in use (see _signature)


def _signature(run_dir: Path) -> Signature:
    """Changes whenever a record is added: by bytes in use, since a version 2 segment keeps its size
    (and its mtime, mostly) while records are written into it (docs/journal.md)."""
    return journal_signature(run_dir, _USED.setdefault(str(run_dir), {}))


class JournalWatcher:
    def __init__(
        self,
        root: Path,
        store: Store,
        poll_s: float = 1.0,
        retention_s: float | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.store = store
        self.poll_s = poll_s
        self.retention_s = retention_s
        self.on_error = on_error
        self._signatures: dict[str, Signature] = {}
        self._sent: dict[str, pl.DataFrame] = {}  # run id -> the signatures of the spans sent (_SIGNATURE)
        self._running: dict[str, list[tuple[int, int, str]]] = {}  # run folder -> (pid, created, host) alive
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="starttrace-journal-watcher", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan()
            except Exception as exc:  # never let the watcher die
                self._error(f"journal scan failed: {type(exc).__name__}: {exc}")
            self._stop.wait(self.poll_s)

    def _error(self, msg: str) -> None:
        if msg not in self.errors:
            self.errors.append(msg)
            del self.errors[:-20]
            log.warning("%s", msg)
        if self.on_error is not None:
            self.on_error(msg)

    def scan(self) -> int:
        """One pass over the root; returns the number of runs (re)read."""
        from starttrace.sources.journal_reader import ReaderError, list_run_dirs, read_run

        changed = 0
        cutoff = None if self.retention_s is None else time.time() - self.retention_s
        for run_dir in list_run_dirs(self.root):
            sig = _signature(run_dir)
            key = str(run_dir)
            if self._signatures.get(key) == sig and not self._someone_died(key):
                continue
            if cutoff is not None and sig and max(m for _, _, m in sig) / 1e9 < cutoff:
                self._signatures[key] = sig
                continue
            try:
                run = read_run(run_dir)
            except ReaderError as exc:
                if run_dir.is_dir():  # not a folder that went away meanwhile (a torchrun agent's first run)
                    self._error(f"{run_dir.name}: {exc}")
                self._signatures[key] = sig
                continue
            self._signatures[key] = sig
            # processes found running: a kill -9 changes no file, so they are looked at every pass
            self._running[key] = [
                (p.pid, int(p.record.get("created", p.record.get("activated", p.record.get("anchor_mono", 0)))), p.host)
                for p in run.processes
                if p.alive
            ]
            self.store.submit(self._batch(run), block=True)
            self._forget_moved_from(run)
            changed += 1
        return changed

    def _someone_died(self, key: str) -> bool:
        """A process the last read found running is gone (or its pid is another process now):
        the run is read again, so its lanes end as `killed` (analysis/liveness.py)."""
        from starttrace.sources.journal_reader import process_alive

        return any(process_alive(pid, created, host) is False for pid, created, host in self._running.get(key, ()))

    def _forget_moved_from(self, run: Any) -> None:
        """A torchrun agent's journal starts in its command line's run and moves into its launch's
        (probes/torchelastic.py; `starttrace.job.first_run_id` names the first): a first run read
        here before the move, whose folder is gone now, is dropped from the store."""
        firsts = {p.resource.get("starttrace.job.first_run_id") for p in run.processes}
        for first in firsts - {None, run.run_id}:
            if not isinstance(first, str) or first not in self._sent or (self.root / first).exists():
                continue
            self.store.flush()
            self.store.delete_runs([first])
            self._sent.pop(first, None)
            self._signatures.pop(str(self.root / first), None)

    def _batch(self, run: Run) -> IngestBatch:
        """The run's spans that are new or changed since the last read of it (an anti-join of its
        span table with what was sent), as one ProcessBatch per process."""
        trace_id = run.trace_id or run.run_id
        root_proc = run.root_process
        table = run.spans
        if root_proc is not None and run.root_spans:  # the run's root spans go with its root process
            table = pl.concat([table, spans_table((root_proc.instance_id, s) for s in run.root_spans)])
        previous = self._sent.get(run.run_id)
        changed = table if previous is None else table.join(previous, on=_SIGNATURE, how="anti", nulls_equal=True)
        self._sent[run.run_id] = table.select(_SIGNATURE)
        stored = changed.select(
            "lane",
            *[_STORED_COLUMNS.get(name, pl.col(name)).cast(dtype).alias(name) for name, dtype in STORED_SCHEMA.items()],
        )
        by_lane = {
            lane: [pack_frame(trace_id, frame.drop("lane"))]
            for (lane,), frame in stored.partition_by("lane", as_dict=True, maintain_order=True).items()
        }
        processes = [
            ProcessBatch(
                source="journal",
                resource=dict(p.resource),
                spans=[],
                packed=by_lane.pop(p.instance_id, []),  # popped: two journals of one lane send it once
                run_id=run.run_id,
                lane_id=p.instance_id,
                info={
                    "exited": bool(p.exited or getattr(p, "alive", None) is False),
                    "exit_code": p.exit_code,
                    "warnings": list(p.warnings),
                    "preloaded": list(p.preloaded),
                    "journal_path": str(p.journal_path),
                },
            )
            for p in run.processes
        ]
        meta = RunMeta(
            run_id=run.run_id,
            trace_id=run.trace_id or None,
            meta=dict(run.meta or {}),
            problems=list(run.problems),
            service=run.service,  # run.json's service, as read_run takes it
        )
        return IngestBatch(processes=processes, runs=[meta], replace_problems=True)
