"""The C core of the hot path (starttrace/tracer/_hotpath.c) records exactly what the Python code does.

One program exercises every case the import hook knows: plain imports (nested), `importlib`, a
thread, a failing import, a module without a file, a path with a newline, a path that is not
UTF-8, a non-ASCII name, a module a probe waits for (`subprocess`: the multiprocessing probe loads
then), `mmap` (the Python code maps its journal with it and credits the program's import; the C
core maps the journal itself), a fork in the middle of an import and enough spans to fill the
first journal segment. It runs traced twice, with the C core and with STARTTRACE_PURE_PYTHON=1,
and the two journals must say the same thing, record kind by record kind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from run_spans import named, spans_of

from starttrace.sources.journal_reader import Run, read_run

MODULES = 2500  # ~2 x 130 bytes each: more than the first 256 KiB segment holds

PROGRAM = """
import importlib, os, sys, threading
base = sys.argv[1]
sys.path[:0] = [os.path.join(base, "plain"), os.path.join(base, "odd\\nfolder"),
                os.fsdecode(os.path.join(os.fsencode(base), b"bytes\\xff"))]
for i in range({count}):
    __import__("plain_%d" % i)
import pkg.sub
importlib.import_module("via_importlib")
thread = threading.Thread(target=lambda: __import__("in_thread"))
thread.start(); thread.join()
try:
    import broken
except ValueError:
    pass
import mod\u00fcl\u00e9, newline_mod, bytes_mod, mmap, forks, subprocess
builtin = sorted(set(sys.builtin_module_names) - set(sys.modules))
if builtin:
    __import__(builtin[0])
