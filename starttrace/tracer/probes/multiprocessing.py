"""Process spans for multiprocessing (spawn, fork, forkserver) and subprocess.

- `process.launch` in the parent around `Process.start()` and `subprocess.Popen(...)`, with the
  child pid and start method; the child learns the launch span through its environment.
- `forkserver.start` around `ForkServer.ensure_running` (with the preload list), and inside the
  forkserver process `forkserver.preload` with one `preload <module>` span per module.
- `process.bootstrap` in the child ends when the target starts (`BaseProcess.run`).
- `process.wait` around `Popen.wait` / `communicate` while the child runs.
The `os.fork` wrapper that records `process.fork` lives in boot.py (it covers every fork). The
forkserver part is forkserver.py, loaded with `multiprocessing.forkserver`.

Opt-in `STARTTRACE_FORKSERVER_PRELOAD=mod,mod`: every forkserver of the tree also preloads those
modules (docs/probes.md). A child is role `child` with its Process name and target, or `helper`
when its target serves the library.
"""

import os
import sys
from time import monotonic_ns

from starttrace.tracer import lifecycle, recorder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


ENV_PRELOAD = "STARTTRACE_FORKSERVER_PRELOAD"
HELPER_TARGETS = ("concurrent.futures", "multiprocessing.", "torch._inductor", "torch.utils.data", "triton")
FORKSERVER_PART = "starttrace.tracer.probes.forkserver"


# not `_wrap._mark`: this probe can load at activation (STARTTRACE_FORKSERVER_PRELOAD), `_wrap` does not
def _marked(wrapper: "Any", original: "Any") -> "Any":
    wrapper.__starttrace__ = True
    wrapper.__wrapped__ = original
    return wrapper


def install() -> None:
    if os.environ.get(ENV_PRELOAD, "").strip():
        _forkserver_part().read_extra_preload()
    recorder.when_imported("multiprocessing.process", _patch_process)
    recorder.when_imported("multiprocessing.forkserver", _patch_forkserver)
    recorder.when_imported("multiprocessing.resource_tracker", _patch_resource_tracker)
    recorder.when_imported("subprocess", _patch_subprocess)


def _forkserver_part() -> "Any":
    """This probe's forkserver part (forkserver.py), loaded past the import probe with
    `multiprocessing.forkserver`: most processes that import multiprocessing never start one."""
    from starttrace.tracer.probes import import_unrecorded  # the probe loader: loaded before any probe

    return import_unrecorded(FORKSERVER_PART)


def _patch_forkserver(module: "Any") -> None:
    _forkserver_part().patch_forkserver(module)


def launch_variables(span_id: str, method: str) -> dict[str, str]:
    """What a child started by exec reads to find the span that launched it (see boot._activate)."""
    return {
        lifecycle.ENV_PARENT_SPAN: span_id,
        lifecycle.ENV_PARENT_PID: str(os.getpid()),
        lifecycle.ENV_START_METHOD: method,
        lifecycle.ENV_LAUNCH_NS: str(monotonic_ns()),
    }


def _set_launch_environment(span_id: str, method: str) -> "dict[str, str | None]":
    """Put the launch variables in os.environ while a child is started (valid only in a direct
    child); what they replaced, for `_restore_environment`. Not a class: creating one costs ~58k
    instructions in every process that imports subprocess."""
    saved: dict[str, str | None] = {}
    for key, value in launch_variables(span_id, method).items():
        saved[key] = os.environ.get(key)
        os.environ[key] = value
    return saved


def _restore_environment(saved: "dict[str, str | None]") -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _record_launch(
    name: str, attrs: "dict[str, Any]", launch: "Callable[[], Any]", end_attrs: "Callable[[], Any]"
) -> None:
    """Run `launch()` inside span `name`, with the launch variables set for exec'd children;
    the span ends with `end_attrs()` (the child pid, ...) or with the error `launch` raised."""
    span_id = recorder.begin(name, attrs)
    try:
        saved = _set_launch_environment(span_id, "spawn")
        try:
            launch()
        finally:
            _restore_environment(saved)
    except BaseException as exc:
        recorder.end(span_id, error=f"{type(exc).__name__}: {exc}")
        raise
    recorder.end(span_id, end_attrs())


def _child_pid(pid: "Any") -> "dict[str, Any] | None":
    return {"starttrace.child_pid": int(pid)} if pid else None


