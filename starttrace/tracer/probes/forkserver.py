"""The multiprocessing probe's forkserver part: `forkserver.start` around
`ForkServer.ensure_running` (with the preload list), `forkserver.preload` with one `preload
<module>` span per module inside the forkserver, and the opt-in extra preload
(STARTTRACE_FORKSERVER_PRELOAD). The probe (multiprocessing.py) loads it with
`multiprocessing.forkserver`, or at activation where that setting is set: most processes that
import multiprocessing (torch does) never start a forkserver.
"""

import os
import sys

from starttrace.tracer import lifecycle, recorder
from starttrace.tracer.probes.multiprocessing import (
    ENV_PRELOAD,
    _child_pid,
    _marked,
    _rebind_module_aliases,
    _record_launch,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


_extra_preload: list[str] = []


def read_extra_preload() -> None:
    """STARTTRACE_FORKSERVER_PRELOAD: dotted module names separated by commas."""
    raw = os.environ.get(ENV_PRELOAD, "")
    if not raw.strip():
        return
    names: list[str] = []
    bad: list[str] = []
    for part in raw.split(","):
        name = part.strip()
        if not name:
            continue
        if all(piece.isidentifier() for piece in name.split(".")):
            if name not in names:
                names.append(name)
        else:
            bad.append(name)
    _extra_preload[:] = names
    if not lifecycle.state.is_root:
        return
    if bad:
        recorder.report(f"{ENV_PRELOAD}: ignoring {', '.join(map(repr, bad))}: not module names")
    if names:
        recorder.set_process_attrs({"starttrace.forkserver_preload_extra": list(names)})
        message = f"starttrace: {ENV_PRELOAD}: every forkserver of this run also preloads {', '.join(names)}\n"
        os.write(2, message.encode("utf-8", "replace"))


def _add_extra_preload(server: "Any") -> list[str]:
    """Extend a ForkServer's preload list with the opt-in modules; returns those it added."""
    if not _extra_preload:
        return []
    current = [str(m) for m in (getattr(server, "_preload_modules", None) or [])]
    added = [m for m in _extra_preload if m not in current]
    if added:
        server._preload_modules = current + added
    return added


def patch_forkserver(module: "Any") -> None:
    server_class = getattr(module, "ForkServer", None)
    if server_class is not None and not getattr(server_class.ensure_running, "__starttrace__", False):
        original_ensure = server_class.ensure_running

        def ensure_running(self: "Any") -> None:
            if not recorder.active() or getattr(self, "_forkserver_pid", None) is not None:
                return original_ensure(self)
            added = _add_extra_preload(self)
            preload = [str(m) for m in (getattr(self, "_preload_modules", None) or [])]
            attrs: dict[str, Any] = {"starttrace.phase": "forkserver", "starttrace.preload": preload}
            if added:
                attrs["starttrace.preload_added"] = added
            lifecycle.flag_cuda_before_fork(attrs)
            _record_launch(
                "forkserver.start",
                attrs,
                lambda: original_ensure(self),
                lambda: _child_pid(getattr(self, "_forkserver_pid", None)),
            )

        server_class.ensure_running = _marked(ensure_running, original_ensure)
        _rebind_module_aliases(module, "_forkserver", ("ensure_running",))

    original_main = getattr(module, "main", None)
    if original_main is None or getattr(original_main, "__starttrace__", False):
        return

    def main(
        listener_fd: int,
        alive_r: int,
        preload: "Any",
        main_path: "Any" = None,
        sys_path: "Any" = None,
        *args: "Any",
        **kwargs: "Any",
    ) -> "Any":
        if not recorder.active():
            return original_main(listener_fd, alive_r, preload, main_path, sys_path, *args, **kwargs)
        try:
            lifecycle.set_role("forkserver")
            lifecycle.end_bootstrap()
            if preload:
                # what multiprocessing's main does with a preload (its own is then skipped): 3.14's
                # sets sys.argv (gh-143706) and sys.path (gh-117378) first, imports __main__ from
                # main_path (passed since gh-126631) and the modules, then flushes stdout/stderr
                sys_argv = kwargs.get("sys_argv")
                if sys_argv is not None:
                    sys.argv[:] = sys_argv
                if sys_path is not None:
                    sys.path[:] = sys_path
                _preload(module, list(preload), main_path)
                preload = None
                if "_flush_std_streams" in original_main.__code__.co_names:  # 3.14 (gh-135335)
                    module.util._flush_std_streams()
            elif sys_path is not None:
                sys.path[:] = sys_path
        except Exception as exc:
            recorder.report(f"forkserver probe failed: {type(exc).__name__}: {exc}", key="forkserver-main")
        return original_main(listener_fd, alive_r, preload, main_path, sys_path, *args, **kwargs)

    module.main = _marked(main, original_main)


def _preload(forkserver: "Any", modules: list[str], main_path: "Any") -> None:
    """The forkserver's preload, as multiprocessing does it, with a span per module."""
    attrs: dict[str, Any] = {"starttrace.phase": "forkserver_preload", "starttrace.preload": modules}
    added = [m for m in modules if m in _extra_preload]
    if added:
        attrs["starttrace.preload_added"] = added
    outer = recorder.begin("forkserver.preload", attrs)
    failed: list[str] = []
    try:
        main_imported = False
        if "__main__" in modules and main_path is not None:
            process = forkserver.process
            process.current_process()._inheriting = True
            try:
                main_attrs = {
                    "starttrace.phase": "forkserver_preload",
                    "starttrace.import.module": "__main__",
                    "code.file.path": str(main_path),
                }
                with recorder.span("preload __main__", main_attrs):
                    forkserver.spawn.import_main_path(main_path)
                main_imported = True
            finally:
                del process.current_process()._inheriting
        for name in modules:
            if name == "__main__" and main_imported:  # its span is the one above: one per module
                __import__(name)
                continue
            span_id = recorder.begin(
                f"preload {name}",
                {
                    "starttrace.phase": "forkserver_preload",
                    "starttrace.import.module": name,
                    "starttrace.preloaded": name in sys.modules,
                },
            )
            try:
                __import__(name)
            except ImportError as exc:
                failed.append(name)
                recorder.end(span_id, error=f"{type(exc).__name__}: {exc}")
                continue
            except BaseException as exc:
                recorder.end(span_id, error=f"{type(exc).__name__}: {exc}")
                raise
            recorder.end(span_id)
    except BaseException as exc:
        recorder.end(outer, {"starttrace.preload_failed": failed}, error=f"{type(exc).__name__}: {exc}")
        raise
    end_attrs: dict[str, Any] = {"starttrace.preload_failed": failed}
    lifecycle.flag_cuda_before_fork(end_attrs)
    recorder.end(outer, end_attrs)
