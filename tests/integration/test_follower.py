"""Automatic OTLP export (export/follower.py) when OTEL_EXPORTER_OTLP_ENDPOINT is set: the run
arrives by itself, and a dead collector neither delays the traced process nor floods its stderr."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from run_spans import all_spans

from starttrace.sources.journal_reader import read_run


def _followers(run_dir: Path) -> list[int]:
    """Pids of the follower helpers exporting `run_dir` (found through /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if b"starttrace.follower" in argv and os.fsencode(run_dir) in argv and state != b"Z":
            pids.append(int(entry.name))
    return pids


def _wait_followers_gone(run_dir: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _followers(run_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_run_is_exported_automatically(
    venv_python: str, traced_env: dict[str, str], journal_root: Path, otlp_receiver: Any,
    only_run_dir: Callable[[Path], Path],
) -> None:  # fmt: skip
    env = dict(traced_env, OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.url)
    proc = subprocess.run([venv_python, "-c", "import json"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(journal_root)
    follower_seen = bool(_followers(run_dir))
    run = read_run(run_dir)
    expected = {span.span_id for _, span in all_spans(run)}
    assert "import json" in {span.name for _, span in all_spans(run)}
    received = otlp_receiver.wait_for_spans(len(expected), timeout=15)
    assert {s.span_id for s in received} == expected, f"{len(received)} of {len(expected)} spans arrived"
    assert _wait_followers_gone(run_dir, 20), "the follower must exit once the run is exported"
    counts = Counter(s.span_id for s in otlp_receiver.spans())
    assert set(counts.values()) == {1}, f"spans sent more than once: {[k for k, v in counts.items() if v > 1]}"
    assert {s.trace_id for s in received} == {run.trace_id}
    assert all(s.resource["starttrace.run_id"] == run.run_id for s in received)
    # the helper is not traced itself: only the traced program's journal is in the run
    assert len(run.processes) == 1
    assert follower_seen or received, "the follower ran"


def test_dead_collector_does_not_delay_exit(
    venv_python: str, traced_env: dict[str, str], journal_root: Path, tmp_path: Path,
    clean_env: Callable[..., dict[str, str]], only_run_dir: Callable[[Path], Path],
) -> None:  # fmt: skip
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    command = [venv_python, "-c", "import json"]

    def timed(env: dict[str, str], stderr_path: Path) -> float:
        with open(stderr_path, "wb") as stderr:  # a FILE: the detached follower keeps inherited fds open
            start = time.monotonic()
            proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
            code = proc.wait(timeout=60)
            elapsed = time.monotonic() - start
        assert code == 0, stderr_path.read_text()
        return elapsed

    untraced = min(timed(clean_env(), tmp_path / f"plain{i}.err") for i in range(2))
    endpoint = f"http://127.0.0.1:{closed_port}"
    traced_stderr = tmp_path / "traced.err"
    traced = timed(dict(traced_env, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint), traced_stderr)
    assert traced - untraced < 1.0, f"traced exit took {traced:.3f} s vs {untraced:.3f} s untraced"

    run_dir = only_run_dir(journal_root)
    assert _wait_followers_gone(run_dir, 20), "the follower must give up and exit"
    text = traced_stderr.read_text()
    failures = [line for line in text.splitlines() if "fail" in line.lower()]
    assert len(failures) == 1, f"the failure must be reported exactly once:\n{text}"
    assert str(closed_port) in failures[0] and run_dir.name in failures[0]
    assert "Traceback" not in text
    assert "Exception" not in text and "WARNING" not in text, text
