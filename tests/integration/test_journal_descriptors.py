"""The journal reaches only the journal (docs/journal.md), whatever the traced program does
with its descriptors, and survives what it does to itself: closerange then reopen, dup2 over every
descriptor, fork after a closerange, SIGKILL in the middle of a burst of records, many writers at
once, a disk that fills up. Each with the C core of the hot path and with the Python code."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from run_spans import named, spans_of

from starttrace.sources.journal_files import journal_files
from starttrace.sources.journal_reader import Run, read_run


@pytest.fixture(params=["c", "python"])
def hotpath(request: pytest.FixtureRequest) -> str:
    """Every test here runs with the C core of the hot path (where built) and with the Python code."""
    return str(request.param)


@pytest.fixture(name="clean_env")
def clean_env_for_hotpath(clean_env: Callable[..., dict[str, str]], hotpath: str) -> Callable[..., dict[str, str]]:
    pure = {"STARTTRACE_PURE_PYTHON": "1"} if hotpath == "python" else {}
    return lambda **extra: clean_env(**pure, **extra)


@pytest.fixture(name="traced_env")
def traced_env_for_hotpath(clean_env: Callable[..., dict[str, str]], journal_root: Path) -> dict[str, str]:
    return clean_env(STARTTRACE="1", STARTTRACE_DIR=str(journal_root))


def program_bytes(i: int) -> bytes:
    """The exact content of the program's file number i (the traced program makes the same)."""
    return f"program file {i}: ".encode() + bytes(range(256)) * (1 + i % 3)


def _mods(tmp_path: Path, count: int, prefix: str = "later_mod") -> Path:
    folder = tmp_path / "mods"
    folder.mkdir(exist_ok=True)
    for i in range(count):
        (folder / f"{prefix}_{i}.py").write_text(f"VALUE = {i}\n")
    return folder


