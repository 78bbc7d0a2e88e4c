"""Activation's light case (starttrace/tracer/activation.py): with the C core, a process that needs
no probe at activation loads one starttrace module beyond the packages and the C core, writes the
same records as the whole activation in Python, and hands over to the Python recorder the moment
it is needed (a thread's import, importlib, a library with a probe, a fork), losing nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from run_spans import named, spans_of

from starttrace.sources.journal_reader import Process, Run, read_run

LIGHT_MODULES = ["starttrace", "starttrace.tracer", "starttrace.tracer._hotpath", "starttrace.tracer.activation"]

# The root starts a helper the way Inductor's `cdll.LoadLibrary` checks are started (a fresh
# interpreter that inherits the run), without importing subprocess (its probe would load).
ROOT = """
import json, os, sys
pid = os.posix_spawn(sys.executable, [sys.executable, "-c", sys.argv[1]], os.environ)
_, status = os.waitpid(pid, 0)
print(json.dumps({"status": status, "loaded": sorted(m for m in sys.modules if m.startswith("starttrace"))}))
"""
HELPER = """
import ctypes, json, sys
print(json.dumps({"loaded": sorted(m for m in sys.modules if m.startswith("starttrace"))}))
"""


def _c_core(venv_python: str) -> bool:
    probe = "import importlib.util as u; print(u.find_spec('starttrace.tracer._hotpath') is not None)"
    return subprocess.run([venv_python, "-c", probe], capture_output=True, text=True).stdout.strip() == "True"


def _run(venv_python: str, env: dict[str, str], runs: Path, *argv: str, pure: bool = False) -> tuple[list[Any], Run]:
    env = dict(env, STARTTRACE="1", STARTTRACE_DIR=str(runs))
    if pure:
        env["STARTTRACE_PURE_PYTHON"] = "1"
    done = subprocess.run([venv_python, *argv], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    outputs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return outputs, read_run(run_dir)


def _records(process: Process) -> list[tuple[Any, ...]]:
    """The process's records as they read apart from ids, times, pids and the hot path's own
    footprint: kind, name, attributes, error, in journal order."""
    assert process.journal_path is not None
    out: list[tuple[Any, ...]] = []
    for segment in sorted(process.journal_path.parent.glob(process.journal_path.name.split(".")[0] + ".*.journal")):
        for line in segment.read_bytes().rstrip(b"\0").splitlines():
            if line[:1] in (b"I", b"E"):
                out.append((line[:1].decode(), line.decode().partition(" ")[2]))
                continue
            record = json.loads(line)
            if record["k"] == "process":
                kept = {k: v for k, v in record.items() if k in ("k", "v", "argv", "service", "method", "python")}
                out.append(tuple(sorted(kept.items())))
                continue
            attrs = {k: v for k, v in (record.get("a") or {}).items() if not k.endswith(("_ns", "_us"))}
            out.append((record["k"], record.get("n"), json.dumps(attrs, sort_keys=True), record.get("err")))
    return out


@pytest.fixture
def c_core(venv_python: str) -> None:
    if not _c_core(venv_python):
        pytest.skip("the C core is not built here (no C compiler at install): there is no light case")


def test_a_light_process_loads_only_activation(
    c_core: None, venv_python: str, clean_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    outputs, run = _run(venv_python, clean_env(), tmp_path / "runs", "-c", ROOT, HELPER)
    helper_out, root_out = outputs
    assert root_out["status"] == 0
    assert root_out["loaded"] == LIGHT_MODULES
    assert helper_out["loaded"] == LIGHT_MODULES
    root, helper = sorted(run.processes, key=lambda p: p.record["method"] != "root")
    assert (root.record["method"], helper.record["method"]) == ("root", "exec")
    assert {p.record["hotpath"] for p in run.processes} == {"c"}
    # the helper's imports, recorded by the C hook alone (its trampolines never loaded the recorder)
    imported = {s.name for s in spans_of(run, helper) if s.name.startswith("import ")}
    assert {"import ctypes", "import _ctypes", "import struct"} <= imported
    for process in run.processes:
        assert process.resource["starttrace.probes.installed"] == ["imports", "multiprocessing"]
        (span,) = named(run, process, "process")
        assert span.end_ns is not None and span.attrs.get("process.exit_code") in (None, 0)


def test_light_and_python_activation_write_the_same_records(
    c_core: None, venv_python: str, clean_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    _, light = _run(venv_python, clean_env(), tmp_path / "light", "-c", ROOT, HELPER)
    _, python = _run(venv_python, clean_env(), tmp_path / "python", "-c", ROOT, HELPER, pure=True)

    def by_method(run: Run) -> dict[str, list[tuple[Any, ...]]]:
        return {p.record["method"]: _records(p) for p in run.processes}

    light_records, python_records = by_method(light), by_method(python)
    assert set(light_records) == {"root", "exec"}
    # the Python code loads `mmap` for its journal and credits the program's own import of it: the
    # helper's `import mmap` (ctypes does not import it) is not here, so the records are the same
    assert light_records == python_records
    first = light_records["exec"]
    assert dict(first[0])["k"] == "process"
    assert [r[0] for r in first[1:6]] == ["b", "b", "e", "attrs", "attrs"]  # process, python.init, identity, probes


PROGRAM = """
import importlib, json, os, sys, threading
sys.path.insert(0, sys.argv[1])
import before_any
loaded = lambda: sorted(m for m in sys.modules if m.startswith("starttrace.tracer."))
light = loaded()
{trigger}
print(json.dumps({{"light": light, "after": loaded()}}))
"""
TRIGGERS = {
    "thread": "t = threading.Thread(target=lambda: __import__('in_thread')); t.start(); t.join()",
    "importlib": "importlib.import_module('in_thread')",
    "probe": "import subprocess",
    "fork": "pid = os.fork()\nif pid == 0:\n    import in_thread\n    os._exit(0)\nos.waitpid(pid, 0)",
}


@pytest.mark.parametrize("trigger", sorted(TRIGGERS))
def test_the_recorder_takes_over_where_it_is_needed(
    c_core: None, venv_python: str, clean_env: Callable[..., dict[str, str]], tmp_path: Path, trigger: str
) -> None:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "before_any.py").write_text("")
    (mods / "in_thread.py").write_text("import in_thread_child\n")
    (mods / "in_thread_child.py").write_text("")
    program = textwrap.dedent(PROGRAM.format(trigger=TRIGGERS[trigger]))
    (out,), run = _run(venv_python, clean_env(), tmp_path / "runs", "-c", program, str(mods))
    assert out["light"] == ["starttrace.tracer._hotpath", "starttrace.tracer.activation"]
    assert "starttrace.tracer.recorder" in out["after"] and "starttrace.tracer.probes.imports" in out["after"]
    root = next(p for p in run.processes if p.record["method"] == "root")
    names = [s.name for s in spans_of(run, root)]
    # nothing of starttrace's own among the program's imports, and nothing of the program's lost
    assert not [n for n in names if n.startswith("import starttrace")]
    assert names.count("import before_any") == 1
    where = root if trigger != "fork" else next(p for p in run.processes if p.record["method"] == "fork")
    spans = {s.name: s for s in spans_of(run, where)}
    if trigger == "probe":
        assert "import subprocess" in spans
        assert "starttrace.tracer.probes.multiprocessing" in out["after"]
    else:
        child = spans["import in_thread_child"]
        assert spans["import in_thread"].span_id == child.parent_id
        assert (spans["import in_thread"].thread is not None) == (trigger == "thread")
        if trigger == "importlib":
            assert spans["import in_thread"].attrs.get("starttrace.import.via") == "importlib"
    (process_span,) = named(run, root, "process")
    assert process_span.end_ns is not None


def test_a_full_segment_goes_on_into_the_next_one_and_loses_no_record(
    c_core: None, venv_python: str, clean_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    """The light case opens the journal's next segments itself (sized as the journal writer sizes
    them): an import-heavy program without a probe's library stays light."""
    mods = tmp_path / "mods"
    mods.mkdir()
    count = 5000  # ~2 x 130 bytes each: more than the first two segments (256 + 512 KiB) hold
    for i in range(count):
        (mods / f"m_{i}.py").write_text("")
    program = (
        "import json, sys\nsys.path.insert(0, sys.argv[1])\nfor i in range(%d):\n    __import__('m_%%d' %% i)\n"
        "print(json.dumps({'loaded': sorted(m for m in sys.modules if m.startswith('starttrace'))}))\n"
    )
    ((out,), run) = _run(venv_python, clean_env(), tmp_path / "runs", "-c", program % count, str(mods))
    assert out["loaded"] == LIGHT_MODULES
    (root,) = run.processes
    assert run.problems == []
    names = [s.name for s in spans_of(run, root)]
    assert all(names.count(f"import m_{i}") == 1 for i in range(count))
    assert root.journal_path is not None
    segments = sorted(root.journal_path.parent.glob(f"{root.pid}-*.journal"))
    assert len(segments) >= 3
    assert [p.stat().st_size for p in segments[:3]] == [256 * 1024, 512 * 1024, 1024 * 1024]
    (process_span,) = named(run, root, "process")
    assert process_span.end_ns is not None


