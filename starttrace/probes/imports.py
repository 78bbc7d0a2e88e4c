"""Import spans: wraps `_frozen_importlib._find_and_load`, the point `-X importtime` times.

CPython looks `_find_and_load` up as an attribute of the importlib module on every uncached
import (`import` statements, `__import__`, `importlib.import_module`), so one wrapper sees every
module load. Imports that arrive through `importlib.import_module` (whose `import_` argument is
`_gcd_import`, not `builtins.__import__`) are tagged: `-X importtime` does not print them.
"""

from __future__ import annotations

import os
import sys
from _thread import get_ident
from time import monotonic_ns

from starttrace import recorder
from starttrace.journal import quote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_original: Callable[[str, Any], Any] | None = None


def install() -> None:
    global _original
    import _frozen_importlib as bootstrap  # already loaded: the interpreter runs on it

    if getattr(bootstrap._find_and_load, "__starttrace__", False):
        return
    min_us = os.environ.get("STARTTRACE_MIN_IMPORT_US", "0").strip()
    if min_us.isdigit() and int(min_us) > 0:
        recorder.min_span_ns = int(min_us) * 1000
    elif min_us not in ("", "0"):
        recorder.report(f"ignoring STARTTRACE_MIN_IMPORT_US={min_us!r}: not a whole number of microseconds")
    _original = bootstrap._find_and_load
    bootstrap._find_and_load = _make_wrapper(_original, __import__)


def uninstall() -> None:
    import _frozen_importlib as bootstrap

    if _original is not None and getattr(bootstrap._find_and_load, "__starttrace__", False):
        bootstrap._find_and_load = _original


def _make_wrapper(original: Callable[[str, Any], Any], builtin_import: Any) -> Callable[[str, Any], Any]:
    modules = sys.modules
    stacks = recorder._stacks
    new_id = recorder.new_span_id
    write = recorder.write

    def _find_and_load(name: str, import_: Any) -> Any:
        if name in modules or recorder._writer is None:
            return original(name, import_)
        span_id = new_id()
        ident = get_ident()
        stack = stacks.get(ident)
        if stack is None:
            stack = stacks[ident] = []
        parent = stack[-1] if stack else recorder.process_span_id
        via = "" if import_ is builtin_import else ',"starttrace.import.via":"importlib"'
        thread = "" if ident == recorder._main_ident else ',"th":%d' % ident
        quoted = quote(name)
        start = monotonic_ns()
        line = (
            '{"k":"b","s":"%s","p":"%s","n":"import %s","t":%d%s,"a":{"starttrace.phase":"import",'
            '"starttrace.import.module":%s%s}}\n'
        ) % (span_id, parent, quoted[1:-1], start, thread, quoted, via)
        if recorder.min_span_ns:
            recorder.pending[span_id] = (line, start)
        else:
            if recorder.pending:
                recorder.flush_pending(stack)
            write(line)
        stack.append(span_id)
        try:
            module = original(name, import_)
        except BaseException as exc:
            recorder.end(span_id, error=f"{type(exc).__name__}: {exc}")
            raise
        path = getattr(module, "__file__", None)
        if recorder.pending or span_id in recorder._foreign or not stack or stack[-1] != span_id:
            recorder.end(span_id, {"code.file.path": path} if isinstance(path, str) else None)
        else:  # the common case, inlined: this span is on top of this thread's stack
            stack.pop()
            if isinstance(path, str):
                write('{"k":"e","s":"%s","t":%d,"a":{"code.file.path":%s}}\n' % (span_id, monotonic_ns(), quote(path)))
            else:
                write('{"k":"e","s":"%s","t":%d}\n' % (span_id, monotonic_ns()))
        if recorder._post_import_hooks:
            recorder.run_post_import_hooks(name, module)
        return module

    _find_and_load.__starttrace__ = True  # type: ignore[attr-defined]
    _find_and_load.__wrapped__ = original  # type: ignore[attr-defined]
    return _find_and_load
