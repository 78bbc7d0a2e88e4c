"""Report what is missing (issue 26): a launched child with no journal is named in the run's
`problems` with the reason the evidence gives (killed before tracing started in it, not a Python
process), and both the text report and the page show the problems."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
from st_service_helpers import start_server, wait_for

from starttrace.sources.journal_reader import read_run

PROGRAM = r"""
import json, os, signal, subprocess, sys
# a Python child killed before tracing started in it (interpreter start-up takes far longer)
killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
os.kill(killed.pid, signal.SIGKILL)
killed.wait()
# a child that is not Python, and one that is, traced
other = subprocess.Popen(["sh", "-c", "exit 0"])
other.wait()
traced = subprocess.Popen([sys.executable, "-c", "import json"])
traced.wait()
print(json.dumps({"killed": killed.pid, "other": other.pid, "traced": traced.pid}))
"""


def test_a_child_killed_before_tracing_started_is_named_in_problems(
    tmp_path: Path,
    venv_python: str,
    traced_env: dict[str, str],
    journal_root: Path,
    clean_env: Callable[..., dict[str, str]],
) -> None:
    done = subprocess.run([venv_python, "-c", PROGRAM], env=traced_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pids = json.loads(done.stdout)
    (run_dir,) = [p for p in journal_root.iterdir() if p.is_dir()]
    run = read_run(run_dir)
    assert pids["killed"] not in {p.pid for p in run.processes}  # it never got as far as its journal
    assert pids["traced"] in {p.pid for p in run.processes}
    killed = [p for p in run.problems if p.startswith(f"pid {pids['killed']} ")]
    assert len(killed) == 1 and "killed by signal 9 before tracing started" in killed[0], run.problems
    assert "has no journal" in killed[0] and "launched by main" in killed[0]
    other = [p for p in run.problems if p.startswith(f"pid {pids['other']} ")]
    assert len(other) == 1 and "not a Python process (sh)" in other[0], run.problems
    assert not [p for p in run.problems if p.startswith(f"pid {pids['traced']} ")]

    # the text report prints them
    env = clean_env(COLUMNS="400", NO_COLOR="1")
    report = subprocess.run(
        [venv_python, "-m", "starttrace", "report", run_dir.name, "--dir", str(journal_root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert f"pid {pids['killed']} launched by" in report.stdout and "killed by signal 9" in report.stdout
    as_json = json.loads(
        subprocess.run(
            [venv_python, "-m", "starttrace", "report", run_dir.name, "--dir", str(journal_root), "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        ).stdout
    )
    assert killed[0] in as_json["problems"]

    # and the service's page
    srv = start_server(tmp_path, "--journal-dir", str(journal_root))
    try:

        def page() -> str | None:
            r = httpx.get(f"{srv.url}/startup/{run_dir.name}", headers={"Accept": "text/html"}, timeout=30)
            return r.text if r.status_code == 200 else None

        html = wait_for(page, timeout=60)
        assert f"pid {pids['killed']} launched by" in html and "killed by signal 9 before tracing started" in html
        doc = httpx.get(f"{srv.url}/startup/{run_dir.name}", headers={"Accept": "application/json"}, timeout=30).json()
        assert killed[0] in doc["problems"]
    finally:
        srv.stop()