def _patch_process(module: "Any") -> None:
    base = module.BaseProcess
    if getattr(base.start, "__starttrace__", False):
        return
    original_start = base.start
    original_bootstrap = base._bootstrap

    def start(self: "Any") -> None:
        if not recorder.active():
            return original_start(self)
        method = getattr(self, "_start_method", None) or _default_method()
        attrs: dict[str, Any] = {
            "starttrace.phase": "launch",
            "starttrace.process_name": str(getattr(self, "_name", "")),
            "starttrace.start_method": method or "",
        }
        lifecycle.flag_cuda_before_fork(attrs)

        def end_attrs() -> "dict[str, Any]":
            result: dict[str, Any] = {"starttrace.child_pid": int(self.pid or 0)}
            actual = getattr(getattr(self, "_popen", None), "method", None)
            if actual:
                result["starttrace.start_method"] = actual
            return result

        lifecycle.state.in_launch += 1
        try:
            _record_launch("process.launch", attrs, lambda: original_start(self), end_attrs)
        finally:
            lifecycle.state.in_launch -= 1

    def _bootstrap(self: "Any", *args: "Any", **kwargs: "Any") -> "Any":
        if recorder.active():
            try:
                _enter_child(self)
            except Exception as exc:
                recorder.report(f"bootstrap probe failed: {type(exc).__name__}: {exc}", key="bootstrap")
        return original_bootstrap(self, *args, **kwargs)

    base.start = _marked(start, original_start)
    base._bootstrap = _marked(_bootstrap, original_bootstrap)


def _default_method() -> str:
    """The start method a Process without one of its own gets: the one set, else the platform's
    default (3.14: forkserver on Linux, where a program that names none now gets it), read without
    choosing it (`get_start_method()` would fix it, and a later `set_start_method` would fail)."""
    context = sys.modules.get("multiprocessing.context")
    if context is None:
        return ""
    try:
        default = context._default_context
        chosen = getattr(default, "_actual_context", None) or getattr(default, "_default_context", None)
        return str(getattr(chosen, "_name", "") or "")
    except Exception:
        return ""


def _target_name(process: "Any") -> tuple[str, str]:
    """(module, qualified name) of a Process's target, '' when it has none."""
    target = getattr(process, "_target", None)
    if target is None:
        return "", ""
    function = getattr(target, "__func__", target)
    return str(getattr(function, "__module__", "") or ""), str(getattr(function, "__qualname__", "") or "")


def _enter_child(process: "Any") -> None:
    name = str(getattr(process, "_name", ""))
    module, qualname = _target_name(process)
    attrs: dict[str, Any] = {"starttrace.process_name": name}
    if qualname:
        attrs["starttrace.process_target"] = qualname
        attrs["starttrace.process_target_module"] = module
    if not recorder.process_attrs.get("starttrace.role"):
        attrs["starttrace.role"] = "helper" if module.startswith(HELPER_TARGETS) else "child"
    recorder.set_process_attrs(attrs)
    original_run = process.run

    def run(*args: "Any", **kwargs: "Any") -> "Any":
        process.run = original_run  # one-shot: restore the bound method
        lifecycle.end_bootstrap({"starttrace.process_name": name})
        return original_run(*args, **kwargs)

    process.run = run


def _rebind_module_aliases(module: "Any", instance_name: str, methods: tuple[str, ...]) -> None:
    """`multiprocessing.forkserver.ensure_running` is a bound method taken at import time (vLLM
    calls it directly): rebind such aliases so they reach the patched class attribute."""
    instance = getattr(module, instance_name, None)
    if instance is None:
        return
    for method in methods:
        if hasattr(module, method):
            setattr(module, method, getattr(instance, method))


def _patch_resource_tracker_launch(module: "Any") -> None:
    """`process.launch` around the resource tracker's start: `ResourceTracker._launch` since
    gh-131788 (3.14, 3.13.7; also reached straight from `register`), before that `ensure_running`."""
    tracker_class = getattr(module, "ResourceTracker", None)
    if tracker_class is None:
        return
    name = "_launch" if callable(getattr(tracker_class, "_launch", None)) else "ensure_running"
    original = getattr(tracker_class, name)
    if getattr(original, "__starttrace__", False):
        return

    def launch(self: "Any", *args: "Any", **kwargs: "Any") -> None:
        running = name == "ensure_running" and (
            getattr(self, "_fd", None) is not None or getattr(self, "_pid", None) is not None
        )
        if not recorder.active() or running:
            return original(self, *args, **kwargs)
        attrs: dict[str, Any] = {
            "starttrace.phase": "launch",
            "starttrace.process_name": "resource_tracker",
            "starttrace.start_method": "spawn",
        }
        _record_launch(
            "process.launch",
            attrs,
            lambda: original(self, *args, **kwargs),
            lambda: _child_pid(getattr(self, "_pid", None)),
        )

    setattr(tracker_class, name, _marked(launch, original))
    if name == "ensure_running":
        _rebind_module_aliases(module, "_resource_tracker", ("ensure_running",))


