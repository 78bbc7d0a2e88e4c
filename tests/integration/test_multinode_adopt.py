"""torchrun agents agree on their launch's run in the rendezvous store (probes/torchelastic.py).

Two real torchrun agents (`--nnodes 2`, c10d rendezvous) on this host, told apart by their local
address (127.0.0.2 sorts first: group rank 0). Both traced: each starts on the run its command
line derives and moves into the run group rank 0 published, with everything it recorded before;
the workers start in that run. Rank 0 not traced: the other node finds nothing in the store, says
so once, and keeps the run of its command line; the job runs as without tracing.
(tests/integration/test_multinode.py does the same across two simulated hosts, relaunched.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from starttrace.sources.journal_reader import read_run
from starttrace.tracer.launchers import from_argv

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from run_spans import spans_of  # noqa: E402
from st_service_helpers import free_port, start_server  # noqa: E402

JOB = REPO / "examples" / "torchrun_job.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
ADDRS = ("127.0.0.2", "127.0.0.3")  # group rank 0, group rank 1

pytestmark = pytest.mark.skipif(not TORCHRUN.exists(), reason="needs torch's torchrun in the venv")


def _args(port: int, local_addr: str) -> list[str]:
    return [
        str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "adopt", "--local-addr", local_addr, str(JOB),
    ]  # fmt: skip


def _launch(env_of: Callable[[str], dict[str, str]], tmp_path: Path) -> tuple[str, dict[str, str]]:
    """Both agents; returns the run id their command line derives and each agent's stderr."""
    port = free_port()
    procs = {}
    for addr in ADDRS:
        procs[addr] = subprocess.Popen(
            _args(port, addr), env=env_of(addr), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
    logs = {}
    try:
        for addr, proc in procs.items():
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, f"{addr}: {err[-3000:]}"
            logs[addr] = out + err
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    job = from_argv(["python", *_args(port, "x")])
    assert job is not None
    return job.run_id, logs


def test_both_agents_move_into_the_run_rank_0_published(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]], journal_root: Path
) -> None:
    first, logs = _launch(lambda _: clean_env(STARTTRACE="1", STARTTRACE_DIR=str(journal_root)), tmp_path)
    (run_dir,) = journal_root.iterdir()  # the first folder (the command line's run) is gone
    assert run_dir.name != first and run_dir.name.startswith("torchrun-")
    for log in logs.values():
        assert log.count(f"tracing run {run_dir.name} -> ") == 1 and f"(this launch's; was {first})" in log, log
    run = read_run(run_dir)
    assert run.trace_id == json.loads((run_dir / "run.json").read_text())["trace_id"] and len(run.trace_id) == 32
    agents = [p for p in run.processes if p.resource["starttrace.start_method"] == "root"]
    workers = [p for p in run.processes if p.resource.get("starttrace.role") == "worker"]
    assert len(agents) == 2 and sorted(p.rank for p in workers) == [0, 1]
    for agent in agents:
        assert agent.resource["starttrace.job.adopted"] == "c10d-store"
        assert agent.resource["starttrace.job.first_run_id"] == first
        assert agent.record["run"] == first, "the journal began in the first run and moved whole"
        names = {s.name for s in spans_of(run, agent)}
        assert "python.init" in names and "import torch" in names, "what it recorded before the rendezvous"
        assert all(s.end_ns is not None for s in spans_of(run, agent) if s.name.startswith("import ")), "and after it"
    for worker in workers:  # started after the adoption: in the run from their first record on
        assert worker.record["run"] == run.run_id and worker.record["trace"] == run.trace_id
        agent = next(a for a in agents if a.pid == worker.ppid)
        own = run.process_span(worker)
        assert own is not None and own.parent_id in {s.span_id for s in spans_of(run, agent)}


def test_a_service_watching_live_drops_the_first_run(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]], journal_root: Path
) -> None:
    """The service's journal watcher may read an agent's first run before the agent moves out of it:
    once the launch's run names it as the agents' first run and its folder is gone, it is dropped."""
    server = start_server(tmp_path, "--journal-dir", str(journal_root), env=clean_env())
    url = server.url
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:  # what the service lists while the agents start
        while not done.is_set():
            try:
                seen.update(r["run_id"] for r in httpx.get(url + "/runs", timeout=5).json()["runs"])
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        watcher.start()
        first, _ = _launch(lambda _: clean_env(STARTTRACE="1", STARTTRACE_DIR=str(journal_root)), tmp_path)
        (run_dir,) = journal_root.iterdir()
        deadline = time.monotonic() + 60
        runs: list[str] = []
        while time.monotonic() < deadline:
            listed = httpx.get(url + "/runs", timeout=5).json()["runs"]
            runs = [r["run_id"] for r in listed]
            if runs == [run_dir.name] and listed[0]["processes"] == 4:
                break
            time.sleep(0.5)
        assert runs == [run_dir.name], f"the first run is gone from the service: {runs}"
        assert first in seen, f"the watcher read the first run while the agents were in it: {seen}"
        health = httpx.get(url + "/healthz", timeout=5).json()
        assert health["journal_errors"] == [], health
    finally:
        done.set()
        server.stop()


def test_an_untraced_rank_0_leaves_the_other_node_on_its_command_lines_run(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]], journal_root: Path
) -> None:
    def env_of(addr: str) -> dict[str, str]:
        return clean_env(STARTTRACE="1", STARTTRACE_DIR=str(journal_root)) if addr == ADDRS[1] else clean_env()

    first, logs = _launch(env_of, tmp_path)
    assert [p.name for p in journal_root.iterdir()] == [first]
    traced = logs[ADDRS[1]]
    assert traced.count("the group-rank-0 agent published no run id") == 1, traced
    assert "this launch's" not in traced
    run = read_run(journal_root / first)
    assert [p.rank for p in run.processes if p.resource.get("starttrace.role") == "worker"] == [1]
    (agent,) = [p for p in run.processes if p.resource["starttrace.start_method"] == "root"]
    assert "starttrace.job.adopted" not in agent.resource
    assert any("published no run id" in w for w in agent.warnings), "reported in the journal too"
