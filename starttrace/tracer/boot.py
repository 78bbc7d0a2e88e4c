"""Activation: run creation, the process record, fork/exit hooks, probe installation.

Called from the `starttrace.pth` line at interpreter start when STARTTRACE / VLLM_STARTTRACE is
set. Standard library only, and only modules that are already loaded at that point, so that the
traced program's own import record starts complete: the two it needs beyond those (`atexit`, and
`mmap` for the journal where the C core does not map it) are removed from `sys.modules` again and
named in the process record (`footprint`, docs/journal.md). No `from __future__ import
annotations`: it would load `__future__`.

What the probes call during the process's life (its state, `set_role`, `mark_ready`, ...) is in
lifecycle.py, which boot fills at activation: the probes import it, never boot.
"""

import os
import sys
from time import monotonic_ns, time_ns

from starttrace.tracer import journal, recorder
from starttrace.tracer.journal import FORMAT_VERSION, JournalWriter, encode, quote
from starttrace.tracer.lifecycle import (
    ENV_ANCHOR,
    ENV_DIR,
    ENV_DISABLED,
    ENV_INTERNAL,
    ENV_LAUNCH_NS,
    ENV_NEW_RUN_ID,
    ENV_PARENT_PID,
    ENV_PARENT_SPAN,
    ENV_PURE_PYTHON,
    ENV_ROOT_SPAN,
    ENV_RUN_DIR,
    ENV_RUN_ID,
    ENV_START_METHOD,
    ENV_TRACE_ID,
    OFF_VALUES,
    ON_VALUES,
    SWITCH_VARS,
    auto_export_endpoint,
    export_run_environment,
    flag_cuda_before_fork,
    process_attrs,
    record_clock_state,
    service_name,
    state,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any
else:
    Any = object  # annotations are evaluated at run time here (see the module docstring)


def switch_value(environ: Any = None) -> tuple[str, str]:
    """('on'|'off'|'invalid', raw value) from STARTTRACE, else VLLM_STARTTRACE."""
    environ = os.environ if environ is None else environ
    for name in SWITCH_VARS:
        raw = environ.get(name)
        if raw is not None and raw.strip():
            value = raw.strip().lower()
            if value in ON_VALUES:
                return "on", raw
            if value in OFF_VALUES:
                return "off", raw
            return "invalid", f"{name}={raw!r}"
    return "off", ""


def default_journal_root() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "starttrace", "runs")


def activate() -> None:
    """Entry point of the .pth line. Never raises."""
    # site reads a venv's site-packages twice on some Pythons (3.11): the .pth line may run twice.
    if state.activation_seen:
        return
    state.activation_seen = True
    try:
        verdict, raw = switch_value()
        if verdict == "invalid":
            os.write(
                2,
                f"starttrace: ignoring {raw}: use 1/true/on/yes or 0/false/off/no; tracing is off\n".encode(),
            )
            return
        if verdict == "off" or os.environ.get(ENV_INTERNAL) == "1" or os.environ.get(ENV_DISABLED) or recorder.active():
            return
        _activate()
    except _Disabled as exc:
        recorder.detach()
        # fail closed: the tree under this process stays untraced and silent (said once, above)
        os.environ[ENV_DISABLED] = str(exc) or "tracing failed"
    except Exception as exc:
        recorder.report(f"tracing is off: {type(exc).__name__}: {exc}", key="activate")
        recorder.detach()
        os.environ[ENV_DISABLED] = str(exc)  # children stay quiet: the failure is reported once


