"""Activation in Python: run creation, the process record, fork/exit hooks, probe installation,
where activation.py's light case does not apply (a probe loads at activation, spans are held
back, a job of several nodes, a follower, or no C core), and the fork handling of every process.

Standard library only, and only modules that are already loaded at that point, so that the
traced program's own import record starts complete: the two it needs beyond those (`atexit`, and
`mmap` for the journal where the C core does not map it) are removed from `sys.modules` again and
named in the process record (`footprint`, docs/journal.md). No `from __future__ import
annotations`: it would load `__future__`.

What the probes call during the process's life (its state, `set_role`, `mark_ready`, ...) is in
lifecycle.py; the state, names and records every process shares are activation.py's.
"""

import os
import sys
from time import monotonic_ns, time_ns

from starttrace.tracer import activation, journal, lifecycle, recorder
from starttrace.tracer.activation import (
    ENV_DISABLED,
    ENV_INTERNAL,
    ENV_PURE_PYTHON,
    NO_STATUS,
    OFF_VALUES,
    ON_VALUES,
    auto_export_endpoint,
    export_run_environment,
    identity_attrs,
    inherit_run,
    is_multiprocessing_child,
    may_be_job,
    place_in_tree,
    process_record,
    remove_run_dir,
    startup_begin_record,
    state,
)
from starttrace.tracer.journal import JournalWriter
from starttrace.tracer.lifecycle import flag_cuda_before_fork

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any
else:
    Any = object  # annotations are evaluated at run time here (see the module docstring)

def activate_in_python() -> None:
    """The whole activation in Python (activation.activate hands over here). Never raises."""
    try:
        if recorder.active():
            return
        activation.python_recorder(recorder)
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
    state.exit_status = NO_STATUS
    now = monotonic_ns()
    environ = os.environ
    state.activated = now
    state.anchor_mono, state.anchor_epoch = monotonic_ns(), time_ns()
    if not inherit_run(environ):
        _create_run(now)
    recorder.to_stderr = state.is_root  # only the root reports on stderr
    parent_span, launch_pid, created = place_in_tree(environ, now)
    # Load every module starttrace needs before the process record lists what was preloaded,
    # so that none of starttrace's own imports shows up as the traced program's.
    global _atexit
    _atexit = activation.load_atexit()
    _load_hotpath(environ)
    probes = _load_probes()
    activation.hide_footprint(before)
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
    trace_id = activation.parse_traceparent(environ.get("TRACEPARENT") or environ.get("traceparent") or "")[0]
    argv = getattr(sys, "orig_argv", sys.argv)
    job = None
    if may_be_job(environ, argv, trace_id):  # a job of several nodes: one run id and trace id for all of them
        from starttrace.tracer import launchers

        job = launchers.identify(environ, argv, trace_id)
    try:
        activation.new_run(now, environ, recorder.new_span_id(), job)
    except OSError as exc:
        _disable(
            f"cannot create the journal directory {state.run_dir}: {exc.strerror or exc}; tracing is off for this run"
        )


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


def _open_journal(parent_span: str | None, launch_pid: int | None, created: int, now: int) -> None:
    instance = os.urandom(4).hex()
    recorder.reseed_span_ids()
    state.instance_id = instance
    try:
        writer = JournalWriter(os.path.join(state.run_dir, f"{os.getpid()}-{instance}"))
    except OSError as exc:
        if state.is_root:  # the run cannot be recorded at all: tracing is off for the whole tree
            message = f"cannot write journal in {state.run_dir}: {exc}; tracing is off for this run"
            remove_run_dir()
        else:
            message = f"cannot write journal in {state.run_dir}: {exc}; tracing is off in this process"
        recorder.report(message, key="journal-open")
        raise _Disabled(message) from None
    process_span = recorder.new_span_id()
    recorder.attach(writer, process_span)
    recorder.process_attrs.clear()
    hotpath = "python" if journal.hotpath is None else "c"
    recorder.write(process_record(parent_span, launch_pid, created, now, process_span, hotpath))
    if state.is_root:
        recorder.write(startup_begin_record())
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
    recorder.set_process_attrs(identity_attrs(os.environ))
    if state.method == "spawn" and is_multiprocessing_child():
        state.bootstrap_span = recorder.begin(
            "process.bootstrap", {"starttrace.phase": "bootstrap"}, parent=process_span, t=now, push=False
        )


