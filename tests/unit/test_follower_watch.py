"""The follower's watch for the `ready` record (starttrace/follower.py `ReadyWatch`): it reads
only regular files, so a FIFO named like a journal segment never blocks the helper that exports
the run."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from starttrace.follower import ReadyWatch

READY = b'{"k":"instant","n":"ready","t":5}\n'


def _ready_within(watch: ReadyWatch, seconds: float) -> list[bool]:
    answers: list[bool] = []
    thread = threading.Thread(target=lambda: answers.append(watch.ready()), daemon=True)
    thread.start()
    thread.join(seconds)
    return answers


def test_a_fifo_named_like_a_segment_is_skipped_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "100-aaaa.0.journal")  # sorts first: the watch reaches it before the real one
    (tmp_path / "200-bbbb.0.journal").write_bytes(b'{"k":"process"}\n' + READY + bytes(64))
    watch = ReadyWatch(tmp_path)
    assert _ready_within(watch, 10.0) == [True]  # an `open` of the FIFO would still be waiting
    assert tmp_path / "100-aaaa.0.journal" not in watch.offsets


def test_the_ready_record_is_found_once_written(tmp_path: Path) -> None:
    segment = tmp_path / "300-cccc.0.journal"
    segment.write_bytes(b'{"k":"process"}\n' + bytes(256))
    watch = ReadyWatch(tmp_path)
    assert _ready_within(watch, 10.0) == [False]
    with open(segment, "r+b") as handle:  # the writer fills the mapped segment in place
        handle.seek(len(b'{"k":"process"}\n'))
        handle.write(READY)
    assert _ready_within(watch, 10.0) == [True]
