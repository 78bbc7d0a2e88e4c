"""This process's part in its run: what activation learnt (`state`), the names of the environment
a run hands down to its children, and the lifecycle calls the probes make (`set_role`,
`end_bootstrap`, `mark_process_ready`, `mark_ready`, `flag_cuda_before_fork`).

Below boot and the probes, which both import it (boot fills `state` at activation); it imports
only the recorder. Standard library only, and no `from __future__ import annotations` (see
recorder.py).
"""

import os
import sys

from starttrace.tracer import recorder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any
else:
    Any = object  # annotations are evaluated at run time here (see the module docstring)

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
ENV_MIN_IMPORT_US = "STARTTRACE_MIN_IMPORT_US"
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
        from starttrace.tracer import nodeinfo  # loaded at activation (boot): no new module

        nodeinfo.record_clock_later(state.run_dir, state.root_span, reap)


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
