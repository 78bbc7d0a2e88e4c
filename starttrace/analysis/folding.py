"""What the views fold: short helper processes, and the expected children that are not Python.

A real vLLM start has four lanes that matter (API server, engine core, the ranks) and a crowd of
short helpers: Inductor checks each compiled `.so` in a `python -c "cdll.LoadLibrary(...)"`
child (20 of them, 0.05 s each), vLLM inspects the model in a subprocess. A helper lane (not an
API server, engine core, forkserver nor rank) that lasted under `FOLD_SHARE` of the start folds,
with the helpers of the same kind under the same parent, into one row: "20 x python -c
(Inductor's .so check), 0.04-0.07 s each". The views expand a group on request (a click on the
page, `report --full`); the JSON keeps every lane and lists the groups (`folded`).

Launched programs that are not Python (g++, uname, lscpu) have no journal by design: they are one
note per program (`untraced_programs`), not warnings. `real_problems` is what is left: a journal
cut short, a process killed, a Python child that ran untraced.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections import Counter
from typing import Any

from starttrace.analysis.findings.common import launcher_lane
from starttrace.analysis.model import Lane, RunModel
from starttrace.run import NOT_PYTHON

FOLD_SHARE = 0.01
MAIN_ROLES = ("api_server", "engine_core", "forkserver", "worker")
# what a helper's command line says it is for, by a fragment of it
KNOWN_HELPERS = (
    ("cdll.LoadLibrary", "Inductor's .so check"),
    ("vllm.model_executor.models.registry", "vLLM's model inspection"),
    ("compile_worker", "Inductor's compile worker"),
    ("resource_tracker", "multiprocessing's resource tracker"),
)
_NOT_PYTHON = re.compile(rf"has no journal: {re.escape(NOT_PYTHON)} \((.+)\)$")


def command_kind(command: str | None) -> str:
    """A helper's command line as a kind: `python -c (Inductor's .so check)`, `python -m pkg`."""
    if not command:
        return "process"
    try:
        argv = shlex.split(command)
    except ValueError:
        argv = command.split()
    if not argv:
        return "process"
    prog = posixpath.basename(argv[0])
    if "python" in prog:
        prog = "python"
        if len(argv) > 1 and argv[1] == "-c":
            prog = "python -c"
        elif len(argv) > 2 and argv[1] == "-m":
            prog = f"python -m {argv[2]}"
        elif len(argv) > 1 and not argv[1].startswith("-"):
            prog = f"python {posixpath.basename(argv[1])}"
    known = next((note for fragment, note in KNOWN_HELPERS if fragment in command), None)
    return f"{prog} ({known})" if known else prog


def foldable(model: RunModel, lane: Lane) -> bool:
    """A short helper: not a main lane nor a rank, and under FOLD_SHARE of the start."""
    if lane.role in MAIN_ROLES or lane.rank is not None:
        return False
    start_ns = max(1, int(model.startup_s * 1e9))
    return (lane.end - lane.start) < FOLD_SHARE * start_ns


def fold_groups(model: RunModel) -> list[dict[str, Any]]:
    """The short helpers, grouped by parent lane and kind, in the order of their first start:
    `{parent, parent_label, kind, lanes, count, min_s, max_s, text}`."""
    groups: dict[tuple[int, str], list[Lane]] = {}
    for lane in sorted(model.lanes, key=lambda ln: (ln.start, ln.index)):
        if not foldable(model, lane):
            continue
        parent = launcher_lane(model, lane)
        key = (parent.index if parent is not None else -1, command_kind(lane.command))
        groups.setdefault(key, []).append(lane)
    out = []
    for (parent, kind), lanes in groups.items():
        times = [(ln.end - ln.start) / 1e9 for ln in lanes]
        lo, hi = min(times), max(times)
        each = f"{lo:.2f} s" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f} s"
        out.append(
            {
                "parent": None if parent < 0 else parent,
                "parent_label": None if parent < 0 else model.lanes[parent].label,
                "kind": kind,
                "lanes": [ln.index for ln in lanes],
                "count": len(lanes),
                "min_s": round(lo, 6),
                "max_s": round(hi, 6),
                "text": f"{len(lanes)} x {kind}, {each}" + (" each" if len(lanes) > 1 else ""),
            }
        )
    return out


def untraced_programs(model: RunModel) -> list[dict[str, Any]]:
    """Launched children that are not Python (expected: no journal), one entry per program."""
    programs: Counter[str] = Counter()
    for problem in model.problems:
        found = _NOT_PYTHON.search(problem)
        if found:
            programs[posixpath.basename(found.group(1))] += 1
    return [{"program": name, "count": n} for name, n in sorted(programs.items(), key=lambda kv: (-kv[1], kv[0]))]


def is_not_python(problem: str) -> bool:
    """A problem that says a launched child is not Python (expected: no journal)."""
    return bool(_NOT_PYTHON.search(problem))


def real_problems(model: RunModel) -> list[str]:
    """The run's problems but the expected ones (children that are not Python)."""
    return [p for p in model.problems if not is_not_python(p)]
