"""Import spans: wraps `_frozen_importlib._find_and_load`, the point `-X importtime` times.

CPython looks `_find_and_load` up as an attribute of the importlib module on every uncached
import (`import` statements, `__import__`, `importlib.import_module`), so one wrapper sees every
module load. Imports that arrive through `importlib.import_module` (whose `import_` argument is
`_gcd_import`, not `builtins.__import__`) are tagged: `-X importtime` does not print them.

The wrapper runs for every module a program loads, so its common case (the main thread, an
`import` statement, a name without a newline) is written out inline, without helper calls: two
compact import records (`I` at the begin, `E` at the end: docs/journal.md, version 3), two clock
reads and two copies into the journal's mapping (docs/benchmarks.md has its cost in
instructions). Anything unusual (another thread, `importlib`, held-back spans, a fork during the
import, a probe waiting for this module, a full journal segment) takes the recorder's general
path and its JSON records.

Where the hot path's C core is built (`starttrace/tracer/_hotpath.c`), its `ImportHook` takes the
common case instead, writing the same two records for a quarter of the cost, and hands every
other import, whole, to this wrapper (and the rare ends to `_end_slow`, `_end_failed`,
`_end_record` and `_write_compact` below).
"""

import os
import sys
from _thread import get_ident
from time import monotonic_ns

from starttrace.tracer import journal, recorder
from starttrace.tracer.journal import quote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_original: "Callable[[str, Any], Any] | None" = None
_python_wrapper: "Callable[[str, Any], Any] | None" = None  # what the C hook hands other imports to


def install() -> None:
    global _original
    import _frozen_importlib as bootstrap  # already loaded: the interpreter runs on it

    if getattr(bootstrap._find_and_load, "__starttrace__", False):
        return
    min_us = os.environ.get("STARTTRACE_MIN_IMPORT_US", "0").strip()
    if min_us.isdigit() and int(min_us) > 0:
        recorder.set_min_span_ns(int(min_us) * 1000)
    elif min_us not in ("", "0"):
        recorder.report(f"ignoring STARTTRACE_MIN_IMPORT_US={min_us!r}: not a whole number of microseconds")
    _original = bootstrap._find_and_load
    wrapper = _make_wrapper(_original, __import__)
    bootstrap._find_and_load = _c_wrapper(_original, wrapper) or wrapper


def adopt(original: "Callable[[str, Any], Any]", hook: "Any") -> None:
    """activation.py's light case installed the C hook, with trampolines that loaded this module:
    hand the hook this module's helpers and the recorder's globals from now on."""
    global _original, _python_wrapper
    _original = original
    _python_wrapper = _make_wrapper(original, __import__)
    hook.rebind(vars(recorder), _python_wrapper, _end_slow, _end_failed, _end_record, _write_compact)


def _c_wrapper(original: "Callable[[str, Any], Any]", wrapper: "Callable[[str, Any], Any]") -> "Any":
    """The C copy of the wrapper's common case (starttrace/tracer/_hotpath.c), handing it everything
    else; None where the C core is not built or STARTTRACE_PURE_PYTHON=1."""
    global _python_wrapper
    _python_wrapper = wrapper
    if journal.hotpath is None:
        return None
    return journal.hotpath.ImportHook(
        original,
        __import__,
        wrapper,
        sys.modules,
        vars(recorder),
        _end_slow,
        _end_failed,
        _end_record,
        _write_compact,
    )


def uninstall() -> None:
    import _frozen_importlib as bootstrap

    if _original is not None and getattr(bootstrap._find_and_load, "__starttrace__", False):
        bootstrap._find_and_load = _original


def _make_wrapper(original: "Callable[[str, Any], Any]", builtin_import: "Any") -> "Callable[[str, Any], Any]":
    # Long by design: the import hook is the hottest code of the hot path: one closure with its names bound as locals,
    # no helper calls (see docs/benchmarks.md, instructions per import span).
    modules = sys.modules
    stacks = recorder._stacks
    pending = recorder.pending
    post_hooks = recorder._post_import_hooks
    rec = recorder

    def _find_and_load(name: str, import_: "Any") -> "Any":
        writer = rec._writer
        if writer is None or name in modules:
            return original(name, import_)
        span_id = next(rec.span_ids, None)
        if span_id is None:
            span_id = rec.refill_span_ids()
        ident = get_ident()
        try:
            stack = stacks[ident]
        except KeyError:
            stack = stacks[ident] = []
        if ident != rec.plain_ident or import_ is not builtin_import or "\n" in name:
            _begin_slow(span_id, name, ident, import_ is not builtin_import, stack)
            start = 0
        else:  # the common case: the main thread, an `import` statement, spans not held back
            start = monotonic_ns()
            line = f"I{span_id}{stack[-1] if stack else rec.process_span_id}{start} {name}\n"
            try:
                writer.put(line.encode())
            except (ValueError, TypeError):  # segment full, journal failed, lone surrogates
                _write_compact(line)
        stack.append(span_id)
        try:
            module = original(name, import_)
        except BaseException as exc:
            _end_failed(span_id, exc)
            raise
        try:
            path = module.__file__  # a plain attribute read: AttributeError only for built-in modules
        except Exception:
            path = None
        if start and stack and stack[-1] is span_id and not pending and name not in post_hooks:
            stack.pop()  # the common case: this span is on top of this thread's stack
            if path.__class__ is str and "\n" not in path:
                line = f"E{span_id}{monotonic_ns() - start} {path}\n"
            elif path.__class__ is str:
                line = _end_record(span_id, start, path)
            else:
                line = f"E{span_id}{monotonic_ns() - start}\n"
            try:  # `writer` may have failed or been replaced meanwhile (a fork): _write_compact sorts it out
                writer.put(line.encode())
            except (ValueError, TypeError):
                _write_compact(line)
        else:
            _end_slow(name, span_id, path, module)
        return module

    _find_and_load.__starttrace__ = True  # type: ignore[attr-defined]
    _find_and_load.__wrapped__ = original  # type: ignore[attr-defined]
    return _find_and_load


