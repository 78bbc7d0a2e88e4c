"""Zero footprint: activation leaves no module in sys.modules that the traced program could import
later, other than starttrace's own, so the program's own imports are recorded as `-X importtime`
prints them untraced. What activation had to load for itself (atexit, mmap, __future__ from a
probe) it removes again and names in the process record (docs/journal.md, "footprint")."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from run_spans import spans_of

from starttrace.sources.journal_reader import read_run

IMPORTTIME_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|\s*(\S+)\s*$")
# what `python -c` imports before the command runs (after activation): 3.13 registers the command's
# source in linecache for tracebacks
RUN_COMMAND_IMPORTS = {"linecache"} if sys.version_info >= (3, 13) else set()


def _modules_at_start(venv_python: str, env: dict[str, str]) -> set[str]:
    program = "import sys; print(sorted(sys.modules))"
    done = subprocess.run([venv_python, "-c", program], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return set(ast.literal_eval(done.stdout))


def test_activation_adds_no_module_but_its_own(
    venv_python: str, traced_env: dict[str, str], clean_env: Callable[..., dict[str, str]]
) -> None:
    untraced = _modules_at_start(venv_python, clean_env())
    traced = _modules_at_start(venv_python, traced_env)
    assert "starttrace.tracer.activation" in traced
    assert {m for m in traced - untraced if m != "starttrace" and not m.startswith("starttrace.")} == set()
    assert untraced - traced == set()
    for name in ("__future__", "atexit", "mmap", "typing", "json", "threading"):
        assert name not in traced


PROGRAM = """
import sys
sys.path.insert(0, {mods!r})
import uses_future, uses_atexit, uses_mmap
print("ok", uses_atexit.registered, uses_mmap.size)
"""


def _program_modules(tmp_path: Path) -> Path:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "uses_future.py").write_text("from __future__ import annotations\n\ndef f(x: Undefined) -> None: ...\n")
    (mods / "uses_atexit.py").write_text(
        "import atexit\nregistered = True\natexit.register(lambda: print('program atexit ran'))\n"
    )
    (mods / "uses_mmap.py").write_text("import mmap\nsize = len(mmap.mmap(-1, 4096))\n")
    return mods


def test_imports_match_importtime_of_the_untraced_program(
    venv_python: str, tmp_path: Path, traced_env: dict[str, str], journal_root: Path,
    clean_env: Callable[..., dict[str, str]], only_run_dir: Callable[[Path], Path],
) -> None:  # fmt: skip
    """Ground truth: the modules `python -X importtime` prints for the untraced program are the
    modules the traced run records, `__future__`, `atexit` and `mmap` included."""
    program = PROGRAM.format(mods=str(_program_modules(tmp_path)))
    untraced = subprocess.run(
        [venv_python, "-X", "importtime", "-c", program], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert untraced.returncode == 0, untraced.stderr
    # there at the command's start, but imported after activation (and printed by -X importtime)
    at_start = _modules_at_start(venv_python, clean_env()) - RUN_COMMAND_IMPORTS
    truth = {m.group(3) for line in untraced.stderr.splitlines() if (m := IMPORTTIME_LINE.match(line))}
    truth = {m for m in truth - at_start if "customize" not in m}  # site's own (sitecustomize), traced or not
    assert {"__future__", "atexit", "mmap", "uses_future", "uses_atexit", "uses_mmap"} <= truth

    traced = subprocess.run([venv_python, "-c", program], env=traced_env, capture_output=True, text=True, timeout=60)
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == untraced.stdout == "ok True 4096\nprogram atexit ran\n"
    run = read_run(only_run_dir(journal_root))
    assert run.problems == []
    (process,) = run.processes
    recorded = {
        s.attrs["starttrace.import.module"]
        for s in spans_of(run, process)
        if s.attrs.get("starttrace.phase") == "import" and "customize" not in s.name  # site's own tries
    }
    assert recorded == truth
    assert process.exited, "starttrace's own exit hook still ran (atexit hidden, not gone)"


@pytest.mark.parametrize("pure", [False, True], ids=["c-core", "python"])
def test_process_record_names_the_footprint_and_credits_the_first_importer(
    venv_python: str, tmp_path: Path, traced_env: dict[str, str], journal_root: Path,
    only_run_dir: Callable[[Path], Path], pure: bool,
) -> None:  # fmt: skip
    """The Python code maps journal segments with `mmap`; the C core maps them itself, so there
    `mmap` is not starttrace's footprint and the program's first import of it is credited nothing."""
    program = PROGRAM.format(mods=str(_program_modules(tmp_path)))
    env = dict(traced_env, STARTTRACE_PURE_PYTHON="1" if pure else "0")
    done = subprocess.run([venv_python, "-c", program], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    run = read_run(only_run_dir(journal_root))
    (process,) = run.processes
    footprint = process.record["footprint"]
    maps_itself = process.record["hotpath"] == "c"
    if not pure and not maps_itself:
        pytest.skip("the C core is not built here")
    expected = {"atexit"} if maps_itself else {"atexit", "mmap"}
    assert set(footprint) == expected | {"__future__"} or set(footprint) == expected
    assert isinstance(footprint["atexit"], int) and footprint["atexit"] > 0
    assert not set(footprint) & set(process.preloaded), "hidden again: not in sys.modules at activation"
    imports = [s for s in spans_of(run, process) if s.attrs.get("starttrace.phase") == "import"]
    spans = {s.attrs["starttrace.import.module"]: s for s in imports}
    if maps_itself:
        assert "starttrace.import.footprint_ns" not in spans["mmap"].attrs
    else:
        # the program's first importer of mmap gets what starttrace's own load of its shared library cost
        assert isinstance(footprint["mmap"], int) and footprint["mmap"] > 0
        assert spans["mmap"].attrs["starttrace.import.footprint_ns"] == footprint["mmap"]
    assert spans["mmap"].parent_id == spans["uses_mmap"].span_id
    assert spans["atexit"].parent_id == spans["uses_atexit"].span_id
    assert "starttrace.import.footprint_ns" not in spans["atexit"].attrs  # a builtin module costs the same again
    assert spans["__future__"].parent_id == spans["uses_future"].span_id
