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
    from starttrace.tracer import _hotpath, journal, recorder  # type: ignore[attr-defined]

    block = 0xABCDEF12345678
    saved = recorder._block, recorder.span_ids, journal.hotpath

    def recorders_ids(hotpath: object) -> list[str]:
        journal.hotpath = hotpath
        recorder._block = block
        recorder.span_ids = iter(())
        return [recorder.new_span_id() for _ in range(257)]

    try:
        python_ids = recorders_ids(None)
        c_ids = recorders_ids(_hotpath)  # a process with the C core: the recorder has it make them
    finally:
        recorder._block, recorder.span_ids, journal.hotpath = saved
    assert python_ids[256] == c_ids[256] == f"{block + 1:014x}00"  # the next block
    python_ids, c_ids = python_ids[:256], c_ids[:256]
    assert _hotpath.span_id_block(block) == python_ids == c_ids
    assert python_ids[0] == "abcdef1234567800" and python_ids[-1] == "abcdef12345678ff"
    with pytest.raises(ValueError):
        _hotpath.span_id_block(1 << 56)


# What importlib sets on a module, read back as text; printed by a process for every starttrace
# module it holds.
MODULE_FACTS = """
import json, sys
def facts(module):
    spec = module.__spec__
    parent, _, child = module.__name__.rpartition(".")
    return {
        "file": module.__file__, "cached": module.__cached__, "package": module.__package__,
        "path": getattr(module, "__path__", None), "loader": type(module.__loader__).__name__,
        "loader_path": module.__loader__.path, "loader_is_spec's": module.__loader__ is spec.loader,
        "spec": [spec.name, spec.origin, spec.cached, spec.parent, spec.has_location, spec.submodule_search_locations],
        "bound": getattr(sys.modules[parent], child, None) is module,
        "first_line": __import__("inspect").getsource(module).splitlines()[0][:3],
        "code_file": module.__dict__[next(k for k, v in vars(module).items() if getattr(v, "__code__", None) is not None
                                          and getattr(v, "__module__", None) == module.__name__)].__code__.co_filename,
    }
"""

TORCH_LIKE = """
import json, sys
{facts}
import subprocess  # the multiprocessing probe loads: the recorder takes over
from starttrace.tracer import activation
names = [n for n in sys.modules if n.startswith("starttrace.tracer.") and n != "starttrace.tracer._hotpath"]
print(json.dumps({{"own": activation.loaded_own, "facts": {{n: facts(sys.modules[n]) for n in sorted(names)}}}}))
"""


