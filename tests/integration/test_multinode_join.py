"""The service's fallback for nodes that share no run id: per-node runs whose processes name the
same rendezvous (here torch's env:// master and world size, as ranks started one by one by a
launcher starttrace does not know) and ran at the same time are shown as one run; a run of
another job (another master) at the same time is not joined."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from starttrace.service.app import Settings, create_app

RANK_PROGRAM = "import time; time.sleep(1.0)"


def _start_rank(venv_python: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([venv_python, "-c", RANK_PROGRAM], env=env, stderr=subprocess.PIPE, text=True)


def test_ranks_started_apart_are_joined_by_their_rendezvous(
    venv_python: str, clean_env: Callable[..., dict[str, str]], journal_root: Path, tmp_path: Path
) -> None:
    def rank_env(rank: int, port: int) -> dict[str, str]:
        return clean_env(
            STARTTRACE="1",
            STARTTRACE_DIR=str(journal_root),
            RANK=str(rank),
            LOCAL_RANK="0",
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )

    procs = [_start_rank(venv_python, rank_env(r, 29977)) for r in (0, 1)]
    procs.append(_start_rank(venv_python, rank_env(0, 29988)))  # another job, at the same time
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    run_dirs = sorted(p.name for p in journal_root.iterdir())
    assert len(run_dirs) == 3, "no launcher key: every rank made a run of its own"
    with TestClient(create_app(Settings(db=tmp_path / "st.db", journal_dir=journal_root, poll_s=0.2))) as client:
        deadline = time.monotonic() + 30
        while len(client.get("/runs").json()["runs"]) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        runs = client.get("/runs").json()["runs"]
        assert len(runs) == 3
        pages = {r["run_id"]: client.get(f"/startup/{r['run_id']}").json() for r in runs}
    joined = {rid: page for rid, page in pages.items() if len(page["lanes"]) == 2}
    alone = {rid: page for rid, page in pages.items() if len(page["lanes"]) == 1}
    assert len(joined) == 2 and len(alone) == 1, {rid: len(p["lanes"]) for rid, p in pages.items()}
    for rid, page in joined.items():
        assert sorted(page["meta"]["joined_runs"]) == sorted(joined), "each page shows the whole job"
        assert page["meta"]["joined_runs"][0] == rid
        assert sorted(lane["rank"] for lane in page["lanes"]) == [0, 1]
        assert any("joined with run" in p for p in page["problems"])
    (other,) = alone.values()
    assert "joined_runs" not in other["meta"]