print(os.getpid(), builtin[:1])
"""


def _write_modules(base: Path) -> None:
    plain = base / "plain"
    plain.mkdir()
    for i in range(MODULES):
        (plain / f"plain_{i}.py").write_text(f"VALUE = {i}\n")
    (plain / "pkg").mkdir()
    (plain / "pkg" / "__init__.py").write_text("import pkg_helper\n")
    (plain / "pkg" / "sub.py").write_text("import json\n")
    (plain / "pkg_helper.py").write_text("")
    (plain / "via_importlib.py").write_text("import via_importlib_child\n")
    (plain / "via_importlib_child.py").write_text("")
    (plain / "in_thread.py").write_text("import in_thread_child\n")
    (plain / "in_thread_child.py").write_text("")
    (plain / "broken.py").write_text("import broken_child\nraise ValueError('broken on purpose')\n")
    (plain / "broken_child.py").write_text("")
    (plain / "mod\u00fcl\u00e9.py").write_text("")
    (plain / "forks.py").write_text(
        "import os\npid = os.fork()\nif pid == 0:\n    import child_only\n    os._exit(0)\nos.waitpid(pid, 0)\n"
    )
    (plain / "child_only.py").write_text("")
    odd = base / "odd\nfolder"
    odd.mkdir()
    (odd / "newline_mod.py").write_text("")
    raw = os.path.join(os.fsencode(base), b"bytes\xff")
    os.mkdir(raw)
    with open(os.path.join(raw, b"bytes_mod.py"), "w") as f:
        f.write("")


def _traced(venv_python: str, base: Path, env: dict[str, str], pure: bool) -> Run:
    runs = base / ("runs-pure" if pure else "runs-c")
    runs.mkdir()
    env = dict(env, STARTTRACE="1", STARTTRACE_DIR=str(runs), PYTHONDONTWRITEBYTECODE="1")
    if pure:
        env["STARTTRACE_PURE_PYTHON"] = "1"
    program = textwrap.dedent(PROGRAM.format(count=MODULES))
    done = subprocess.run([venv_python, "-c", program, str(base)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("starttrace:") and "tracing run" not in line]
    assert not said, done.stderr
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    return read_run(run_dir)


def _imports(run: Run, credit: bool = True) -> dict[str, Counter[tuple[object, ...]]]:
    """Per process (root or fork child): every import span, as what it says apart from ids and times
    (and whether starttrace credited it its own load of the module, unless `credit` is False)."""
    out: dict[str, Counter[tuple[object, ...]]] = {}
    for process in run.processes:
        own = spans_of(run, process)
        by_id = {s.span_id: s for s in own}
        kind = process.record.get("method", "?")
        spans: Counter[tuple[object, ...]] = Counter()
        for s in own:
            if s.attrs.get("starttrace.phase") != "import":
                continue
            parent = by_id.get(s.parent_id or "")
            attrs = {k: v for k, v in s.attrs.items() if not k.endswith(("_ns", "_us"))}
            spans[
                (
                    s.name,
                    parent.name if parent is not None else "(process)",
                    tuple(sorted(attrs.items())),
                    s.error,
                    s.thread is not None,
                    s.end_ns is None,
                    credit and "starttrace.import.footprint_ns" in s.attrs,
                )
            ] += 1
        out[kind] = spans
    return out


def _record_kinds(run: Run) -> dict[str, Counter[str]]:
    kinds: dict[str, Counter[str]] = {}
    for process in run.processes:
        assert process.journal_path is not None
        counter: Counter[str] = Counter()
        for segment in sorted(process.journal_path.parent.glob(process.journal_path.name.split(".")[0] + ".*.journal")):
            for line in segment.read_bytes().rstrip(b"\0").splitlines():
                if line[:1] in (b"I", b"E"):
                    counter[line[:1].decode()] += 1
                elif line.startswith(b'{"k":"'):
                    counter[line[6:].split(b'"')[0].decode()] += 1
        kinds[process.record.get("method", "?")] = counter
    return kinds


@pytest.fixture(scope="module")
def both_runs(venv_python: str, tmp_path_factory: pytest.TempPathFactory,
              clean_env: Callable[..., dict[str, str]]) -> tuple[Run, Run]:  # fmt: skip
    base = tmp_path_factory.mktemp("hotpath")
    _write_modules(base)
    return _traced(venv_python, base, clean_env(), pure=False), _traced(venv_python, base, clean_env(), pure=True)


def test_the_c_core_is_built_and_used(venv_python: str, both_runs: tuple[Run, Run]) -> None:
    """Where a C compiler is installed (CI: gcc), the install built the C core and tracing uses it."""
    with_c, pure = both_runs
    built = subprocess.run(
        [venv_python, "-c", "import importlib.util as u; print(u.find_spec('starttrace.tracer._hotpath') is not None)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if shutil.which(os.environ.get("CC", "cc")) is not None:
        assert built == "True", (
            "a C compiler is here, but `pip install -e .` did not build starttrace/tracer/_hotpath.c"
        )
    if built == "True":
        assert {p.record.get("hotpath") for p in with_c.processes} == {"c"}
    assert {p.record.get("hotpath") for p in pure.processes} == {"python"}


def _credited(imports: dict[str, Counter[tuple[object, ...]]], module: str) -> list[bool]:
    return [key[-1] for key in imports["root"] if key[0] == f"import {module}"]  # type: ignore[misc]


def test_c_and_python_record_the_same_import_spans(both_runs: tuple[Run, Run]) -> None:
    with_c, pure = both_runs
    c_imports, pure_imports = _imports(with_c), _imports(pure)
    assert set(c_imports) == {"root", "fork"}
    # the one difference: the Python code loaded mmap for its journal and credits the program's import
    if {p.record.get("hotpath") for p in with_c.processes} == {"c"}:
        assert (_credited(c_imports, "mmap"), _credited(pure_imports, "mmap")) == ([False], [True])
        c_imports, pure_imports = _imports(with_c, credit=False), _imports(pure, credit=False)
    assert c_imports == pure_imports
    root = c_imports["root"]
    names = Counter(key[0] for key in root.elements())
    for module in ("import plain_0", f"import plain_{MODULES - 1}", "import pkg.sub", "import via_importlib",
                   "import in_thread_child", "import broken", "import mod\u00fcl\u00e9", "import newline_mod",
                   "import bytes_mod", "import mmap", "import forks", "import subprocess"):  # fmt: skip
        assert names[module] == 1, module
    assert "import child_only" in Counter(key[0] for key in c_imports["fork"].elements())


def test_c_and_python_write_the_same_records(both_runs: tuple[Run, Run]) -> None:
    """Compact `I`/`E` where the Python code writes them, JSON records where it does, across segments."""
    with_c, pure = both_runs
    c_kinds, pure_kinds = _record_kinds(with_c), _record_kinds(pure)
    if {p.record.get("hotpath") for p in with_c.processes} == {"c"}:
        # the Python code's credit on `import mmap` makes its end a JSON record (see above)
        pure_kinds["root"]["E"] += 1
        pure_kinds["root"]["e"] -= 1
    assert c_kinds == pure_kinds
    assert c_kinds["root"]["I"] >= MODULES and c_kinds["root"]["E"] >= MODULES
    root = next(p for p in with_c.processes if p.record.get("method") == "root")
    assert root.journal_path is not None
    assert len(list(root.journal_path.parent.glob(f"{root.pid}-*.journal"))) >= 2, "the first segment never filled"


def test_the_c_core_keeps_the_program_s_exception(both_runs: tuple[Run, Run]) -> None:
    with_c, _ = both_runs
    root = next(p for p in with_c.processes if p.record.get("method") == "root")
    broken = named(with_c, root, "import broken")[0]
    assert broken.error == "ValueError: broken on purpose"
    child = named(with_c, root, "import broken_child")[0]
    assert child.parent_id == broken.span_id and child.error is None


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("journals are Linux-only")
