"""Liveness from evidence (issue 26): a run whose processes were SIGKILLed mid-import reads back
`killed`, never `running` or `stalled`, from the CLI (`runs`, `report`), the model and the service
alike; while the processes lived, the same run was `running` with a `stalled` finding."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import httpx
import polars as pl
from st_service_helpers import start_server, wait_for

from starttrace.analysis.lanes import build_model
from starttrace.analysis.liveness import run_status
from starttrace.sources.journal_reader import read_run

PROGRAM = """
import multiprocessing, os, sys, time

def rank():
    import slowmod

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    ranks = [ctx.Process(target=rank, name=f"rank-{i}") for i in range(2)]
    for r in ranks:
        r.start()
    import slowmod
"""


def _open_spans(doc: dict) -> list[str]:  # type: ignore[type-arg]
    return [row[2] for lane in doc["lanes"] for row in lane.get("spans", []) if row[5] is None]


def test_sigkilled_run_reads_back_killed_with_no_stalled(
    tmp_path: Path, venv_python: str, traced_env: dict[str, str], journal_root: Path
) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    (tmp_path / "slowmod.py").write_text(
        textwrap.dedent(
            f"""
            import os, time
            open(os.path.join({str(flags)!r}, str(os.getpid())), "w").close()
            time.sleep(120)
            """
        )
    )
    (tmp_path / "prog.py").write_text(PROGRAM)
    srv = start_server(tmp_path, "--journal-dir", str(journal_root), env={"STARTTRACE_STALL_S": "0.5"})
    env = {**traced_env, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen(
        [venv_python, str(tmp_path / "prog.py")], env=env, cwd=tmp_path, start_new_session=True, stderr=subprocess.PIPE
    )
    try:
        wait_for(lambda: len(list(flags.iterdir())) == 3, timeout=60)
        (run_dir,) = [p for p in journal_root.iterdir() if p.is_dir()]
        run_id = run_dir.name
        # alive: running, and the process stuck in its import is named stalled (the positive control)
        live = read_run(run_dir)
        assert run_status(live) == "running"
        time.sleep(0.6)
        model = build_model(live, stall_s=0.5)
        assert model.status == "running"
        assert any(f["kind"] == "stalled" for f in model.findings)

        def service_doc() -> dict | None:  # type: ignore[type-arg]
            r = httpx.get(f"{srv.url}/startup/{run_id}", headers={"Accept": "application/json"}, timeout=30)
            return r.json() if r.status_code == 200 else None

        seen = wait_for(lambda: (d := service_doc()) is not None and d["status"] == "running" and d, timeout=60)
        assert "import slowmod" in _open_spans(seen) or seen["lanes"]
        os.killpg(proc.pid, signal.SIGKILL)  # the whole tree, mid-import
        proc.wait(30)
        time.sleep(0.5)

        # the model (as `report` builds it)
        dead = read_run(run_dir)
        assert all(p.alive is False and not p.exited for p in dead.processes) and len(dead.processes) >= 3
        model = build_model(dead, stall_s=0.5)
        assert model.status == "killed"
        assert not [f for f in model.findings if f["kind"] == "stalled"]
        assert all(not lane.in_progress for lane in model.lanes)
        killed = [ln for ln in model.lanes if any(w.startswith("killed") for w in ln.warnings)]
        assert len(killed) == 3 and "main" in {ln.role for ln in killed}
        slow = model.nodes(model.spans.filter(pl.col("name") == "import slowmod"))
        assert len(slow) == 3 and all(n.end is not None and n.error and n.error.startswith("killed") for n in slow)
        assert model.t_end - model.t0 < 60e9  # ended at the last records, not now
        assert run_status(dead) == "killed"

        # the CLI: runs and report give the same status
        cli_env = {**{k: v for k, v in os.environ.items() if not k.startswith("STARTTRACE")}, "COLUMNS": "300"}
        cli_env["STARTTRACE_STALL_S"] = "0.5"

        def cli(*args: str) -> str:
            done = subprocess.run(
                [venv_python, "-m", "starttrace", *args, "--dir", str(journal_root)],
                capture_output=True,
                text=True,
                env=cli_env,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        rows = json.loads(cli("runs", "--json"))
        assert [(r["run_id"], r["status"]) for r in rows] == [(run_id, "killed")]
        report = json.loads(cli("report", run_id, "--json"))
        assert report["status"] == "killed"
        assert not [f for f in report["findings"] if f["kind"] == "stalled"]
        text = cli("report", run_id)
        assert "killed" in text and "stalled" not in text

        # the service: its watcher sees the pids die (no journal file changed) and says the same
        doc = wait_for(lambda: (d := service_doc()) is not None and d["status"] == "killed" and d, timeout=30)
        assert not [f for f in doc["findings"] if f["kind"] == "stalled"]
        assert _open_spans(doc) == []
        # exports end the killed processes' open spans where the model does, and do not change
        first = httpx.get(f"{srv.url}/runs/{run_id}/export?format=jaeger", timeout=60)
        time.sleep(1.2)
        again = httpx.get(f"{srv.url}/runs/{run_id}/export?format=jaeger", timeout=60)
        assert first.status_code == 200 and first.content == again.content
        slow_spans = [s for t in first.json()["data"] for s in t["spans"] if s["operationName"] == "import slowmod"]
        assert len(slow_spans) == 3 and all(s["duration"] < 60e6 for s in slow_spans)  # µs
        listed = httpx.get(f"{srv.url}/runs", headers={"Accept": "application/json"}, timeout=30).json()["runs"]
        assert [r.get("status") for r in listed if r["run_id"] == run_id] in ([None], ["killed"])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        srv.stop()


def test_a_reused_pid_is_not_the_same_process(tmp_path: Path) -> None:
    """A pid that is alive but started at another time is another process: not running."""
    from starttrace.sources.journal_reader import process_alive
    from starttrace.tracer.activation import process_start_monotonic

    me = process_start_monotonic(os.getpid())
    assert me is not None
    assert process_alive(os.getpid(), me[0], "") is True
    assert process_alive(os.getpid(), me[0] - 10 * 10**9, "") is False  # same pid, an earlier process
    assert process_alive(os.getpid(), me[0], "some-other-host") is None  # cannot tell


def test_a_journal_cut_short_reads_back_lost(tmp_path: Path, venv_python: str, traced_env: dict[str, str]) -> None:
    """RLIMIT_FSIZE fails the journal's next segment like a full disk: the process runs on and
    exits, its exit unrecorded. It reads back `lost` (not running, not killed), its open spans end
    at its last record, and the text report names the cut journal."""
    mods = tmp_path / "mods"
    mods.mkdir()
    for i in range(1500):
        (mods / f"filler_module_with_a_rather_long_name_{i:04d}.py").write_text("X = 1\n")
    program = (
        "import resource, signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))\n"
        "for i in range(1500):\n"
        "    __import__(f'filler_module_with_a_rather_long_name_{i:04d}')\n"
    )
    env = {**traced_env, "PYTHONPATH": str(mods), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([venv_python, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    root = Path(traced_env["STARTTRACE_DIR"])
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    run = read_run(run_dir)
    assert run_status(run) == "lost"
    model = build_model(run, stall_s=0.1)
    assert model.status == "lost" and not model.lanes[0].in_progress
    assert any(w.startswith("lost") for w in model.lanes[0].warnings)
    assert not [f for f in model.findings if f["kind"] == "stalled"]
    env_cli = {k: v for k, v in traced_env.items() if not k.startswith("STARTTRACE")} | {"COLUMNS": "300"}
    text = subprocess.run(
        [venv_python, "-m", "starttrace", "report", run_dir.name, "--dir", str(root)],
        capture_output=True,
        text=True,
        env=env_cli,
        timeout=120,
    ).stdout
    assert "status lost" in text and "cut short" in text and "cannot extend journal" in text
