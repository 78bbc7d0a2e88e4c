"""Waits on other processes, in a real traced tree: `subprocess.run` records a `process.wait`
span naming the child's pid, the root's breakdown counts that time as `wait`, and the critical
path goes into the child waited for (its time with no span of its own included), its steps adding
up to the run's length."""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from run_spans import named

from starttrace.analysis.lanes import build_model
from starttrace.sources.journal_reader import read_run

PROGRAM = r"""
import json, subprocess, sys
done = subprocess.run([sys.executable, "-c", "import json, time; time.sleep(0.8); print('x')"], capture_output=True)
print(json.dumps({"rc": done.returncode, "out": done.stdout.decode().strip()}))
"""


def test_a_subprocess_waited_for_is_on_the_critical_path(
    venv_python: str, traced_env: dict[str, str], journal_root: Path, only_run_dir: Callable[[Path], Path]
) -> None:
    proc = subprocess.run([venv_python, "-c", PROGRAM], env=traced_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"rc": 0, "out": "x"}
    run = read_run(only_run_dir(journal_root))
    m = build_model(run)
    root = next(lane for lane in m.lanes if lane.start_method == "root")
    child = next(lane for lane in m.lanes if lane is not root)
    (wait,) = m.select(names=("process.wait",), lane=root)
    assert wait.attrs["starttrace.child_pid"] == child.pid
    assert wait.attrs["starttrace.wait.call"] == "Popen.communicate"
    assert wait.attrs["process.exit_code"] == 0
    assert wait.duration >= 0.8e9
    # the root's breakdown: the wait is `wait`, and the parts add up to the root's window
    assert sum(root.breakdown.values()) == root.end - root.start
    assert root.breakdown["wait"] >= 0.75e9
    # the path: into the child (its sleep, no span of its own, is its time), back at its exit
    path = m.critical_path
    assert all(a.end == b.start for a, b in itertools.pairwise(path))
    assert path[0].start == m.t0 and path[-1].end == m.t_end
    in_child = sum(st.end - st.start for st in path if st.lane == child.index)
    assert in_child >= 0.8e9, [(st.lane, st.name, st.kind, (st.end - st.start) / 1e9) for st in path]
    assert sum(st.end - st.start for st in path if st.name == "process.wait") < 0.1e9


POLLING = r"""
import subprocess, sys
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
polls = 0
while True:
    try:
        p.wait(timeout=0.02)
        break
    except subprocess.TimeoutExpired:
        polls += 1
print(polls)
q = subprocess.Popen([sys.executable, "-c", "pass"])
q.wait()
"""


def test_a_polling_loop_is_not_a_span_per_turn(
    venv_python: str, traced_env: dict[str, str], journal_root: Path, only_run_dir: Callable[[Path], Path]
) -> None:
    proc = subprocess.run([venv_python, "-c", POLLING], env=traced_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip().splitlines()[-1]) >= 5, "the loop polled"
    run = read_run(only_run_dir(journal_root))
    root = next(p for p in run.processes if p.record.get("method") == "root")
    waits = named(run, root, "process.wait")
    assert [s.attrs["starttrace.wait.call"] for s in waits] == ["Popen.wait"]  # q.wait() only
