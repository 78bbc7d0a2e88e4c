"""This process's part in its run: what activation learnt (`state`), the names of the environment
a run hands down to its children, the lifecycle calls the probes make (`set_role`,
`end_bootstrap`, `mark_process_ready`, `mark_ready`, `flag_cuda_before_fork`), and which host and
clock domain it runs in (`process_attrs`, `clock_domain`; one module with the rest: every module
loaded at activation costs ~0.4 M instructions, docs/benchmarks.md).

Host and clock domain: a clock domain is a set of processes whose CLOCK_MONOTONIC is one clock: one
kernel boot (`/proc/sys/kernel/random/boot_id`) and one time namespace (`readlink
/proc/self/ns/time`; a time namespace offsets CLOCK_MONOTONIC, containers without one share the
host's). The root process of a run reads them once and passes them on in the environment
(`STARTTRACE_CLOCK_DOMAIN`, `STARTTRACE_HOST_ID`), so its children pay two dictionary lookups.
Every process records them as resource attributes `starttrace.clock.domain` and `host.id` (the
machine id, else the boot id). The kernel's NTP state is read off the hot path
(`starttrace.clocksync`).

Below boot and the probes, which both import it (boot fills `state` at activation); it imports
only the recorder. Standard library only, and no `from __future__ import annotations` (see
recorder.py).
"""

import os
import sys

from starttrace.tracer import recorder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping
    from typing import Any
else:  # annotations are evaluated at run time here (see the module docstring)
    Any = object
    MutableMapping = dict

SWITCH_VARS = ("STARTTRACE", "VLLM_STARTTRACE")
ON_VALUES = frozenset({"1", "true", "on", "yes"})
OFF_VALUES = frozenset({"", "0", "false", "off", "no"})

ENV_RUN_ID = "STARTTRACE_RUN_ID"
ENV_RUN_DIR = "STARTTRACE_RUN_DIR"
ENV_TRACE_ID = "STARTTRACE_TRACE_ID"
ENV_ROOT_SPAN = "STARTTRACE_ROOT_SPAN"
ENV_PARENT_SPAN = "STARTTRACE_PARENT_SPAN"
ENV_PARENT_PID = "STARTTRACE_PARENT_PID"
ENV_START_METHOD = "STARTTRACE_START_METHOD"
ENV_LAUNCH_NS = "STARTTRACE_LAUNCH_NS"
ENV_SERVICE = "STARTTRACE_SERVICE_NAME"
ENV_DIR = "STARTTRACE_DIR"
ENV_PURE_PYTHON = "STARTTRACE_PURE_PYTHON"  # on: ignore the C core of the hot path
ENV_ANCHOR = "STARTTRACE_ANCHOR"
ENV_NEW_RUN_ID = "STARTTRACE_NEW_RUN_ID"
ENV_DISABLED = "STARTTRACE_DISABLED"  # set when the run could not be recorded: children stay off
ENV_INTERNAL = "STARTTRACE_INTERNAL"  # set in starttrace's own helper processes: never traced


class ProcessState:
    """What this process knows about itself and its run (one instance, module-global)."""

    run_id = ""
    run_dir = ""
    trace_id = ""
    root_span = ""
    is_root = False
    method = "exec"
    created = 0
    activated = 0
    ready = False
    ended = False
    in_launch = 0  # > 0 while a multiprocessing Process.start() runs in this process
    fork_span = ""
    fork_started = 0
    bootstrap_span = ""
    role = ""
    instance_id = ""
    activation_seen = False
    exit_status: object = None  # set to boot._NO_STATUS at activation; sys.exit(status) records it
    # One clock anchor for the whole run (the root's), so every lane converts monotonic time to
    # epoch time the same way and lanes of different processes line up exactly.
    anchor_mono = 0
    anchor_epoch = 0
    parent_of_root: str | None = None
    # The job of several nodes this root belongs to (launchers.identify at run creation: roots only),
    # None: a run of its own
    job: Any = None


state = ProcessState()

# The probe modules the probe loader (probes/__init__.py) loaded in this process, by short name
# ("torch", "compile", ...): what the tracer asks of a lazily loaded probe, without loading it
# where the program never imported its library.
loaded_probes: "dict[str, Any]" = {}