def _end_failed(span_id: str, exc: BaseException) -> None:
    """End the span of an import that raised `exc`."""
    recorder.end(span_id, error=f"{type(exc).__name__}: {exc}")


def _end_record(span_id: str, start: int, path: str) -> str:
    """The end record of an import span whose path needs a look: a newline would end the record
    (a JSON one instead); lone surrogates are left to `_write_compact`."""
    if "\n" not in path:
        return f"E{span_id}{monotonic_ns() - start} {path}\n"
    return f'{{"k":"e","s":"{span_id}","t":{monotonic_ns()},"a":{{"code.file.path":{quote(path)}}}}}\n'


def _write_compact(line: str) -> None:
    """A compact record the inlined copy could not write: a full segment, a failed or replaced
    writer, or a name or path with lone surrogates (file names in surrogateescape), which have
    no UTF-8: those go as the equivalent JSON record, with the surrogates as JSON escapes."""
    try:
        data = line.encode()
    except UnicodeEncodeError:
        data = (line if line[0] == "{" else _as_json(line)).encode("utf-8", "backslashreplace")
    recorder.write_encoded(data)


def _as_json(line: str) -> str:
    """The JSON record a compact import record stands for (docs/journal.md)."""
    head, _, text = line[:-1].partition(" ")
    if head[0] == "I":
        return (
            f'{{"k":"b","s":"{head[1:17]}","p":"{head[17:33]}","n":{quote("import " + text)},"t":{head[33:]},'
            f'"a":{{"starttrace.phase":"import","starttrace.import.module":{quote(text)}}}}}\n'
        )
    path = f',"a":{{"code.file.path":{quote(text)}}}' if text else ""
    return f'{{"k":"e","s":"{head[1:17]}","dt":{head[17:]}{path}}}\n'


def _begin_slow(span_id: str, name: str, ident: int, via_importlib: bool, stack: "list[str]") -> None:
    """The begin record of an import span off the common path (another thread, importlib, a name
    that needs escaping, spans held back)."""
    start = monotonic_ns()
    text = quote(name)[1:-1]
    line = (
        f'{{"k":"b","s":"{span_id}","p":"{stack[-1] if stack else recorder.process_span_id}",'
        f'"n":"import {text}","t":{start}'
        + ("" if ident == recorder._main_ident else f',"th":{ident}')
        + f',"a":{{"starttrace.phase":"import","starttrace.import.module":"{text}"'
        + (',"starttrace.import.via":"importlib"' if via_importlib else "")
        + "}}\n"
    )
    if recorder.min_span_ns:
        recorder.pending[span_id] = (line, start)
    else:
        if recorder.pending:
            recorder.flush_pending(stack)
        recorder.write(line)


def _end_slow(name: str, span_id: str, path: object, module: "Any") -> None:
    """End an import span the general way (held back, forked meanwhile, not on top of the stack,
    a probe waiting for this module). The probes' post-import hooks run first, inside the span:
    the program's import statement returns only after them, as `-X importtime` sees it; their
    time is on the span as `starttrace.import.probe_ns`."""
    attrs: dict[str, object] = {}
    if isinstance(path, str):
        attrs["code.file.path"] = path
    if name in recorder.import_credits:
        cost = recorder.import_credits.pop(name)
        if cost is not None:
            attrs["starttrace.import.footprint_ns"] = cost
    if recorder._post_import_hooks.get(name):
        start = monotonic_ns()
        recorder.run_post_import_hooks(name, module)
        attrs["starttrace.import.probe_ns"] = monotonic_ns() - start
    else:
        recorder._post_import_hooks.pop(name, None)
    recorder.end(span_id, attrs or None)
