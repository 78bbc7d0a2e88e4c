"""Nothing is lost and nothing breaks: SIGKILL mid-import, os._exit, unwritable or full journals."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from run_spans import named, spans_of

from starttrace.sources.journal_files import is_journal_file
from starttrace.sources.journal_reader import Process, list_run_dirs, read_run


def traced_env(root: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k == "STARTTRACE_PURE_PYTHON"  # kept: scripts/test_pythons.sh runs these with the Python code too
        or (not k.startswith(("STARTTRACE", "OTEL_")) and k.lower() != "traceparent")
    }
    env.update(STARTTRACE="1", STARTTRACE_DIR=str(root), **extra)
    return env


def write_slow_module(folder: Path, flag: Path) -> None:
    (folder / "slowmod.py").write_text(
        textwrap.dedent(
            f"""
            import time
            open({str(flag)!r}, "w").close()
            time.sleep(60)
            """
        )
    )


def wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def only_run(root: Path):  # type: ignore[no-untyped-def]
    runs = list_run_dirs(root)
    assert len(runs) == 1
    return read_run(runs[0])


def test_sigkill_in_the_middle_of_an_import_keeps_every_record(tmp_path: Path) -> None:
    flag = tmp_path / "importing"
    write_slow_module(tmp_path, flag)
    program = "import json, decimal\nimport slowmod\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env=traced_env(tmp_path / "runs", PYTHONPATH=str(tmp_path)),
        stderr=subprocess.DEVNULL,
    )
    wait_for(flag)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    run = only_run(tmp_path / "runs")
    (process,) = run.processes
    slow = named(run, process, "import slowmod")
    assert len(slow) == 1 and slow[0].end_ns is None  # in progress, with its start time
    done = {s.name for s in spans_of(run, process) if s.end_ns is not None}
    assert {"import json", "import decimal", "python.init"} <= done
    own = run.process_span(process)
    assert own is not None and own.end_ns is None
    assert not process.exited and process.alive is False
    assert run.startup is not None and run.startup.end_ns is None
    assert not run.problems


def test_a_rank_killed_mid_startup_leaves_the_rest_of_the_run(tmp_path: Path) -> None:
    flag = tmp_path / "importing"
    write_slow_module(tmp_path, flag)
    program = textwrap.dedent(
        f"""
        import multiprocessing, os, signal, time

        def rank():
            import slowmod

        if __name__ == "__main__":
            child = multiprocessing.get_context("spawn").Process(target=rank, name="rank-0")
            child.start()
            while not os.path.exists({str(flag)!r}):
                time.sleep(0.02)
            os.kill(child.pid, signal.SIGKILL)
            child.join()
            import fractions
            print(child.pid, child.exitcode)
        """
    )
    script = tmp_path / "killrank.py"
    script.write_text(program)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=traced_env(tmp_path / "runs", PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    child_pid, exit_code = (int(x) for x in done.stdout.split())
    assert exit_code == -signal.SIGKILL
    run = only_run(tmp_path / "runs")
    child = next(p for p in run.processes if p.pid == child_pid)
    root = next(p for p in run.processes if p.resource["starttrace.start_method"] == "root")
    assert [s.end_ns for s in named(run, child, "import slowmod")] == [None]
    assert child.resource["starttrace.process_name"] == "rank-0"
    assert root.exited and any(s.end_ns for s in named(run, root, "import fractions"))
    assert run.startup is not None and run.startup.end_ns is not None


def test_os_exit_keeps_records_and_exit_code(tmp_path: Path) -> None:
    program = "import os, json, decimal\nos._exit(7)\n"
    done = subprocess.run(
        [sys.executable, "-c", program], env=traced_env(tmp_path / "runs"), capture_output=True, timeout=60
    )
    assert done.returncode == 7
    run = only_run(tmp_path / "runs")
    (process,) = run.processes
    assert process.exited and process.exit_code == 7
    assert any(s.end_ns for s in named(run, process, "import decimal"))


def test_multiprocessing_children_exit_through_os_exit_with_all_records(tmp_path: Path) -> None:
    program = textwrap.dedent(
        """
        import multiprocessing

        def work():
            import decimal, fractions

        if __name__ == "__main__":
            for method in ("fork", "forkserver"):
                p = multiprocessing.get_context(method).Process(target=work)
                p.start()
                p.join()
                assert p.exitcode == 0
        """
    )
    script = tmp_path / "children.py"
    script.write_text(program)
    done = subprocess.run(
        [sys.executable, str(script)], env=traced_env(tmp_path / "runs"), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    run = only_run(tmp_path / "runs")
    workers = [p for p in run.processes if p.resource["starttrace.start_method"] in ("fork", "forkserver")]
    assert len(workers) == 2
    for worker in workers:
        assert worker.exited and worker.exit_code == 0  # recorded by the os._exit wrapper
        assert {"import decimal", "import fractions"} <= {s.name for s in spans_of(run, worker) if s.end_ns}


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "readonly"
    folder.mkdir()
    if os.geteuid() == 0:
        if (
            shutil.which("chattr") is None
            or subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode
        ):
            pytest.skip("running as root and `chattr +i` is unavailable: cannot make a directory read-only for root")
        try:
            yield folder
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=False)
    else:
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(0o755)


def test_read_only_journal_dir_program_runs_with_one_warning(read_only_dir: Path) -> None:
    program = textwrap.dedent(
        """
        import multiprocessing, json

        def work():
            import decimal

        if __name__ == "__main__":
            p = multiprocessing.get_context("spawn").Process(target=work)
            p.start(); p.join()
            print("ok", p.exitcode)
        """
    )
    script = read_only_dir.parent / "prog.py"
    script.write_text(program)
    done = subprocess.run(
        [sys.executable, str(script)], env=traced_env(read_only_dir), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok 0"
    warnings = [line for line in done.stderr.splitlines() if line.startswith("starttrace:")]
    assert len(warnings) == 1, done.stderr
    assert str(read_only_dir) in warnings[0]
    assert not list(read_only_dir.iterdir())


def test_full_disk_disables_the_journal_once_and_keeps_what_was_written(tmp_path: Path) -> None:
    # RLIMIT_FSIZE makes growing a file past the limit fail like a full disk (EFBIG): the journal's
    # first segment is allocated already, the next one cannot be, once the imports have filled it.
    mods = tmp_path / "mods"
    mods.mkdir()
    for i in range(1500):
        (mods / f"filler_module_with_a_rather_long_name_{i:04d}.py").write_text("X = 1\n")
    program = textwrap.dedent(
        """
        import os, resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limit = 64 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        for i in range(1500):
            __import__(f"filler_module_with_a_rather_long_name_{i:04d}")
        import email.parser, http.client, xml.dom.minidom, asyncio, decimal, fractions, statistics
        print("done", limit)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        env=traced_env(tmp_path / "runs", PYTHONPATH=str(mods), PYTHONDONTWRITEBYTECODE="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    limit = int(done.stdout.split()[1])
    warnings = [line for line in done.stderr.splitlines() if line.startswith("starttrace:") and "journal" in line]
    assert len(warnings) == 1, done.stderr
    run = only_run(tmp_path / "runs")
    (process,) = run.processes
    # nothing was written past the limit: the segment that could not be allocated is not there
    assert [p.name for p in process.journal_path.parent.iterdir() if is_journal_file(p.name)] == [
        process.journal_path.name
    ]
    assert process.journal_path.stat().st_size <= max(limit, 256 * 1024)
    kept = [s for s in spans_of(run, process) if s.attrs.get("starttrace.phase") == "import"]
    assert len(kept) > 100, "records written before the disk filled are kept"
    assert any("cannot extend journal" in w for w in process.warnings), process.warnings
    # at most a cut last line, reported; and the journal cut short, named (issue 26)
    assert all("line" in problem or "cut short" in problem for problem in run.problems)
    assert any("cut short" in problem and "cannot extend journal" in problem for problem in run.problems)


def test_process_record_lists_preloaded_modules(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import colorsys"], env=traced_env(tmp_path / "runs"), capture_output=True, timeout=60
    )
    assert done.returncode == 0
    run = only_run(tmp_path / "runs")
    process: Process = run.processes[0]
    assert "sys" in process.preloaded and "starttrace.tracer.activation" in process.preloaded
    assert "colorsys" not in process.preloaded
    imports = [s.name for s in spans_of(run, process) if s.attrs.get("starttrace.phase") == "import"]
    # 3.13's `python -c` imports linecache before the command runs (to show its source in tracebacks)
    interpreter = ["import linecache"] if sys.version_info >= (3, 13) else []
    assert [name for name in imports if "customize" not in name] == [*interpreter, "import colorsys"]


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        ("import sys; sys.exit(3)", 3),
        ("import sys; sys.exit('bye')", 1),
        ("import sys; sys.exit()", 0),
        ("raise RuntimeError('boom')", 1),
    ],
)
def test_exit_status_is_recorded(tmp_path: Path, program: str, expected: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", program], env=traced_env(tmp_path / "runs"), capture_output=True, timeout=60
    )
    assert done.returncode == expected
    (process,) = only_run(tmp_path / "runs").processes
    assert process.exited and process.exit_code == expected


def test_sys_exit_in_a_thread_is_not_the_process_exit_status(tmp_path: Path) -> None:
    program = (
        "import sys, threading\nt = threading.Thread(target=sys.exit, args=(5,)); t.start(); t.join()\nsys.exit(0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], env=traced_env(tmp_path / "runs"), capture_output=True, timeout=60
    )
    assert done.returncode == 0
    (process,) = only_run(tmp_path / "runs").processes
    assert process.exit_code == 0