def export_run_environment() -> None:
    """Hand this root's run down to its children (the environment they inherit)."""
    environ = os.environ
    environ[ENV_RUN_ID] = state.run_id
    environ[ENV_RUN_DIR] = state.run_dir
    environ[ENV_TRACE_ID] = state.trace_id
    environ[ENV_ROOT_SPAN] = state.root_span
    environ[ENV_ANCHOR] = f"{state.anchor_mono}:{state.anchor_epoch}"
    environ.setdefault(ENV_SERVICE, service_name())
    # vLLM reads and writes the lowercase W3C header: its own startup spans join this trace.
    environ["traceparent"] = f"00-{state.trace_id}-{state.root_span}-01"


def service_name() -> str:
    environ = os.environ
    name = environ.get(ENV_SERVICE) or environ.get("OTEL_SERVICE_NAME")
    if name:
        return name
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if "-m" in argv[1:]:
        index = argv.index("-m", 1)
        if index + 1 < len(argv):
            return argv[index + 1].split(".")[0]
    if "-c" in argv[1:]:
        return "python"
    for arg in argv[1:]:
        if not arg.startswith("-"):
            return os.path.splitext(os.path.basename(arg))[0] or "python"
    return os.path.basename(argv[0]) if argv else "python"


def otlp_endpoint(environ: "Mapping[str, str] | None" = None) -> "str | None":
    environ = os.environ if environ is None else environ
    specific = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if specific:
        return specific
    general = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return general.rstrip("/") + "/v1/traces" if general else None


def auto_export_endpoint(environ: "Mapping[str, str] | None" = None) -> "str | None":
    """The endpoint a root's follower exports the run to (an OTLP endpoint is configured and
    STARTTRACE_OTLP_AUTO is not 0); None: the run is known from its journals only."""
    environ = os.environ if environ is None else environ
    endpoint = otlp_endpoint(environ)
    return endpoint if endpoint and environ.get("STARTTRACE_OTLP_AUTO", "1") != "0" else None


def record_clock_state(reap: bool) -> None:
    """The NTP state of a journal-only run, read off the traced processes (with a follower, the
    follower measures it): once per root, at its ready or exit."""
    if state.is_root and auto_export_endpoint() is None:
        record_clock_later(state.run_dir, state.root_span, reap)


def flag_cuda_before_fork(attrs: "dict[str, Any]") -> None:
    """About to fork or launch: if this process initialized CUDA, say so on the span (`attrs`)
    and on the process (the CUDA-clean audit)."""
    if _cuda_initialized():
        attrs["starttrace.cuda_before_fork"] = True
        recorder.set_process_attrs({"starttrace.cuda_before_fork": True})


def _cuda_initialized() -> bool:
    torch_probe = loaded_probes.get("torch")  # loaded once the program imported torch.cuda
    if torch_probe is None:
        return False
    try:
        return bool(torch_probe.cuda_initialized())
    except Exception:
        return False


def end_bootstrap(attrs: "dict[str, Any] | None" = None) -> None:
    """Called by the multiprocessing probe when the child's target starts."""
    if state.bootstrap_span:
        recorder.end(state.bootstrap_span, attrs)
        state.bootstrap_span = ""


def set_role(role: str) -> None:
    state.role = role
    recorder.set_process_attrs({"starttrace.role": role})


def mark_process_ready(attrs: "dict[str, Any] | None" = None) -> None:
    """This process has finished starting (a worker in its busy loop, a helper serving)."""
    try:
        if recorder.active():
            ready_attrs: dict[str, Any] = {"starttrace.phase": "ready"}
            if attrs:
                ready_attrs.update(attrs)
            recorder.instant("process.ready", ready_attrs, parent=recorder.process_span_id)
    except Exception as exc:
        recorder.report(f"mark_process_ready failed: {type(exc).__name__}: {exc}", key="process-ready")


def mark_ready(attrs: "dict[str, Any] | None" = None) -> None:
    """The server answers: record `ready`, end this process's span and the run's `startup` span."""
    try:
        if not recorder.active() or state.ready:
            return
        state.ready = True
        ready_attrs: dict[str, Any] = {"starttrace.phase": "ready"}
        if attrs:
            ready_attrs.update(attrs)
        recorder.instant("ready", ready_attrs, parent=recorder.process_span_id)
        if state.root_span:
            recorder.end(state.root_span, {"starttrace.ended_by": "ready"})
        record_clock_state(reap=True)
    except Exception as exc:
        recorder.report(f"mark_ready failed: {type(exc).__name__}: {exc}", key="ready")