def _activate() -> None:
    before = set(sys.modules)  # what activation adds beyond starttrace's own is hidden or named
    state.exit_status = _NO_STATUS
    now = monotonic_ns()
    environ = os.environ
    state.activated = now
    state.anchor_mono, state.anchor_epoch = monotonic_ns(), time_ns()
    inherited_run = environ.get(ENV_RUN_ID)
    run_dir = environ.get(ENV_RUN_DIR)
    if inherited_run and run_dir:
        state.run_id = inherited_run
        state.run_dir = run_dir
        state.trace_id = environ.get(ENV_TRACE_ID, "")
        state.root_span = environ.get(ENV_ROOT_SPAN, "")
        state.is_root = False
        mono, _, epoch = environ.get(ENV_ANCHOR, "").partition(":")
        if mono.isdigit() and epoch.isdigit():
            state.anchor_mono, state.anchor_epoch = int(mono), int(epoch)
    else:
        _create_run(now)
    recorder.to_stderr = state.is_root  # only the root reports on stderr
    ppid = os.getppid()
    parent_span = None
    launch_pid = None
    method = "root" if state.is_root else "exec"
    created = process_creation_ns(now)
    if not state.is_root and environ.get(ENV_PARENT_PID) == str(ppid):
        parent_span = environ.get(ENV_PARENT_SPAN) or None
        method = environ.get(ENV_START_METHOD) or "exec"
        launch_pid = ppid
        launched = environ.get(ENV_LAUNCH_NS, "")
        if launched.isdigit():
            created = max(created, int(launched))
    if state.is_root:
        parent_span = state.root_span
    state.method = method
    state.created = created
    # Load every module starttrace needs before the process record lists what was preloaded,
    # so that none of starttrace's own imports shows up as the traced program's.
    _load_atexit()
    _load_hotpath(environ)
    from starttrace.tracer.probes import load_all

    probes = load_all()
    _hide_footprint(before)
    _open_journal(parent_span, launch_pid, created, now)
    if state.is_root:  # said once the run can be recorded: a failure above is the root's one line
        os.write(2, f"starttrace: tracing run {state.run_id} -> {state.run_dir}\n".encode("utf-8", "replace"))
    cost = journal.footprint.get("mmap")
    if "mmap" not in sys.modules and cost is not None:
        # the program's own `import mmap` will not load its shared library again: credit the cost
        recorder.credit_import("mmap", cost)
    if state.is_root:
        export_run_environment()
        _start_follower()
    _install_process_hooks()
    _install_probes(probes)


def _create_run(now: int) -> None:
    environ = os.environ
    trace_id, parent_span = parse_traceparent(environ.get("TRACEPARENT") or environ.get("traceparent") or "")
    state.is_root = True
    argv = getattr(sys, "orig_argv", sys.argv)
    job = None
    if may_be_job(environ, argv, trace_id):  # a job of several nodes: one run id and trace id for all of them
        from starttrace.tracer import launchers

        job = launchers.identify(environ, argv, trace_id)
    state.job = job
    state.trace_id = (job.trace_id if job else trace_id) or os.urandom(16).hex()
    state.root_span = recorder.new_span_id()
    import time as _time  # a builtin module: importing it loads nothing new

    stamp = _time.strftime("%Y%m%d-%H%M%S", _time.gmtime())
    requested = environ.pop(ENV_NEW_RUN_ID, "")  # chosen by `starttrace run`, which reports it
    state.run_id = requested if requested.replace("-", "").isalnum() else f"{stamp}-{os.urandom(3).hex()}"
    if job and not requested:
        state.run_id = job.run_id
    root = environ.get(ENV_DIR) or default_journal_root()
    state.run_dir = os.path.join(os.path.abspath(root), state.run_id)
    try:
        os.makedirs(state.run_dir, exist_ok=True)
    except OSError as exc:
        _disable(
            f"cannot create the journal directory {state.run_dir}: {exc.strerror or exc}; tracing is off for this run"
        )
    meta = {
        "v": FORMAT_VERSION,
        "run_id": state.run_id,
        "trace_id": state.trace_id,
        "root_span_id": state.root_span,
        "parent_span_id": parent_span,
        "argv": list(getattr(sys, "orig_argv", sys.argv)),
        "cwd": os.getcwd(),
        "host": os.uname().nodename,
        "created_epoch_ns": time_ns(),
        "service": service_name(),
    }
    with open(os.path.join(state.run_dir, "run.json"), "w", encoding="utf-8") as handle:
        handle.write(encode(meta) + "\n")
    state.parent_of_root = parent_span


def _start_follower() -> None:
    """With an OTLP endpoint configured, a detached helper exports the run (see export/follower.py)."""
    endpoint = auto_export_endpoint()
    if not endpoint:
        return
    env = dict(os.environ)
    env[ENV_INTERNAL] = "1"
    args = [sys.executable, "-m", "starttrace.follower", state.run_dir, str(os.getpid()), endpoint]
    try:
        os.posix_spawn(sys.executable, args, env, setsid=True)
    except Exception as exc:
        recorder.report(f"cannot start the OTLP exporter: {exc}", key="follower")


