"""The built wheel (not the editable install) ships the .pth and traces a spawn child in a fresh
venv that has nothing else installed: the hot path needs only the standard library."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from starttrace.sources.journal_files import journal_files, journal_lines

REPO = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent(
    """
    import json, multiprocessing, sys

    def child(queue):
        mod = sys.modules.get("starttrace")
        activated = "starttrace.tracer.activation" in sys.modules
        queue.put({"starttrace": getattr(mod, "__file__", None), "activated": activated})

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(queue,))
        proc.start()
        seen = queue.get(timeout=60)
        proc.join(60)
        me = sys.modules.get("starttrace")
        print(json.dumps({"parent": getattr(me, "__file__", None), "child": seen, "code": proc.exitcode,
                          "pid": proc.pid, "path": sys.path}))
    """
)


@pytest.mark.parametrize("build", ["with the C core", "pure Python"])
def test_wheel_installs_pth_and_traces_spawn_children(
    venv_python: str, tmp_path: Path, clean_env: Callable[..., dict[str, str]], only_run_dir: Callable[[Path], Path],
    build: str,
) -> None:  # fmt: skip
    """Both wheels a user can get: built where a C compiler is (the C core inside, a platform tag),
    and without one (STARTTRACE_BUILD_PURE=1 stands in for a missing compiler: py3-none-any, no
    shared library even though the source tree has one built, the same records from the Python code)."""
    pure = build == "pure Python"
    dist = tmp_path / "dist"
    build_env = clean_env(STARTTRACE_BUILD_PURE="1") if pure else clean_env()
    done = subprocess.run(
        [venv_python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(REPO)],
        capture_output=True, text=True, timeout=180, env=build_env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (wheel,) = dist.glob("starttrace-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "starttrace.pth" in names, "the .pth must sit at the top level of the wheel (-> site-packages)"
        assert archive.read("starttrace.pth") == (REPO / "starttrace.pth").read_bytes()
        for module in (
            "activation.py",
            "boot.py",
            "lifecycle.py",
            "recorder.py",
            "journal.py",
            "probes/imports.py",
            "probes/multiprocessing.py",
            "probes/forkserver.py",
        ):
            assert f"starttrace/tracer/{module}" in names
        assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
        c_cores = sorted(
            n.rsplit("/", 1)[1].split(".")[0] for n in names if n.startswith("starttrace/") and n.endswith(".so")
        )
        # each C core sits beside its source (hatch_build.SOURCES): the hot path's in starttrace/tracer/
        beside = {"_hotpath": "starttrace/tracer/"}
        for n in names:
            if n.endswith(".so"):
                folder, _, file = n.rpartition("/")
                assert beside.get(file.split(".")[0]) == folder + "/", n
        c_core = "_hotpath" in c_cores
        if pure:
            assert c_cores == [] and wheel.name.endswith("-py3-none-any.whl"), (wheel.name, c_cores)
        elif shutil.which(os.environ.get("CC", "cc")) is not None:  # built where a compiler is (hatch_build.py)
            assert c_cores == ["_hotpath"], names  # C only on the traced program's hot path
            assert "-linux_" in wheel.name, f"a wheel with a C extension is not tagged py3-none-any: {wheel.name}"

    venv = tmp_path / "fresh venv"  # a space in the path, as users have
    base_python = getattr(sys, "_base_executable", None) or "python3"
    made = subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    install = subprocess.run(
        [venv_python, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        capture_output=True, text=True, timeout=180, env=clean_env(),
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    site_packages = next((venv / "lib").glob("python3*/site-packages"))
    assert (site_packages / "starttrace.pth").exists()
    assert not (site_packages / "opentelemetry").exists(), "the fresh venv must hold starttrace only"

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "prog.py").write_text(PROGRAM)
    root = tmp_path / "runs"
    env = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(root))
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run([str(python), "prog.py"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["code"] == 0
    assert not any(p.startswith(str(REPO)) for p in result["path"]), result["path"]
    for where in (result["parent"], result["child"]["starttrace"]):
        assert where is not None and Path(where).resolve().is_relative_to(site_packages.resolve()), where
        assert not Path(where).resolve().is_relative_to(REPO)
    assert result["child"]["activated"] is True

    run_dir = only_run_dir(root)
    records = {}
    for journal in journal_files(run_dir):  # either journal version (docs/journal.md)
        first = json.loads(journal_lines(journal)[0])
        records[first["pid"]] = first
    assert result["pid"] in records, "the spawn child wrote its own journal"
    methods = sorted(r["method"] for r in records.values())
    assert "root" in methods and "spawn" in methods, methods
    assert {r["exe"] for r in records.values()} == {str(python)}
    assert {r["hotpath"] for r in records.values()} == {"c" if c_core else "python"}
    child = records[result["pid"]]
    assert child["parent"] is not None and child["run"] == run_dir.name