def _facts_by_importlib(venv_python: str, names: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The same facts of the same modules, imported by importlib in an untraced process."""
    program = MODULE_FACTS + "\nimport importlib\nnames = %r\n" % (names,)
    program += "print(json.dumps({n: facts(importlib.import_module(n)) for n in names}))"
    env = {k: v for k, v in env.items() if not k.startswith("STARTTRACE")}
    done = subprocess.run(  # not in the checkout, whose starttrace `-c`'s path ('') would find first
        [venv_python, "-c", program], env=env, capture_output=True, text=True, timeout=120, cwd=env["PYTHONPATH"]
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _compiled_tree(venv_python: str, tmp_path: Path) -> Path:
    """A copy of starttrace with fresh bytecode caches (as pip writes them at install; a source
    tree's caches are as fresh as its last import, and never written under PYTHONDONTWRITEBYTECODE)."""
    import shutil

    import starttrace

    tree = tmp_path / "tree"
    shutil.copytree(Path(starttrace.__file__).parent, tree / "starttrace", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([venv_python, "-m", "compileall", "-q", str(tree)], check=True, timeout=120)
    return tree


def test_the_hand_over_loads_starttraces_modules_as_importlib_would(
    venv_python: str, clean_env: Callable[..., dict[str, str]], tmp_path: Path, c_core: None
) -> None:
    """The recorder, journal, probe loader, import probe and a probe load from their bytecode
    caches past importlib's search (`activation.load_own`), and each module is what importlib
    would have made: spec, loader, file, cache, package, bound on its parent, source found."""
    env = dict(clean_env(), PYTHONPATH=str(_compiled_tree(venv_python, tmp_path)))
    (out,), _ = _run(venv_python, env, tmp_path / "runs", "-c", TORCH_LIKE.format(facts=MODULE_FACTS))
    expected_own = [
        "starttrace.tracer.journal",
        "starttrace.tracer.recorder",
        "starttrace.tracer.lifecycle",
        "starttrace.tracer.probes",
        "starttrace.tracer.probes.imports",
        "starttrace.tracer.probes.multiprocessing",
    ]
    assert out["own"] == expected_own
    assert _facts_by_importlib(venv_python, sorted(out["facts"]), env) == out["facts"]


def test_a_stale_bytecode_cache_loads_through_importlib(
    venv_python: str, clean_env: Callable[..., dict[str, str]], tmp_path: Path, c_core: None
) -> None:
    """A cache that does not match its source (an edited file) is not used: importlib loads that
    module (and rewrites its cache); the others still load from theirs, and the run is recorded."""
    tree = _compiled_tree(venv_python, tmp_path)
    recorder_py = tree / "starttrace" / "tracer" / "recorder.py"
    recorder_py.write_text(recorder_py.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    env = dict(clean_env(), PYTHONPATH=str(tree))
    (out,), run = _run(venv_python, env, tmp_path / "runs", "-c", TORCH_LIKE.format(facts=MODULE_FACTS))
    assert "starttrace.tracer.recorder" not in out["own"]
    assert "starttrace.tracer.journal" in out["own"] and "starttrace.tracer.probes" in out["own"]
    assert out["facts"]["starttrace.tracer.recorder"]["file"] == str(recorder_py)
    assert out["facts"]["starttrace.tracer.recorder"]["bound"]
    # with -O no cache of this kind is read: importlib loads them all
    (out_o,), run_o = _run(venv_python, env, tmp_path / "runs-O", "-O", "-c", TORCH_LIKE.format(facts=MODULE_FACTS))
    assert out_o["own"] == []
    for recorded in (run, run_o):
        (process,) = recorded.processes
        names = [s.name for s in spans_of(recorded, process)]
        assert "import subprocess" in names and "import json" in names  # the program's, before and after
        assert not [n for n in names if "starttrace" in n]  # importlib loaded starttrace's, unrecorded


UNTRACKED = """
import gc, json, sys
import subprocess  # the hand-over, and the multiprocessing probe
from starttrace.tracer import activation, recorder
from starttrace.tracer.probes import multiprocessing as probe
own = [m for n, m in sorted(sys.modules.items())  # the packages hold a docstring each: left as they are
       if n.startswith("starttrace.tracer.") and n != "starttrace.tracer._hotpath"]
state = {
    "modules": sorted(m.__name__ for m in own if gc.is_tracked(m)),
    "functions": sorted(f"{m.__name__}.{k}" for m in own for k, v in vars(m).items()
                        if type(v).__name__ == "function" and v.__module__ == m.__name__ and v.__qualname__ == k
                        and gc.is_tracked(v)),
}
# garbage the program makes is collected as ever: a cycle through one of starttrace's functions too
import weakref
class Node:
    pass
node = Node(); node.me = node; node.f = recorder.active
alive = weakref.ref(node)
del node
gc.collect()
state["collected"] = alive() is None
subprocess.run([sys.executable, "-c", "pass"], check=True)  # the probe's wrappers, still working
print(json.dumps(state))
"""


def test_starttraces_own_modules_leave_the_garbage_collectors_lists(
    venv_python: str, clean_env: Callable[..., dict[str, str]], tmp_path: Path, c_core: None
) -> None:
    """With the C core, starttrace's modules, their dicts and functions are not tracked by the
    garbage collector (it would walk them at each collection of their generation and at exit); the
    program's garbage is collected as before, and the process ends with its journal complete. The
    Python code (no C core) leaves them tracked."""
    env = dict(clean_env(), PYTHONPATH=str(_compiled_tree(venv_python, tmp_path)))
    (out,), run = _run(venv_python, env, tmp_path / "runs", "-c", UNTRACKED)
    assert out == {"modules": [], "functions": [], "collected": True}
    root = next(p for p in run.processes if p.record["method"] == "root")
    (span,) = named(run, root, "process")
    assert span.end_ns is not None and span.attrs.get("process.exit_code") in (None, 0)
    assert len(run.processes) == 2  # the child the wrapped Popen started
    (pure,), _ = _run(venv_python, env, tmp_path / "pure", "-c", UNTRACKED, pure=True)
    assert pure["modules"] and pure["functions"] and pure["collected"]
