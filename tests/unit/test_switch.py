"""The switch (STARTTRACE / VLLM_STARTTRACE through the .pth line), trace-context adoption, service
names and STARTTRACE_MIN_IMPORT_US, each in a real interpreter started the way users start one."""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from run_spans import named, spans_of

from starttrace.sources.journal_files import journal_files
from starttrace.sources.journal_reader import read_run

PROBE = "import sys; print('starttrace.tracer.activation' in sys.modules, 'starttrace' in sys.modules)"


def _python(
    venv_python: str, args: list[str], env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([venv_python, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("value", ["1", "true", "ON", "yes", " True "])
def test_on_values_record_a_run(
    venv_python: str,
    clean_env: Callable[..., dict[str, str]],
    only_run_dir: Callable[[Path], Path],
    journal_root: Path,
    value: str,
) -> None:
    proc = _python(venv_python, ["-c", PROBE], clean_env(STARTTRACE=value, STARTTRACE_DIR=str(journal_root)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]
    run_dir = only_run_dir(journal_root)
    assert (run_dir / "run.json").exists()
    assert len(journal_files(run_dir)) == 1
    assert f"starttrace: tracing run {run_dir.name}" in proc.stderr


def test_vllm_switch_alone(
    venv_python: str, clean_env: Callable[..., dict[str, str]], only_run_dir: Callable[[Path], Path], journal_root: Path
) -> None:
    proc = _python(venv_python, ["-c", "import json"], clean_env(VLLM_STARTTRACE="1", STARTTRACE_DIR=str(journal_root)))
    assert proc.returncode == 0, proc.stderr
    run = read_run(only_run_dir(journal_root))
    assert named(run, run.processes[0], "import json")


@pytest.mark.parametrize("value", [None, "0", "false", "OFF", "no", ""])
def test_off_values_write_nothing_and_load_nothing(
    venv_python: str,
    clean_env: Callable[..., dict[str, str]],
    only_run_dir: Callable[[Path], Path],
    journal_root: Path,
    value: str | None,
) -> None:
    env = clean_env(STARTTRACE_DIR=str(journal_root))
    if value is not None:
        env["STARTTRACE"] = value
    proc = _python(venv_python, ["-c", PROBE], env)
    assert proc.returncode == 0, proc.stderr
    assert list(journal_root.iterdir()) == []
    assert proc.stderr == ""
    # Switched off, the .pth line only reads the environment: not one starttrace module is loaded.
    assert proc.stdout.split() == ["False", "False"]


def test_off_wins_over_vllm_switch(
    venv_python: str, clean_env: Callable[..., dict[str, str]], only_run_dir: Callable[[Path], Path], journal_root: Path
) -> None:
    env = clean_env(STARTTRACE="0", VLLM_STARTTRACE="1", STARTTRACE_DIR=str(journal_root))
    proc = _python(venv_python, ["-c", "pass"], env)
    assert proc.returncode == 0 and list(journal_root.iterdir()) == []


def test_invalid_value_warns_once_and_stays_off(
    venv_python: str, clean_env: Callable[..., dict[str, str]], only_run_dir: Callable[[Path], Path], journal_root: Path
) -> None:
    proc = _python(venv_python, ["-c", "print('ran')"], clean_env(STARTTRACE="maybe", STARTTRACE_DIR=str(journal_root)))
    assert proc.returncode == 0
    assert proc.stdout == "ran\n"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one warning line, got: {lines}"
    assert "maybe" in lines[0] and "STARTTRACE" in lines[0]
    assert list(journal_root.iterdir()) == []


def test_unwritable_journal_dir_never_breaks_the_program(
    venv_python: str, clean_env: Callable[..., dict[str, str]], only_run_dir: Callable[[Path], Path], tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(blocker / "runs"))
    proc = _python(venv_python, ["-c", "import json, sys; print(json.dumps([1])); sys.exit(4)"], env)
    assert proc.returncode == 4
    assert proc.stdout == "[1]\n"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("starttrace:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


# --- trace context -----------------------------------------------------------------------------

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
CHILD_ENV = textwrap.dedent(
    """
    import os, subprocess, sys
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('traceparent'))"],
                         capture_output=True, text=True).stdout.strip()
    print(out)
    """
)


@pytest.mark.parametrize("header", ["TRACEPARENT", "traceparent"])
def test_incoming_traceparent_is_adopted(
    venv_python: str,
    clean_env: Callable[..., dict[str, str]],
    only_run_dir: Callable[[Path], Path],
    journal_root: Path,
    header: str,
) -> None:
    env = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(journal_root), **{header: f"00-{TRACE.upper()}-{SPAN}-01"})
    proc = _python(venv_python, ["-c", CHILD_ENV], env)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(journal_root)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["trace_id"] == TRACE
    assert meta["parent_span_id"] == SPAN
    run = read_run(run_dir)
    assert run.trace_id == TRACE
    assert run.startup is not None and run.startup.parent_id == SPAN
    # children (vLLM's own OTel spans included) join the same trace under the run's root span
    assert proc.stdout.strip() == f"00-{TRACE}-{meta['root_span_id']}-01"
    assert len(run.processes) == 2, "the subprocess child is traced in the same run"
    assert {p.record["trace"] for p in run.processes} == {TRACE}


@pytest.mark.parametrize(
    "bad", ["00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-xyz-00f067aa0ba902b7-01", "garbage"]
)
def test_invalid_traceparent_starts_a_new_trace(
    venv_python: str,
    clean_env: Callable[..., dict[str, str]],
    only_run_dir: Callable[[Path], Path],
    journal_root: Path,
    bad: str,
) -> None:
    proc = _python(
        venv_python, ["-c", "pass"], clean_env(STARTTRACE="1", STARTTRACE_DIR=str(journal_root), TRACEPARENT=bad)
    )
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((only_run_dir(journal_root) / "run.json").read_text())
    assert meta["parent_span_id"] is None
    assert len(meta["trace_id"]) == 32 and int(meta["trace_id"], 16) != 0 and meta["trace_id"] != TRACE


# --- service names -----------------------------------------------------------------------------


def _service(run_dir: Path) -> str:
    meta = json.loads((run_dir / "run.json").read_text())
    run = read_run(run_dir)
    assert {p.resource["service.name"] for p in run.processes} == {meta["service"]}
    return meta["service"]


def test_service_name_precedence(
    venv_python: str, clean_env: Callable[..., dict[str, str]], only_run_dir: Callable[[Path], Path], tmp_path: Path
) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "server.py").write_text("print('served')\n")
    (tmp_path / "launch_me.py").write_text("print('script')\n")
    cases = [
        ({"STARTTRACE_SERVICE_NAME": "explicit", "OTEL_SERVICE_NAME": "otel"}, ["-c", "pass"], "explicit"),
        ({"OTEL_SERVICE_NAME": "otel"}, ["-m", "mypkg.server"], "otel"),
        ({}, ["-m", "mypkg.server"], "mypkg"),
        ({}, [str(tmp_path / "launch_me.py")], "launch_me"),
    ]
    for index, (extra, args, expected) in enumerate(cases):
        root = tmp_path / f"runs{index}"
        proc = _python(venv_python, args, clean_env(STARTTRACE="1", STARTTRACE_DIR=str(root), **extra), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert _service(only_run_dir(root)) == expected, (extra, args)


# --- STARTTRACE_MIN_IMPORT_US --------------------------------------------------------------------


def test_min_import_us_keeps_only_long_imports_with_their_chain(
    venv_python: str, clean_env: Callable[..., dict[str, str]], only_run_dir: Callable[[Path], Path], tmp_path: Path
) -> None:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "outer_mod.py").write_text("import quick_mod\nimport middle_mod\n")
    (mods / "quick_mod.py").write_text("X = 1\n")
    (mods / "middle_mod.py").write_text("import json\nimport slow_mod\n")
    (mods / "slow_mod.py").write_text("import time\ntime.sleep(1.2)\nimport decimal\n")
    root = tmp_path / "runs"
    env = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(root), STARTTRACE_MIN_IMPORT_US="1000000", PYTHONPATH=str(mods))
    program = "import email.parser, fractions, outer_mod, statistics; print('ok')"
    proc = _python(venv_python, ["-c", program], env)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr
    run = read_run(only_run_dir(root))
    assert run.problems == []
    (process,) = run.processes
    imports = {s.name: s for s in spans_of(run, process) if s.attrs.get("starttrace.phase") == "import"}
    assert {"import outer_mod", "import middle_mod", "import slow_mod"} <= set(imports)
    assert len(imports) <= 4, f"only the >1 s imports (and maybe one stray) may remain: {sorted(imports)}"
    for dropped in ("import quick_mod", "import json", "import decimal", "import email.parser", "import fractions"):
        assert dropped not in imports
    outer, middle, slow = imports["import outer_mod"], imports["import middle_mod"], imports["import slow_mod"]
    assert slow.parent_id == middle.span_id
    assert middle.parent_id == outer.span_id
    assert outer.parent_id == process.process_span_id
    for child, parent in ((slow, middle), (middle, outer)):
        assert parent.start_ns <= child.start_ns and child.end_ns <= parent.end_ns  # type: ignore[operator]
    assert slow.duration_ns is not None and slow.duration_ns >= 1_200_000_000
    assert str(slow.attrs["code.file.path"]).endswith("slow_mod.py")