def _patch_resource_tracker(module: "Any") -> None:
    _patch_resource_tracker_launch(module)
    tracker_main = getattr(module, "main", None)
    if tracker_main is None or getattr(tracker_main, "__starttrace__", False):
        return

    def main(*args: "Any", **kwargs: "Any") -> "Any":
        try:
            lifecycle.set_role("helper")
            recorder.set_process_attrs({"starttrace.process_name": "resource_tracker"})
            lifecycle.end_bootstrap()
            lifecycle.mark_process_ready({"starttrace.reason": "resource tracker serving"})
        except Exception as exc:
            recorder.report(f"resource tracker probe failed: {exc}", key="resource-tracker")
        return tracker_main(*args, **kwargs)

    module.main = _marked(main, tracker_main)


def _patch_subprocess(module: "Any") -> None:
    popen = module.Popen
    if getattr(popen.__init__, "__starttrace__", False):
        return
    original_init = popen.__init__

    def __init__(self: "Any", args: "Any", *rest: "Any", **kwargs: "Any") -> None:
        if not recorder.active():
            return original_init(self, args, *rest, **kwargs)
        command = args if isinstance(args, (str, bytes)) else " ".join(str(a) for a in list(args)[:8])
        if isinstance(command, bytes):
            command = command.decode("utf-8", "replace")
        attrs: dict[str, Any] = {
            "starttrace.phase": "launch",
            "starttrace.start_method": "exec",
            "process.command": str(command)[:300],
        }
        span_id = recorder.begin("process.launch", attrs)
        env = kwargs.get("env")
        if len(rest) < 9:  # env was not passed positionally: give the child our variables
            try:
                kwargs["env"] = _child_environment(env, launch_variables(span_id, "exec"))
            except Exception as exc:  # e.g. a bytes-keyed env: leave it as the caller made it
                recorder.report(f"cannot pass the run to a subprocess env: {exc}", key="popen-env")
        try:
            original_init(self, args, *rest, **kwargs)
        except BaseException as exc:
            recorder.end(span_id, error=f"{type(exc).__name__}: {exc}")
            raise
        recorder.end(span_id, _child_pid(getattr(self, "pid", 0)))

    popen.__init__ = _marked(__init__, original_init)
    for method in ("wait", "communicate"):
        _patch_popen_wait(popen, method)


POLL_S = 1.0  # a Popen.wait/communicate timeout this short is a poll, not a wait


def _patch_popen_wait(popen: "Any", method: str) -> None:
    """`process.wait` (phase `wait`, the child's pid) around `Popen.wait` and `Popen.communicate`
    while the child runs: the analysis follows the wait into the child (subprocess.run, e.g. vLLM's
    model-inspection helper). The outermost call only (communicate calls wait), and not a poll: a
    call with a timeout of POLL_S or less (`wait(timeout=0.1)` in a loop) would write a span a turn."""
    original = getattr(popen, method)
    timeout_at = 0 if method == "wait" else 1  # wait(timeout), communicate(input, timeout)

    def wrapper(self: "Any", *args: "Any", **kwargs: "Any") -> "Any":
        if not recorder.active() or self.returncode is not None or getattr(self, "_starttrace_waiting", False):
            return original(self, *args, **kwargs)
        timeout = kwargs.get("timeout", args[timeout_at] if len(args) > timeout_at else None)
        if isinstance(timeout, (int, float)) and timeout <= POLL_S:
            return original(self, *args, **kwargs)
        pid = getattr(self, "pid", 0)
        attrs = {"starttrace.phase": "wait", "starttrace.wait.call": f"Popen.{method}", **(_child_pid(pid) or {})}
        span_id = recorder.begin("process.wait", attrs)
        self._starttrace_waiting = True
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            recorder.end(span_id, error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._starttrace_waiting = False
        recorder.end(span_id, {"process.exit_code": self.returncode} if isinstance(self.returncode, int) else None)
        return result

    setattr(popen, method, _marked(wrapper, original))


def _child_environment(env: "Any", extra: dict[str, str]) -> dict[str, str]:
    if env is None:
        merged = dict(os.environ)
    else:
        merged = {str(k): str(v) for k, v in env.items()}
        for key, value in os.environ.items():
            if key.startswith("STARTTRACE") or key in lifecycle.SWITCH_VARS or key == "traceparent":
                merged.setdefault(key, value)
    merged.update(extra)
    return merged
