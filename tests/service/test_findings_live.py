"""A hung 2-rank gloo job, watched live by `starttrace serve`: rank 1 hangs importing a module,
rank 0 waits for it in `init_process_group`. /startup's findings say so (`stalled`), the waiting
rank is labelled as rank 0 although init_process_group has not returned, and the stuck process by
its Process name and target. Needs torch (skipped with the reason otherwise)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from st_service_helpers import Server, wait_for

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the hung gloo job needs torch")

JOB = """
import multiprocessing, socket, sys
from datetime import timedelta

def rank_main(rank, port):
    if rank == 1:
        import stuckmod  # never returns
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=600))

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, port), name=f"rank-{r}") for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
"""
STALL_S = 3


@pytest.fixture
def hung_job(tmp_path: Path, clean_env: Callable[..., dict[str, str]], venv_python: str) -> Iterator[Path]:
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "stuckmod.py").write_text("import time\ntime.sleep(600)\n")
    root = tmp_path / "runs"
    root.mkdir()
    env = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(root), PYTHONPATH=str(tmp_path))
    proc = subprocess.Popen(
        [venv_python, str(tmp_path / "job.py")],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield root
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def _from_journals(root: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    from starttrace.analysis.lanes import build_model
    from starttrace.sources.journal_reader import ReaderError, read_run
    from starttrace.views.json import to_json

    runs = [p for p in root.iterdir() if p.is_dir()]
    if not runs:
        return None
    try:
        doc = to_json(build_model(read_run(runs[0]), stall_s=STALL_S), include_spans=False)
    except ReaderError:
        return None
    return _stalled(doc)


def _stalled(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    found = [f for f in doc.get("findings", []) if f["kind"] == "stalled" and f["stalled_pid"]]
    return (doc, found[0]) if found and found[0]["waiters"] else None


def check(doc: dict[str, Any], finding: dict[str, Any]) -> None:
    assert doc["live"] and doc["status"] == "running"
    lanes = {lane["pid"]: lane for lane in doc["lanes"]}
    waiter = lanes[finding["waiters"][0]["pid"]]
    stuck = lanes[finding["stalled_pid"]]
    # the waiting rank is rank 0 from the moment it called init_process_group(rank=0, ...)
    assert waiter["role"] == "worker" and waiter["rank"] == 0 and waiter["world_size"] == 2
    assert waiter["label"] == f"worker rank 0 pid {waiter['pid']}"
    assert stuck["role"] == "child" and stuck["label"] == f"rank-1 (rank_main) pid {stuck['pid']}"
    assert finding["waiters"][0]["span"] == "dist.init" and finding["span"] == "import stuckmod"
    assert finding["seconds"] >= STALL_S
    assert f"rank 0 (pid {waiter['pid']}) has waited" in finding["text"] and "in dist.init" in finding["text"]
    assert f"rank-1 (rank_main) pid {stuck['pid']} has been in `import stuckmod` for" in finding["text"]
    assert finding["pids"] == [stuck["pid"], waiter["pid"]]


def test_stalled_job_is_named_live(hung_job: Path, server_factory: Callable[..., Server]) -> None:
    server = server_factory("--journal-dir", str(hung_job), env={"STARTTRACE_STALL_S": str(STALL_S)})
    # the analysis of the journals as they are now
    got = wait_for(lambda: _from_journals(hung_job), timeout=120, interval=1.0)
    check(*got)

    # the same, watched by the service
    def from_service() -> tuple[dict[str, Any], dict[str, Any]] | None:
        try:
            return _stalled(httpx.get(server.url + "/startup?format=json", timeout=10).json())
        except (httpx.HTTPError, ValueError):
            return None

    check(*wait_for(from_service, timeout=30, interval=1.0))