def _run(venv_python: str, program: str, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [venv_python, "-c", textwrap.dedent(program)],
        env=dict(env, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("starttrace:") and "tracing run" not in line]
    assert not said, done.stderr
    return done


def _imports(run: Run, pid: int | None = None) -> dict[str, object]:
    return {
        s.attrs["starttrace.import.module"]: s
        for p in run.processes
        if pid is None or p.pid == pid
        for s in spans_of(run, p)
        if s.attrs.get("starttrace.phase") == "import"
    }


def test_closerange_then_reopen(
    venv_python: str, tmp_path: Path, traced_env: dict[str, str], journal_root: Path,
    only_run_dir: Callable[[Path], Path],
) -> None:  # fmt: skip
    """A daemon-like program closes every descriptor, then opens hundreds of files and sockets:
    not one byte of them changes, and the imports after the close are recorded."""
    mods = _mods(tmp_path, 40)
    out = tmp_path / "out"
    out.mkdir()
    program = f"""
        import os, sys
        sys.path.insert(0, {str(mods)!r})
        import json
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        # a buffered file on the lowest descriptors (those the journal's own files once had),
        # flushed only when the interpreter shuts down
        log = open(os.path.join({str(out)!r}, "buffered.log"), "w")
        log.write("x" * 50_000)
        import socket  # after the close: recorded
        payload = [f"program file {{i}}: ".encode() + bytes(range(256)) * (1 + i % 3) for i in range(300)]
        fds = [os.open(os.path.join({str(out)!r}, f"f{{i}}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
               for i in range(len(payload))]
        socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(50)]
        pairs = [socket.socketpair() for _ in range(20)]
        for fd, data in zip(fds, payload):
            os.write(fd, data[: len(data) // 2])
        for i in range(40):
            __import__(f"later_mod_{{i}}")
        import decimal, fractions, email.parser, http.client
        for fd, data in zip(fds, payload):
            os.write(fd, data[len(data) // 2 :])
        for a, b in pairs:
            a.sendall(b"ping")
            assert b.recv(4) == b"ping"
        log.write("end")
        print("fds", min(fds), max(fds))
    """
    done = _run(venv_python, program, traced_env)
    assert int(done.stdout.split()[1]) <= 6, "the program got the lowest descriptors back"
    for i in range(300):
        assert (out / f"f{i}").read_bytes() == program_bytes(i), f"program file f{i} changed"
    assert (out / "buffered.log").read_text() == "x" * 50_000 + "end"
    run = read_run(only_run_dir(journal_root))
    assert run.problems == []
    (process,) = run.processes
    assert process.exited  # (exit_code stays None at the end of a program: atexit cannot tell)
    imports = _imports(run)
    later = ["socket", "decimal", "fractions", "email.parser", "http.client"] + [f"later_mod_{i}" for i in range(40)]
    for module in later:
        assert module in imports, module
        assert imports[module].end_ns is not None, module  # type: ignore[attr-defined]


def test_dup2_over_every_descriptor(
    venv_python: str, tmp_path: Path, traced_env: dict[str, str], journal_root: Path,
    only_run_dir: Callable[[Path], Path],
) -> None:  # fmt: skip
    mods = _mods(tmp_path, 20)
    sink = tmp_path / "sink"
    program = f"""
        import os, sys
        sys.path.insert(0, {str(mods)!r})
        fd = os.open({str(sink)!r}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        limit = min(os.sysconf("SC_OPEN_MAX"), 4096)
        for other in range(3, limit):
            if other != fd:
                os.dup2(fd, other)
        for i in range(20):
            __import__(f"later_mod_{{i}}")
        import decimal, fractions, json
        os.write(fd, b"only what the program wrote")
        print(limit)
    """
    _run(venv_python, program, traced_env)
    assert sink.read_bytes() == b"only what the program wrote"
    run = read_run(only_run_dir(journal_root))
    assert run.problems == []
    (process,) = run.processes
    assert process.exited  # (exit_code stays None at the end of a program: atexit cannot tell)
    imports = _imports(run)
    for module in ["decimal", "fractions", "json"] + [f"later_mod_{i}" for i in range(20)]:
        assert module in imports and imports[module].end_ns is not None, module  # type: ignore[attr-defined]


def test_fork_after_closerange(
    venv_python: str, tmp_path: Path, traced_env: dict[str, str], journal_root: Path,
    only_run_dir: Callable[[Path], Path],
) -> None:  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    program = f"""
        import os
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        fd = os.open({str(out / "parent")!r}, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"parent before fork;")
        pid = os.fork()
        if pid == 0:
            import colorsys  # the child's own journal
            child_fd = os.open({str(out / "child")!r}, os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(child_fd, b"child")
            os.write(fd, b"child wrote to the inherited file;")
            os._exit(7)
        _, status = os.waitpid(pid, 0)
        import fractions
        os.write(fd, b"parent after fork")
        print(pid, os.waitstatus_to_exitcode(status))
    """
    done = _run(venv_python, program, traced_env)
    child_pid, code = (int(x) for x in done.stdout.split())
    assert code == 7
    assert (out / "parent").read_bytes() == b"parent before fork;child wrote to the inherited file;parent after fork"
    assert (out / "child").read_bytes() == b"child"
    run = read_run(only_run_dir(journal_root))
    assert run.problems == []
    by_pid = {p.pid: p for p in run.processes}
    assert len(by_pid) == 2 and child_pid in by_pid
    child = by_pid[child_pid]
    (parent,) = [p for p in run.processes if p.pid != child_pid]
    assert child.record["method"] == "fork" and child.exited and child.exit_code == 7
    assert "colorsys" in _imports(run, child_pid) and "colorsys" not in _imports(run, parent.pid)
    assert "fractions" in _imports(run, parent.pid) and "fractions" not in _imports(run, child_pid)
    (fork,) = named(run, parent, "process.fork")
    assert fork.attrs["starttrace.child_pid"] == child_pid
    own = run.process_span(child)
    assert own is not None and own.parent_id == fork.span_id


BURST = """
    import os, sys, threading
    from starttrace.tracer import recorder
    flag, threads = sys.argv[1], int(sys.argv[2])

    def burst(t):
        for i in range(10**9):
            recorder.end(recorder.begin("burst", {"t": t, "i": i, "pad": "p" * (i % 200)}))
            if i == 2000 and t == 0:
                open(flag, "w").close()

    workers = [threading.Thread(target=burst, args=(t,)) for t in range(1, threads)]
    for w in workers:
        w.start()
    burst(0)
"""


@pytest.mark.parametrize("threads", [1, 4])
def test_sigkill_in_the_middle_of_a_burst(
    venv_python: str, tmp_path: Path, traced_env: dict[str, str], journal_root: Path,
    only_run_dir: Callable[[Path], Path], threads: int,
) -> None:  # fmt: skip
    """Killed while writing records as fast as it can (segments filling, new ones opened): what was
    written is all there, in order, and at most the very last record is cut."""
    rng = random.Random(threads)
    for attempt in range(3):
        for old in journal_root.iterdir():
            shutil.rmtree(old)
        flag = tmp_path / f"started-{attempt}"
        proc = subprocess.Popen(
            [venv_python, "-c", textwrap.dedent(BURST), str(flag), str(threads)],
            env=traced_env,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the burst never started"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.05, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.stderr is not None
        proc.stderr.close()
        run_dir = only_run_dir(journal_root)
        run = read_run(run_dir)
        assert all("cut last line" in p for p in run.problems) and len(run.problems) <= 1, run.problems
        (process,) = run.processes
        assert not process.exited and process.alive is False
        segments = sorted(run_dir.glob("*.journal"))
        assert len(segments) >= 2, "the burst went on into further segments"
        spans = named(run, process, "burst")
        assert len(spans) > 2000
        for t in range(threads):
            mine = sorted((s for s in spans if s.attrs["t"] == t), key=lambda s: s.start_ns)
            assert [s.attrs["i"] for s in mine] == list(range(len(mine))), "no record lost before the kill"
            assert all(s.end_ns is not None for s in mine[:-1]), "every span but the last one of a thread ended"


WRITERS = 16


def test_sixteen_processes_write_at_once(
    venv_python: str, tmp_path: Path, traced_env: dict[str, str], journal_root: Path,
    only_run_dir: Callable[[Path], Path],
) -> None:  # fmt: skip
    """16 traced processes of one run record at the same time, each into its own journal."""
    mods = _mods(tmp_path, 200, prefix="shared_mod")
    go = time.time() + 3
    program = f"""
        import subprocess, sys, textwrap
        child = textwrap.dedent('''
            import sys, time
            from starttrace.tracer import recorder
            sys.path.insert(0, {str(mods)!r})
            while time.time() < {go!r}:
                time.sleep(0.001)
            for i in range(200):
                __import__(f"shared_mod_{{i}}")
                recorder.end(recorder.begin("work", {{"i": i, "pad": "w" * (i * 13 % 1500)}}))
        ''')
        procs = [subprocess.Popen([sys.executable, "-c", child]) for _ in range({WRITERS})]
        print(sorted(p.pid for p in procs))
        assert all(p.wait() == 0 for p in procs)
    """
    done = _run(venv_python, program, traced_env)
    pids = json.loads(done.stdout)
    run_dir = only_run_dir(journal_root)
    assert len(journal_files(run_dir)) == WRITERS + 1
    run = read_run(run_dir)
    assert run.problems == []
    children = [p for p in run.processes if p.pid in pids]
    assert sorted(p.pid for p in children) == pids
    for process in children:
        assert process.exited  # (exit_code stays None at the end of a program: atexit cannot tell)
        work = [s.attrs["i"] for s in sorted(spans_of(run, process), key=lambda s: s.start_ns) if s.name == "work"]
        assert work == list(range(200))
        assert {f"shared_mod_{i}" for i in range(200)} <= set(_imports(run, process.pid))


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /tmp"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


FULL_DISK = """
    set -e
    mount -t tmpfs -o size={size}k tmpfs {disk}
    {setup}
    STARTTRACE=1 STARTTRACE_DIR={disk}/runs {python} -c {program} > {out}/program.out 2> {out}/program.err
    {python} -c {check} > {out}/check.json
"""

CHECK = """
import json, sys
from pathlib import Path
from starttrace.run import span_of
from starttrace.sources.journal_reader import ReaderError, list_run_dirs, read_run
runs = list_run_dirs(Path(sys.argv[1]))
out = {"runs": len(runs)}
try:
    run = read_run(runs[0]) if runs else None
except ReaderError as exc:
    run, out["error"] = None, str(exc)
if run is not None:
    (p,) = run.processes
    spans = [span_of(row) for row in run.spans_of(p).iter_rows(named=True)]
    imports = [s.attrs["starttrace.import.module"] for s in spans if s.attrs.get("starttrace.phase") == "import"]
    out.update(problems=run.problems, warnings=p.warnings, exited=p.exited, exit_code=p.exit_code,
               imports=imports, files=sorted(f.name for f in runs[0].iterdir()))
print(json.dumps(out))
"""


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare` to mount a small tmpfs (user namespaces)")
@pytest.mark.parametrize("when", ["while running", "before the start"])
def test_full_disk(venv_python: str, tmp_path: Path, clean_env: Callable[..., dict[str, str]], when: str) -> None:
    """A real full disk (a 1 MiB tmpfs): reported once, the program runs on, what fit is kept."""
    import shlex

    mods = _mods(tmp_path, 1500, prefix="filler_module_with_a_rather_long_name")
    disk = tmp_path / "disk"
    disk.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    if when == "while running":  # the journal's first segment fits, then the program fills the disk
        setup = ""
        program = f"""
import os, sys
sys.path.insert(0, {str(mods)!r})
try:
    with open({str(disk / "filler")!r}, "wb") as f:
        while True:
            f.write(b"\\0" * 4096)
            f.flush()
except OSError:
    pass
for i in range(1500):
    __import__(f"filler_module_with_a_rather_long_name_{{i}}")
import decimal, fractions
print("done")
"""
    else:  # nothing fits, not even the journal's first segment
        setup = f"mkdir -p {disk}/runs && (dd if=/dev/zero of={disk}/filler bs=4k 2>/dev/null || true)"
        program = "import decimal, fractions\nprint('done')\n"
    script = FULL_DISK.format(
        size=1024,
        disk=shlex.quote(str(disk)),
        setup=setup,
        python=shlex.quote(venv_python),
        program=shlex.quote(program),
        check=shlex.quote(CHECK) + " " + shlex.quote(str(disk / "runs")),
        out=shlex.quote(str(out)),
    )
    env = clean_env(PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    program_err = out / "program.err"
    assert done.returncode == 0, (done.stderr, program_err.read_text() if program_err.exists() else "")
    assert (out / "program.out").read_text() == "done\n"
    errors = (out / "program.err").read_text().splitlines()
    warnings = [line for line in errors if line.startswith("starttrace:") and "tracing run" not in line]
    assert len(warnings) == 1, errors
    assert "No space left on device" in warnings[0]
    result = json.loads((out / "check.json").read_text())
    if when == "before the start":  # not even run.json could be written: tracing is off, said once
        assert result["runs"] <= 1 and "tracing is off" in warnings[0]
        return
    # the journal ends with a whole record, the warning; the run's problems name the cut (issue 26)
    assert len(result["problems"]) == 1 and "cut short" in result["problems"][0], result["problems"]
    assert len(result["imports"]) > 100, "records written before the disk filled are kept"
    assert any("cannot extend journal" in w and "No space left" in w for w in result["warnings"]), result["warnings"]
    (journal,) = [f for f in result["files"] if f.endswith(".journal")]  # the next segment was never made
    assert journal.endswith(".0.journal")


def test_no_descriptor_stays_open(
    venv_python: str, traced_env: dict[str, str], clean_env: Callable[..., dict[str, str]]
) -> None:
    """After activation (and after the journal moved on to a new segment) the traced process holds
    exactly the descriptors the untraced one holds."""
    program = """
        import os
        from starttrace.tracer import recorder
        for i in range(3000):  # fills the first segment: the journal opens its next one
            recorder.end(recorder.begin("x", {"pad": "q" * 200}))
        print(sorted(os.listdir("/proc/self/fd")))
    """
    program_off = 'import os\nprint(sorted(os.listdir("/proc/self/fd")))\n'
    traced = _run(venv_python, program, traced_env)
    untraced = subprocess.run(
        [venv_python, "-c", program_off], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert json.loads(traced.stdout.replace("'", '"')) == json.loads(untraced.stdout.replace("'", '"'))
    assert os.path.exists("/proc/self/fd")