# What launchers.identify reads: without any of it a root is a run of its own, and activation does
# not load launchers.py (~0.9 M instructions; tests/unit/test_launchers.py keeps the two in step).
JOB_ENV_VARS = ("STARTTRACE_RUN_ID", "VLLM_STARTTRACE_RUN_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
JOB_ARGV_WORDS = ("torch", "vllm", "sglang")


def may_be_job(environ: Any, argv: Any, incoming_trace: str) -> bool:
    """False when launchers.identify would find no job (it is not loaded then)."""
    if incoming_trace or any(environ.get(name) for name in JOB_ENV_VARS):
        return True
    for arg in argv[1:]:  # a launcher is the script or the -m module, never named after -c
        if arg == "-c":
            return False
        if any(word in arg for word in JOB_ARGV_WORDS):
            return True
    return False


def parse_traceparent(value: str) -> tuple[str, str | None]:
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return "", None
    trace_id, span_id = parts[1].lower(), parts[2].lower()
    hexdigits = "0123456789abcdef"
    if not all(c in hexdigits for c in trace_id + span_id) or int(trace_id, 16) == 0 or int(span_id, 16) == 0:
        return "", None
    return trace_id, span_id


def process_start_monotonic(pid: int | str = "self") -> tuple[int, bytes] | None:
    """(monotonic ns of the process's creation, its state letter) from /proc/<pid>/stat, which
    counts clock ticks since boot; None when there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        start_ticks = int(fields[19])
        import time as _time  # a builtin module

        since_start = _time.clock_gettime_ns(_time.CLOCK_BOOTTIME) - start_ticks * 1_000_000_000 // os.sysconf(
            "SC_CLK_TCK"
        )
        return monotonic_ns() - since_start, fields[0]
    except (OSError, ValueError, IndexError):
        return None


def process_creation_ns(now: int) -> int:
    """Monotonic time of this process's creation (never later than `now`). A creation more than
    an hour back is not believed: a faked clock (libfaketime fakes CLOCK_BOOTTIME too) says so."""
    started = process_start_monotonic()
    return now if started is None or now - started[0] > 3_600_000_000_000 else min(now, started[0])


def _process_record(parent_span: str | None, launch_pid: int | None, created: int, now: int) -> str:
    instance = state.instance_id
    record = {
        "k": "process",
        "v": FORMAT_VERSION,
        "run": state.run_id,
        "trace": state.trace_id,
        "iid": instance,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "host": os.uname().nodename,
        "argv": list(getattr(sys, "orig_argv", sys.argv)),
        "exe": sys.executable,
        "service": service_name(),
        "method": state.method,
        "created": created,
        "activated": now,
        "anchor_mono": state.anchor_mono,
        "anchor_epoch": state.anchor_epoch,
        "span": recorder.process_span_id,
        "parent": parent_span,
        "launch_pid": launch_pid,
        "root_span": state.root_span,
        "preloaded": sorted(sys.modules),
        "footprint": journal.footprint,
        "python": sys.version.split()[0],
        "hotpath": "python" if journal.hotpath is None else "c",
    }
    return encode(record) + "\n"


def _open_journal(parent_span: str | None, launch_pid: int | None, created: int, now: int) -> None:
    instance = os.urandom(4).hex()
    recorder.reseed_span_ids()
    state.instance_id = instance
    try:
        writer = JournalWriter(os.path.join(state.run_dir, f"{os.getpid()}-{instance}"))
    except OSError as exc:
        if state.is_root:  # the run cannot be recorded at all: tracing is off for the whole tree
            message = f"cannot write journal in {state.run_dir}: {exc}; tracing is off for this run"
            _remove_run_dir()
        else:
            message = f"cannot write journal in {state.run_dir}: {exc}; tracing is off in this process"
        recorder.report(message, key="journal-open")
        raise _Disabled(message) from None
    process_span = recorder.new_span_id()
    recorder.attach(writer, process_span)
    recorder.process_attrs.clear()
    recorder.write(_process_record(parent_span, launch_pid, created, now))
    if state.is_root:
        root_parent = state.parent_of_root
        line = '{"k":"b","s":"%s","p":%s,"n":"startup","t":%d,"a":{"starttrace.phase":"startup"}}\n'
        recorder.write(line % (state.root_span, quote(root_parent) if root_parent else "null", created))
    recorder.begin(
        "process",
        {"starttrace.phase": "process"},
        parent=parent_span or state.root_span,
        t=created,
        push=False,
        span_id=process_span,
    )
    if state.method != "fork" and state.method != "forkserver":
        recorder.end(
            recorder.begin(
                "python.init", {"starttrace.phase": "interpreter"}, parent=process_span, t=created, push=False
            ),
            t=now,
        )
    _initial_identity()
    if state.method == "spawn" and _is_multiprocessing_child():
        state.bootstrap_span = recorder.begin(
            "process.bootstrap", {"starttrace.phase": "bootstrap"}, parent=process_span, t=now, push=False
        )


class _Disabled(Exception):
    pass


def _remove_run_dir() -> None:
    """The root could not open its journal: take away the run folder it made (run.json only), so
    no run without a journal is left behind. Anything else in it (another run's) stays."""
    try:
        if os.listdir(state.run_dir) == ["run.json"]:
            os.unlink(os.path.join(state.run_dir, "run.json"))
            os.rmdir(state.run_dir)
    except OSError:
        pass


def _disable(message: str) -> None:
    """Report once for the whole tree (children inherit the marker and stay quiet), then stop."""
    recorder.report(message, key="disabled")
    os.environ[ENV_DISABLED] = message
    raise _Disabled(message)


def _initial_identity() -> None:
    environ = os.environ
    attrs: dict[str, Any] = {"starttrace.start_method": state.method}
    rank = environ.get("RANK", "")
    if rank.isdigit():
        attrs["starttrace.role"] = "worker"
        attrs["starttrace.rank"] = int(rank)
        for env_name, key in (("LOCAL_RANK", "starttrace.local_rank"), ("WORLD_SIZE", "starttrace.world_size")):
            value = environ.get(env_name, "")
            if value.isdigit():
                attrs[key] = int(value)
    elif state.is_root:
        attrs["starttrace.role"] = "main"
    attrs.update(process_attrs(environ, state.is_root, state.job))  # clock domain, host id, job keys
    recorder.set_process_attrs(attrs)


def _is_multiprocessing_child() -> bool:
    argv = getattr(sys, "orig_argv", sys.argv)
    return any("multiprocessing" in arg for arg in argv[1:3]) or "--multiprocessing-fork" in argv


# Modules that activation may load and can hide again: their state lives in the interpreter (atexit)
# or they have none (__future__, mmap), so a second module object made by the program's own import
# behaves like the first. Any other module activation loads stays and is named in the footprint.
_HIDEABLE = frozenset({"__future__", "atexit", "mmap"})
_atexit: Any = None


def _load_hotpath(environ: "Mapping[str, str]") -> None:
    """Use the C core of the hot path (starttrace/tracer/_hotpath.c, built at install where a C compiler
    is there) for the journal and the import probe, unless STARTTRACE_PURE_PYTHON is on (the
    switch's values); without it, the Python code writes the same records."""
    value = (environ.get(ENV_PURE_PYTHON) or "").strip().lower()
    if value in ON_VALUES:
        return
    if value not in OFF_VALUES:
        recorder.report(f"ignoring {ENV_PURE_PYTHON}={value!r}: use 1/true/on/yes or 0/false/off/no")
    try:
        from starttrace.tracer import _hotpath  # type: ignore[attr-defined]
    except ImportError:
        return
    journal.hotpath = _hotpath


def _load_atexit() -> None:
    """`atexit` (a builtin module, not loaded at interpreter start), without leaving it in sys.modules."""
    global _atexit
    modules = sys.modules
    _atexit = modules.get("atexit")
    if _atexit is None:
        start = monotonic_ns()
        import atexit

        journal.footprint["atexit"] = monotonic_ns() - start
        _atexit = atexit


def _hide_footprint(before: set[str]) -> None:
    """Remove from sys.modules what activation loaded beyond starttrace's own modules (see _HIDEABLE)."""
    modules = sys.modules
    for name in [m for m in modules if m not in before]:
        if name == "starttrace" or name.startswith("starttrace."):
            continue
        if name in _HIDEABLE:
            del modules[name]
        journal.footprint.setdefault(name, None)


def _install_process_hooks() -> None:
    _atexit.register(_at_exit)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    if not getattr(os.fork, "__starttrace__", False):
        os.fork = _make_fork_wrapper(os.fork)
    if not getattr(os._exit, "__starttrace__", False):
        os._exit = _make_exit_wrapper(os._exit)
    if not getattr(sys.exit, "__starttrace__", False):
        sys.exit = _make_sys_exit_wrapper(sys.exit)


def _install_probes(probes: list[Any]) -> None:
    from starttrace.tracer.probes import install_all

    install_all(probes)


def _end_process(exit_code: int | None) -> None:
    if state.ended or not recorder.active():
        return
    state.ended = True
    attrs: dict[str, Any] = {}
    if exit_code is not None:
        attrs["process.exit_code"] = exit_code
    recorder.end(recorder.process_span_id, attrs or None)
    if state.is_root and not state.ready:
        recorder.end(state.root_span, {"starttrace.ended_by": "root_exit"})
    record_clock_state(reap=False)  # at exit: init reaps the helper


def _at_exit() -> None:
    try:
        _end_process(_exit_code_at_exit())
    except Exception:
        pass


def _exit_code_at_exit() -> int | None:
    """The interpreter's exit status, as far as atexit can know it."""
    last = getattr(sys, "last_value", None)  # set for an exception that ended the main thread
    if last is not None and not isinstance(last, SystemExit):
        return 1
    status = state.exit_status
    if status is _NO_STATUS:
        return None  # the end of the program, or `raise SystemExit(n)`: atexit cannot tell which
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    return 1  # sys.exit("message") prints it and exits 1


_NO_STATUS = object()


def _make_sys_exit_wrapper(real_exit: Any) -> Any:
    from _thread import get_ident

    def exit(status: object = None) -> None:
        if get_ident() == recorder._main_ident:  # sys.exit in a thread ends only that thread
            state.exit_status = status
        real_exit(status)

    exit.__starttrace__ = True  # type: ignore[attr-defined]
    exit.__wrapped__ = real_exit  # type: ignore[attr-defined]
    exit.__doc__ = real_exit.__doc__
    return exit


def _make_exit_wrapper(real_exit: Any) -> Any:
    def _exit(code: int) -> None:
        try:
            _end_process(code)
        except Exception:
            pass
        real_exit(code)

    _exit.__starttrace__ = True  # type: ignore[attr-defined]
    _exit.__wrapped__ = real_exit  # type: ignore[attr-defined]
    return _exit


def _make_fork_wrapper(real_fork: Any) -> Any:
    def fork() -> int:
        if not recorder.active():
            return real_fork()
        attrs: dict[str, Any] = {"starttrace.phase": "fork"}
        flag_cuda_before_fork(attrs)
        state.fork_started = monotonic_ns()
        state.fork_span = recorder.begin("process.fork", attrs, t=state.fork_started)
        try:
            pid = real_fork()
        except BaseException as exc:
            recorder.end(state.fork_span, error=f"{type(exc).__name__}: {exc}")
            state.fork_span = ""
            raise
        if pid:
            recorder.end(state.fork_span, {"starttrace.child_pid": pid})
            state.fork_span = ""
        return pid

    fork.__starttrace__ = True  # type: ignore[attr-defined]
    fork.__wrapped__ = real_fork  # type: ignore[attr-defined]
    return fork


def _after_fork_in_child() -> None:
    try:
        if not recorder.active():
            return
        now = monotonic_ns()
        parent_span = state.fork_span or recorder.current_span()
        created = state.fork_started or now
        forked_by_forkserver = state.role == "forkserver"
        forked_for_process = forked_by_forkserver or state.in_launch > 0
        recorder.forget_stacks_after_fork()
        recorder.detach()
        state.fork_span = ""
        state.fork_started = 0
        state.ready = False
        state.ended = False
        state.is_root = False
        recorder.to_stderr = False
        state.role = ""
        state.in_launch = 0
        state.bootstrap_span = ""
        state.exit_status = _NO_STATUS
        state.method = "forkserver" if forked_by_forkserver else "fork"
        _open_journal(parent_span, None, created, now)
        if forked_for_process:
            state.bootstrap_span = recorder.begin(
                "process.bootstrap",
                {"starttrace.phase": "bootstrap"},
                parent=recorder.process_span_id,
                t=created,
                push=False,
            )
    except Exception as exc:
        recorder.report(f"fork child setup failed: {type(exc).__name__}: {exc}", key="fork-child")
        recorder.detach()
