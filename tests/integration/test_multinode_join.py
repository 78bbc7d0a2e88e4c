"""The service's fallback for nodes that share no run id: per-node runs whose processes name the
same rendezvous (here torch's env:// master and world size, as ranks started one by one by a
launcher starttrace does not know) and ran at the same time are shown as one run; a run of
another job (another master) at the same time is not joined."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from starttrace.service.app import Settings, create_app

RANK_PROGRAM = "import time; time.sleep(1.0)"
STARTTRACE = str(Path(sys.executable).with_name("starttrace"))


def _start_rank(venv_python: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([venv_python, "-c", RANK_PROGRAM], env=env, stderr=subprocess.PIPE, text=True)


def _three_runs(venv_python: str, clean_env: Callable[..., dict[str, str]], journal_root: Path) -> list[str]:
    """Ranks 0 and 1 of one job (env:// master 127.0.0.1:29977, world size 2) and rank 0 of another
    job (another master) at the same time: three runs, none with a launcher key."""

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
    return run_dirs


def test_ranks_started_apart_are_joined_by_their_rendezvous(
    venv_python: str, clean_env: Callable[..., dict[str, str]], journal_root: Path, tmp_path: Path
) -> None:
    _three_runs(venv_python, clean_env, journal_root)
    app = create_app(Settings(db=tmp_path / "st.db", journal_dir=journal_root, poll_s=0.2))
    with TestClient(app, base_url="http://localhost") as client:
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


def test_the_cli_joins_them_the_same_way(
    venv_python: str, clean_env: Callable[..., dict[str, str]], journal_root: Path
) -> None:
    """`report`, `export` and `compare` on a shared journal root show the whole job of a per-node run."""
    run_ids = _three_runs(venv_python, clean_env, journal_root)

    def cli(*args: str) -> Any:
        proc = subprocess.run(
            [STARTTRACE, *args, "--dir", str(journal_root)],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    reports = {rid: json.loads(cli("report", rid, "--json")) for rid in run_ids}
    joined = {rid: m for rid, m in reports.items() if len(m["lanes"]) == 2}
    alone = {rid: m for rid, m in reports.items() if len(m["lanes"]) == 1}
    assert len(joined) == 2 and len(alone) == 1, {rid: len(m["lanes"]) for rid, m in reports.items()}
    for rid, model in joined.items():
        assert sorted(model["meta"]["joined_runs"]) == sorted(joined) and model["meta"]["joined_runs"][0] == rid
        assert sorted(lane["rank"] for lane in model["lanes"]) == [0, 1]
        assert any("joined with run" in p for p in model["problems"])
    (other,) = alone.values()
    assert "joined_runs" not in other["meta"] and [lane["rank"] for lane in other["lanes"]] == [0]
    # the exports of either per-node run carry both ranks' processes
    first = sorted(joined)[0]
    perfetto = json.loads(cli("export", first, "-f", "perfetto"))
    names = [e["args"]["name"] for e in perfetto["traceEvents"] if e.get("name") == "process_name"]
    assert sorted(n.rpartition(" pid ")[0] for n in names if "rank" in n) == ["worker rank 0", "worker rank 1"], names
    # compare matches the joined job's ranks against the other job's
    comparison = json.loads(cli("compare", first, next(iter(alone)), "--json"))
    assert comparison, "compare answered"