ENV_CLOCK_DOMAIN = "STARTTRACE_CLOCK_DOMAIN"
ENV_HOST_ID = "STARTTRACE_HOST_ID"


def _read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read(200).decode("ascii", "replace").strip()
    except OSError:
        return ""


def time_namespace() -> str:
    """The inode of this process's time namespace ("" without /proc or time namespaces)."""
    try:
        link = os.readlink("/proc/self/ns/time")  # "time:[4026531834]"
    except OSError:
        return ""
    return link.partition("[")[2].rstrip("]")


def clock_domain() -> tuple[str, str]:
    """(clock domain, host id) of this process, read from /proc (the root does this once)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    if not boot:
        boot = "host:" + os.uname().nodename
    timens = time_namespace()
    domain = f"{boot}/{timens}" if timens else boot
    return domain, _read("/etc/machine-id") or boot


def process_attrs(environ: MutableMapping[str, str], is_root: bool = False, job: Any = None) -> dict[str, Any]:
    """Resource attributes of this process: clock domain and host id (inherited from the run's
    root through `environ`; a root reads them and puts them there for its children), the keys of
    the root's job of several nodes (`job`: launchers.identify's), plus what a rank started for
    torch's env:// rendezvous names as its endpoint."""
    domain = environ.get(ENV_CLOCK_DOMAIN)
    host_id = environ.get(ENV_HOST_ID)
    if is_root or not domain or not host_id:
        domain, host_id = clock_domain()
        environ[ENV_CLOCK_DOMAIN] = domain
        environ[ENV_HOST_ID] = host_id
    else:
        # the boot id is the kernel's and cannot change below the root; the time namespace can
        # (a child started with `unshare --time`): that is one readlink, read by every process
        timens = time_namespace()
        domain = domain.partition("/")[0] + (f"/{timens}" if timens else "")
    attrs: dict[str, Any] = {"starttrace.clock.domain": domain, "host.id": host_id}
    if is_root and job is not None:
        attrs.update(job.attrs())
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if addr and port:
        attrs["starttrace.dist.master"] = f"{addr}:{port}"
    return attrs


class _Clock:
    recorded = False


_HELPER_ENV = ("PATH", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH")


def record_clock_later(run_dir: str, root_span: str, reap: bool) -> None:
    """The kernel's NTP state for a run no exporter follows (journals only): a root process calls
    this at its `ready` or exit (once; `lifecycle.record_clock_state`). A detached helper (`python -m
    starttrace.clocksync`, not traced, its output to /dev/null: it holds none of the program's
    pipes) reads adjtimex, which needs ctypes, and writes `<run folder>/clock-<root span>.json`;
    readers put it on the processes of this host (docs/journal.md). `reap`: wait for the helper on
    a thread of ours (at ready; at exit, init reaps it)."""
    environ = os.environ
    if _Clock.recorded or not run_dir or not root_span:
        return
    _Clock.recorded = True
    env = {"STARTTRACE_INTERNAL": "1"}  # what the helper needs, not a copy of the program's environment
    for name in _HELPER_ENV:
        value = environ.get(name)
        if value is not None:
            env[name] = value
    domain = environ.get(ENV_CLOCK_DOMAIN) or clock_domain()[0]
    quiet = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    args = [sys.executable, "-m", "starttrace.clocksync", run_dir, root_span, domain]
    try:
        pid = os.posix_spawn(sys.executable, args, env, file_actions=quiet, setsid=True)
    except Exception as exc:
        recorder.report(f"cannot record the clock state: {type(exc).__name__}: {exc}", key="clock-state")
        return
    if not reap:
        return
    try:  # reaped by a thread of ours: no zombie stays behind for the program to find in os.wait()
        from _thread import start_new_thread  # a builtin module: no footprint

        start_new_thread(_reap, (pid,))
    except Exception:
        pass  # at interpreter shutdown: the process ends, and init reaps the helper


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except OSError:  # the program reaped it first (os.wait(), waitpid(-1))
        pass
