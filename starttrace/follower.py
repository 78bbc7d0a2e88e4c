"""Automatic OTLP export, off the traced processes' critical path.

When an OTLP endpoint is configured, the root traced process starts this as a detached helper
process (never traced itself). It waits, cheaply, until the run is ready or its root process has
exited, then sends every span of the run with the official OTLP/HTTP exporter; spans that were
still open then are sent again, finished, when the root process exits. A failure (no collector
listening, ...) is reported once on stderr; the traced processes never wait for any of this.

    python -m starttrace.follower RUN_DIR ROOT_PID ENDPOINT
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

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
    """Scans only the new bytes of each journal for the `ready` record."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.offsets: dict[Path, int] = {}

    def ready(self) -> bool:
        found = False
        for path in self.run_dir.glob("*.jsonl"):
            offset = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as handle:
                    handle.seek(max(0, offset - 32))
                    chunk = handle.read()
            except OSError:
                continue
            self.offsets[path] = offset + max(0, len(chunk) - min(32, offset))
            if b'"n":"ready"' in chunk:
                found = True
        return found


def follow(run_dir: Path, root_pid: int, endpoint: str) -> int:
    import logging

    # The exporter logs every retry; this process reports a failure once, itself.
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
    from starttrace.sources.journal_reader import ReaderError, read_run
    from starttrace.views.otlp import ExportError, http_exporter, send, to_readable_spans

    watch = ReadyWatch(run_dir)
    while _alive(root_pid) and not watch.ready():
        time.sleep(POLL_S)
    time.sleep(SETTLE_S)
    exporter = http_exporter(endpoint, timeout_s=5.0)
    finished: set[str] = set()
    try:
        for final in (False, True):
            if final:
                while _alive(root_pid):
                    time.sleep(POLL_S)
                time.sleep(SETTLE_S)
            try:
                run = read_run(run_dir)
            except ReaderError as exc:
                print(f"starttrace: OTLP export of {run_dir.name} skipped: {exc}", file=sys.stderr)
                return 2
            spans = [s for s in to_readable_spans(run) if f"{s.context.span_id:016x}" not in finished]
            if final:
                spans = [s for s in spans if not (s.attributes or {}).get("starttrace.in_progress")] or spans
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