class _Disabled(Exception):
    pass


def _disable(message: str) -> None:
    """Report once for the whole tree (children inherit the marker and stay quiet), then stop."""
    recorder.report(message, key="disabled")
    os.environ[ENV_DISABLED] = message
    raise _Disabled(message)


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
    activation.untrack_own_modules(_hotpath)


def _install_process_hooks() -> None:
    _atexit.register(activation.at_exit)
    os.register_at_fork(after_in_child=after_fork_in_child)
    if not getattr(os.fork, "__starttrace__", False):
        os.fork = make_fork_wrapper(os.fork)
    if not getattr(os._exit, "__starttrace__", False):
        os._exit = activation.make_exit_wrapper(os._exit)
    if not getattr(sys.exit, "__starttrace__", False):
        sys.exit = activation.make_sys_exit_wrapper(sys.exit)


# The probes the Python activation loads at its start (the import probe, and those the environment
# or command line asks for: `EAGER_WHEN_ENV`, `EAGER_WHEN_ARGV`); the others load with their library.
PROBES = ("starttrace.tracer.probes.imports",)
# lazy probes named installed from activation on (`starttrace.probes.installed`), as when they
# loaded at activation: their install() only hooks modules, which their lazy loader hooks alike
HOOKED_AT_ACTIVATION = ("starttrace.tracer.probes.multiprocessing",)
# Loaded only in a torchrun agent whose run its command line named (`lifecycle.state.job`, set in
# roots only): every other process pays nothing for it.
TORCHRUN_AGENT_PROBE = "starttrace.tracer.probes.torchelastic"


def _load_probes() -> list[Any]:
    """Import the probe modules loaded at activation (before the import hook exists, so they are
    not recorded)."""
    probes = activation.load_own(activation.PROBE_LOADER)
    job = state.job
    agent = job is not None and job.kind == "torchrun" and job.from_argv
    names = list(PROBES)
    environ = os.environ
    for name, variables in activation.EAGER_WHEN_ENV.items():
        if any((environ.get(variable) or "").strip() for variable in variables):
            names.append(name)
    if agent:
        names.append(TORCHRUN_AGENT_PROBE)
    joined = " ".join(getattr(sys, "orig_argv", None) or sys.argv)
    for name, words in activation.EAGER_WHEN_ARGV.items():
        if any(word in joined for word in words):
            names.append(name)
    modules = []
    for name in names:
        try:
            module = activation.load_own(name) if name in PROBES else probes.import_probe(name)
        except ImportError:
            continue  # a probe that is not part of this build
        except Exception as exc:
            recorder.report(f"probe {name} failed to load: {type(exc).__name__}: {exc}", key=name)
        else:
            modules.append(module)
            lifecycle.loaded_probes[probes.short_name(name)] = module
    return modules


def _install_probes(modules: list[Any]) -> None:
    """Install the probes loaded at activation; hook the others onto the modules they patch."""
    probes = activation.load_own(activation.PROBE_LOADER)  # loaded by _load_probes: found at once
    loaded = {module.__name__ for module in modules}
    for module in modules:
        probes.install_probe(module)
        if module.__name__ == PROBES[-1]:  # listed where they stood when they loaded at activation
            for name in HOOKED_AT_ACTIVATION:
                if name not in loaded:
                    probes.installed(probes.short_name(name))
    for name, targets in activation.LAZY_PROBES.items():
        if name not in loaded:
            load = probes.lazy_loader(name)
            for target in targets:
                recorder.when_imported(target, load)
    recorder.set_process_attrs({"starttrace.probes.installed": probes.installed_names()})


def make_fork_wrapper(real_fork: Any) -> Any:
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


def after_fork_in_child() -> None:
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
        state.exit_status = NO_STATUS
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