def test_a_light_root_on_a_read_only_folder_says_why_once(
    c_core: None, venv_python: str, clean_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    """The light case gives up and the whole activation says what failed, as before."""
    if os.geteuid() == 0:
        runs = tmp_path / "file-not-folder"
        runs.write_text("")  # root ignores permissions: a file where the folder should be
    else:
        runs = tmp_path / "ro"
        runs.mkdir(mode=0o500)
    env = dict(clean_env(), STARTTRACE="1", STARTTRACE_DIR=str(runs))
    done = subprocess.run([venv_python, "-c", "print('ran')"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "ran\n"
    said = [line for line in done.stderr.splitlines() if line.startswith("starttrace:")]
    assert len(said) == 1 and "tracing is off for this run" in said[0], done.stderr


def test_the_c_core_makes_the_recorders_span_ids(c_core: None) -> None:
    """The light case's span ids come from the C core, in the recorder's scheme (the same ids for
    the same block), so spans of the light case and of the recorder never collide in a process."""
    from starttrace.tracer import _hotpath, recorder  # type: ignore[attr-defined]

    block = 0xABCDEF12345678
    saved = recorder._Ids.block, recorder.span_ids
    try:
        recorder._Ids.block = block
        recorder.span_ids = iter(())
        python_ids = [recorder.new_span_id() for _ in range(256)]
    finally:
        recorder._Ids.block, recorder.span_ids = saved
    assert _hotpath.span_id_block(block) == python_ids
    assert python_ids[0] == "abcdef1234567800" and python_ids[-1] == "abcdef12345678ff"
    with pytest.raises(ValueError):
        _hotpath.span_id_block(1 << 56)
