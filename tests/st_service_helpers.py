"""Helpers for tests that run the service: a real `serve` subprocess on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def start_server(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Server:
    port = free_port()
    log = tmp / f"server-{port}.log"
    cmd = [sys.executable, "-m", "starttrace.service.server", "--port", str(port), "--db", str(tmp / "st.db"), *args]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.pop("STARTTRACE", None)
    full_env.pop("VLLM_STARTTRACE", None)
    full_env.pop("STARTTRACE_TOKEN", None)
    if env:
        full_env.update(env)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=str(tmp))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return Server(proc, url, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server did not start: {log.read_text()}")


def flush(client: TestClient) -> None:
    assert client.app.state.store.flush(30)  # type: ignore[attr-defined]


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.1) -> Any:
    deadline = time.time() + timeout
    last: Any = None
    while time.time() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last value {last!r})")


def wait_final(run_dir: Path, timeout: float = 20.0, environ: dict[str, str] | None = None) -> Any:
    """The run in `run_dir` once it no longer changes: every process has exited and, for a
    journal-only run (`environ`, the traced program's environment, names no OTLP export) where
    the kernel's NTP state can be read, the clock file that the root's detached helper writes
    after the root's exit is there (`starttrace.clocksync`). Two reads of the run taken on either
    side of that file differ in the processes' clock attributes."""
    from starttrace.clocksync import ntp_state
    from starttrace.sources.journal_reader import read_run
    from starttrace.tracer.lifecycle import auto_export_endpoint

    expect_clock = bool(ntp_state()) and auto_export_endpoint(environ or {}) is None

    def final() -> Any:
        run = read_run(run_dir)
        if any(p.alive for p in run.processes):
            return None
        if expect_clock:
            roots = [  # a root that wrote its exit (one killed by a signal starts no helper)
                p.record.get("root_span")
                for p in run.processes
                if p.resource.get("starttrace.start_method") == "root" and p.exited
            ]
            if any(root and not (run_dir / f"clock-{root}.json").exists() for root in roots):
                return None
            run = read_run(run_dir)  # again: the file may have come between the first read and the check
        return run

    return wait_for(final, timeout)


@contextmanager
def serving(args: Sequence[str], log: Path, env: dict[str, str], cwd: Path, timeout: float = 120.0) -> Iterator[str]:
    """A real `python -m starttrace.service.server --port <free port> *args` for the block: yields its
    URL once /healthz answers (its output in `log`), and stops it after."""
    port = free_port()
    cmd = [sys.executable, "-m", "starttrace.service.server", "--port", str(port), *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=str(cwd), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("service did not start: " + log.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
