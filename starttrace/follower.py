"""Automatic OTLP export, off the traced processes' critical path.

When an OTLP endpoint is configured, the root traced process starts this as a detached helper
process (never traced itself). It waits, cheaply, until the run is ready or its root process has
exited, then sends the run with the official OTLP/HTTP exporter at `STARTTRACE_OTLP_DETAIL` (`full`, the
default: every span, the summary set marked; `summary`: that set only, with
`STARTTRACE_SUMMARY_IMPORTS` imports per process, see analysis/detail.py); spans that were
still open then are sent again, finished, when the root process exits. Each export also carries the
run's facts (`analysis.fleet.run_facts`, the service's own analysis) as one `starttrace.run` span
(run/facts_attrs.py); the one sent at exit supersedes the one sent at ready. A failure (no collector
listening, ...) is reported once on stderr; the traced processes never wait for any of this. A
torchrun agent that moves into its launch's run (probes/torchelastic.py) leaves a marker in the
first folder: the follower follows it (`moved`).

    python -m starttrace.follower RUN_DIR ROOT_PID ENDPOINT
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

POLL_S = 0.5
SETTLE_S = 1.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class ReadyWatch:
    """Scans only the new bytes of each journal file for the `ready` record, up to the first zero
    byte (a version 2 segment's unused part), where the next poll resumes."""

    CHUNK = 1 << 16
    OVERLAP = 32  # a record cut between two polls is seen whole on the next one

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.offsets: dict[Path, int] = {}

    def ready(self) -> bool:
        from starttrace.sources.journal_files import all_journal_files, open_regular

        found = False
        try:
            paths = all_journal_files(self.run_dir)
        except OSError:
            return False
        for path in paths:
            offset = self.offsets.get(path, 0)
            position = max(0, offset - self.OVERLAP)
            carry = b""
            try:
                # a FIFO or a device named like a journal: skipped, never waited on (open would block)
                with os.fdopen(open_regular(path), "rb") as handle:
                    handle.seek(position)
                    while True:
                        chunk = handle.read(self.CHUNK)
                        stop = chunk.find(b"\0")
                        data = chunk if stop < 0 else chunk[:stop]
                        if b'"n":"ready"' in carry + data:
                            found = True
                        position += len(data)
                        if stop >= 0 or len(chunk) < self.CHUNK:
                            break
                        carry = data[-self.OVERLAP :]
            except OSError:
                continue
            self.offsets[path] = max(offset, position)
        return found


def moved(run_dir: Path, root_span: str | None) -> Path:
    """Where this node's run is now: a torchrun agent that adopted its launch's run
    (probes/torchelastic.py) left `<first folder>/.moved-<root span>` naming the new folder. The
    marker is removed once read, and the first folder with it when nothing else is left there."""
    for _ in range(8):  # a chain of adoptions, bounded
        marker = run_dir / f".moved-{root_span}"
        if not root_span or not marker.is_file():
            return run_dir
        try:
            target = Path(marker.read_text(encoding="utf-8").strip())
        except OSError:
            return run_dir
        with contextlib.suppress(OSError):
            marker.unlink()
            run_dir.rmdir()
        run_dir = target
    return run_dir


def _wait_until_ready(run_dir: Path, root_pid: int, root_span: str | None) -> Path:
    """Until the run is ready or its root has exited (and settled); returns the run's folder then."""
    watch = ReadyWatch(run_dir)
    while _alive(root_pid) and not watch.ready():
        time.sleep(POLL_S)
        now_at = moved(run_dir, root_span)
        if now_at != run_dir:
            run_dir, watch = now_at, ReadyWatch(now_at)
    time.sleep(SETTLE_S)
    return run_dir


def follow(run_dir: Path, root_pid: int, endpoint: str) -> int:
    import logging

    # The exporter logs every retry; this process reports a failure once, itself.
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
    from starttrace.analysis.detail import DEFAULT_DETAIL, DEFAULT_IMPORT_BUDGET
    from starttrace.sources.journal_reader import ReaderError, read_run
    from starttrace.views.export import detail_from_env
    from starttrace.views.otlp import ExportError, http_exporter, send, to_readable_spans

    try:
        detail, budget = detail_from_env(os.environ)
    except ValueError as exc:  # reported once; full detail loses nothing
        print(f"starttrace: {exc}; exporting in full detail", file=sys.stderr)
        detail, budget = DEFAULT_DETAIL, DEFAULT_IMPORT_BUDGET
    from starttrace import clocksync

    clock = clocksync.measure(endpoint)  # this node's NTP state and clock offset to the service
    root_span = os.environ.get("STARTTRACE_ROOT_SPAN")
    run_dir = _wait_until_ready(run_dir, root_pid, root_span)
    exporter = http_exporter(endpoint, timeout_s=5.0)
    finished: set[str] = set()
    try:
        for final in (False, True):
            if final:
                while _alive(root_pid):
                    time.sleep(POLL_S)
                time.sleep(SETTLE_S)
            run_dir = moved(run_dir, root_span)
            try:
                run = read_run(run_dir)
            except ReaderError as exc:
                print(f"starttrace: OTLP export of {run_dir.name} skipped: {exc}", file=sys.stderr)
                return 2
            run = clocksync.this_node(run, root_span, clock)
            spans = [
                s
                for s in to_readable_spans(run, detail=detail, import_budget=budget)
                if f"{s.context.span_id:016x}" not in finished
            ]
            if final:
                spans = [s for s in spans if not (s.attributes or {}).get("starttrace.in_progress")] or spans
            facts = _facts_span(run, int(final))
            if facts is not None:
                spans.append(facts)
            try:
                send(spans, exporter)
            except ExportError as exc:
                print(f"starttrace: OTLP export of run {run.run_id} to {endpoint} failed: {exc}", file=sys.stderr)
                return 1
            finished.update(
                f"{s.context.span_id:016x}" for s in spans if not (s.attributes or {}).get("starttrace.in_progress")
            )
            if not _alive(root_pid):
                break
    finally:
        exporter.shutdown()
    return 0


def _facts_span(run: Any, export_seq: int) -> Any:
    """The run's facts as the `starttrace.run` span (the service's own analysis: `run_facts` of
    `build_model`), or None where they cannot be computed (reported; the spans go anyway)."""
    from starttrace.analysis.clocks import correct_clocks
    from starttrace.analysis.fleet import run_facts
    from starttrace.analysis.lanes import build_model
    from starttrace.views.otlp import facts_span

    try:
        facts_run = correct_clocks(run)  # as the service's model cache reads a run
        return facts_span(run, run_facts(facts_run, build_model(facts_run)), export_seq)
    except Exception as exc:
        print(
            f"starttrace: the facts of run {run.run_id} were not exported: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        return follow(Path(args[0]), int(args[1]), args[2])
    except Exception as exc:  # reported once; nothing traced depends on this process
        print(f"starttrace: OTLP export failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
