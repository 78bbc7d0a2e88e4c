"""This process's part in its run, as the probes see it: the lifecycle calls they make
(`set_role`, `end_bootstrap`, `mark_process_ready`, `mark_ready`, `flag_cuda_before_fork`) and the
probe modules loaded (`loaded_probes`). The process's state (`state`), the names of the environment
a run hands down, and its host and clock domain are activation.py's (every process loads that
module at its start), named here too for the probes and readers that know them here.

Standard library only, and no `from __future__ import annotations` (see recorder.py).
"""

from starttrace.tracer import recorder
from starttrace.tracer.activation import (
    ENV_ANCHOR,
    ENV_CLOCK_DOMAIN,
    ENV_DIR,
    ENV_DISABLED,
    ENV_HOST_ID,
    ENV_INTERNAL,
    ENV_LAUNCH_NS,
    ENV_NEW_RUN_ID,
    ENV_PARENT_PID,
    ENV_PARENT_SPAN,
    ENV_PURE_PYTHON,
    ENV_ROOT_SPAN,
    ENV_RUN_DIR,
    ENV_RUN_ID,
    ENV_SERVICE,
    ENV_START_METHOD,
    ENV_TRACE_ID,
    OFF_VALUES,
    ON_VALUES,
    STATE_DEFAULTS,
    SWITCH_VARS,
    auto_export_endpoint,
    clock_domain,
    export_run_environment,
    otlp_endpoint,
    process_attrs,
    record_clock_later,
    record_clock_state,
    service_name,
    state,
    time_namespace,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "ENV_ANCHOR",
    "ENV_CLOCK_DOMAIN",
    "ENV_DIR",
    "ENV_DISABLED",
    "ENV_HOST_ID",
    "ENV_INTERNAL",
    "ENV_LAUNCH_NS",
    "ENV_NEW_RUN_ID",
    "ENV_PARENT_PID",
    "ENV_PARENT_SPAN",
    "ENV_PURE_PYTHON",
    "ENV_ROOT_SPAN",
    "ENV_RUN_DIR",
    "ENV_RUN_ID",
    "ENV_SERVICE",
    "ENV_START_METHOD",
    "ENV_TRACE_ID",
    "OFF_VALUES",
    "ON_VALUES",
    "STATE_DEFAULTS",
    "SWITCH_VARS",
    "auto_export_endpoint",
    "clock_domain",
    "export_run_environment",
    "otlp_endpoint",
    "process_attrs",
    "record_clock_later",
    "record_clock_state",
    "service_name",
    "state",
    "time_namespace",
]

# The probe modules the probe loader (probes/__init__.py) loaded in this process, by short name
# ("torch", "compile", ...): what the tracer asks of a lazily loaded probe, without loading it
# where the program never imported its library.
loaded_probes: "dict[str, Any]" = {}


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
