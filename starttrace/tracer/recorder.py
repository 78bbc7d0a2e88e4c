"""The span recorder every probe writes through (hot path, stdlib only).

Spans nest per thread: `begin` pushes onto the calling thread's stack and `end` pops, so an
import triggered inside `cuda.init` hangs under it, and `cuda.init` triggered by an import hangs
under that import. Each record is written to the journal at once (see docs/journal.md).

No `from __future__ import annotations` here or in any hot-path module: it imports the
`__future__` module, which the traced program's own first import of it would then miss.
Annotations that name typing-only types are strings for the same reason (`typing` is not loaded).
"""

import os
import sys
from _thread import allocate_lock, get_ident
from time import monotonic_ns

from starttrace.tracer import journal
from starttrace.tracer.activation import pop_span, recorder_imported, state
from starttrace.tracer.journal import JournalWriter, encode, quote

TYPE_CHECKING = False  # `typing` is not imported at run time: see the module docstring
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any, TypeAlias

    Attrs: TypeAlias = dict[str, Any]

_writer: "JournalWriter | None" = None
process_span_id: str = ""
_stacks: "dict[int, list[str]]" = {}
_main_ident: int = get_ident()
_foreign: "set[str]" = set()  # spans begun by the parent before a fork: the child must not end them
_reported: "set[str]" = set()
# Only the run's root process says anything on stderr (boot sets this): a traced program's
# children stay silent, their failures go to their journal, else show as missing (`problems`).
to_stderr = True
# Begin records held back until the span proves long enough (STARTTRACE_MIN_IMPORT_US > 0):
# span id -> (begin line, begin time). Written before any descendant, so parents always exist.
pending: "dict[str, tuple[str, int]]" = {}
min_span_ns = 0
# The thread whose imports take the import probe's inlined path: the main thread, or none (-1)
# while spans are held back (min_span_ns > 0). Kept by attach() and set_min_span_ns().
plain_ident = -1
_post_import_hooks: "dict[str, list[Callable[[Any], None]]]" = {}
# Modules starttrace loaded and hid again (journal.footprint): the program's first import of one
# carries `starttrace.import.footprint_ns` (what starttrace's own load took; docs/journal.md).
import_credits: "dict[str, int | None]" = {}
process_attrs: "Attrs" = {}

# Span ids: 16 hex digits, a random 56-bit block number per process (14 digits) and 256 ids per
# block (2 digits), so that an id costs no system call and no number formatting: `next(span_ids,
# None)` gives the next string of a list made 256 at a time (one C call, atomic under the GIL).
# The C core makes a block's ids at once (`span_id_block`); the Python code, from the last two digits,
# made at its first block (~0.25 M instructions: not in a process that has the C core).
_HEX = "0123456789abcdef"
_LOW: "list[str]" = []
_id_lock = allocate_lock()


# The next block of 256 span ids. Two processes collide only if their ranges of blocks overlap:
# ~1e-12 for 10k blocks each (2.5 M spans). A fork child draws a new block number (reseed) so it
# never repeats its parent's ids.
_block = 0


def reseed_span_ids() -> None:
    global _id_lock, span_ids, _block
    _id_lock = allocate_lock()  # a fork child: the parent's lock may have been held at the fork
    _block = int.from_bytes(os.urandom(7), "little") % ((1 << 56) - (1 << 32)) + 1
    span_ids = iter(())


def refill_span_ids() -> str:
    """The ids of the current block are used up: the first id of the next block."""
    global span_ids, _block
    with _id_lock:  # two threads can find the block used up at once: one makes the next
        span_id = next(span_ids, None)
        if span_id is not None:
            return span_id
        hotpath = journal.hotpath
        if hotpath is not None:
            span_ids = iter(hotpath.span_id_block(_block))
        else:
            if not _LOW:
                _LOW.extend([a + b for a in _HEX for b in _HEX])
            prefix = "%014x" % _block
            span_ids = iter([prefix + low for low in _LOW])
        _block += 1
        return next(span_ids)


def new_span_id() -> str:
    span_id = next(span_ids, None)
    return span_id if span_id is not None else refill_span_ids()


span_ids: "Iterator[str]" = iter(())
reseed_span_ids()


def active() -> bool:
    return _writer is not None


def attach(writer: JournalWriter, process_span: str) -> None:
    """Make `writer` the journal of this process (at activation, and again in a fork child)."""
    global _writer, process_span_id, _main_ident, plain_ident
    _writer = writer
    process_span_id = process_span
    _main_ident = get_ident()
    plain_ident = -1 if min_span_ns else _main_ident


def adopt(
    writer: JournalWriter,
    process_span: str,
    main_ident: int,
    stacks: "dict[int, list[str]]",
    held: "dict[str, tuple[str, int]]",
    post_import_hooks: "dict[str, list[Callable[[Any], None]]]",
    attrs: "Attrs",
) -> None:
    """Take this process over from activation.py's light case: its journal, the stacks and hooks
    the C import hook holds, and the process attributes written so far."""
    global _writer, process_span_id, _main_ident, plain_ident, _stacks, pending, _post_import_hooks, process_attrs
    global to_stderr
    _writer = writer
    process_span_id = process_span
    _main_ident = plain_ident = main_ident
    _stacks = stacks
    pending = held
    _post_import_hooks = post_import_hooks
    process_attrs = attrs
    to_stderr = state.is_root


def set_min_span_ns(ns: int) -> None:
    """Hold begin records back until a span lasts `ns` (STARTTRACE_MIN_IMPORT_US)."""
    global min_span_ns, plain_ident
    min_span_ns = ns
    plain_ident = -1 if ns else _main_ident


def detach() -> None:
    global _writer
    if _writer is not None:
        _writer.close()
    _writer = None


def report(message: str, key: "str | None" = None) -> None:
    """Report an internal failure once (per key) on stderr and in the journal; never raises."""
    key = key or message
    if key in _reported:
        return
    _reported.add(key)
    if to_stderr:
        try:
            os.write(2, f"starttrace: {message} (pid {os.getpid()})\n".encode("utf-8", "replace"))
        except OSError:
            pass
    if _writer is not None:
        write('{"k":"warn","t":%d,"msg":%s}\n' % (monotonic_ns(), quote(message)))


def write(line: str) -> None:
    """Write one record (a whole line). A failure (disk full) disables the journal, reported once."""
    if _writer is None:
        return
    try:
        data = line.encode()
    except UnicodeEncodeError:  # lone surrogates (file names in surrogateescape): written as \udcXX
        data = line.encode("utf-8", "backslashreplace")
    write_encoded(data)


def write_encoded(data: bytes) -> None:
    """Write one encoded record (see `write`)."""
    writer = _writer
    if writer is None:
        return
    put = writer.put
    try:
        put(data)  # type: ignore[misc]
    except (ValueError, TypeError):  # the segment is full (or the writer has failed: put is None)
        write_slow(writer, put, data)


def write_slow(writer: JournalWriter, put: object, data: bytes) -> None:
    """`put` (the writer's segment) had no room for `data`: on to the next segment, or give up."""
    try:
        if put is not None and writer.overflow(put, data):
            return
    except Exception as exc:  # never let a journal failure reach the program
        writer.failed = writer.failed or f"{type(exc).__name__}: {exc}"
    if writer.failed is None:
        return  # a writer closed meanwhile (by another thread's detach): nothing failed
    if writer is _writer:
        detach()
    report(f"journal disabled: {writer.failed}", key="journal-write")


def _stack() -> "list[str]":
    ident = get_ident()
    stack = _stacks.get(ident)
    if stack is None:
        stack = _stacks[ident] = []
    return stack


def current_span() -> str:
    stack = _stacks.get(get_ident())
    return stack[-1] if stack else process_span_id


def begin(
    name: str,
    attrs: "Attrs | None" = None,
    parent: "str | None" = None,
    t: "int | None" = None,
    push: bool = True,
    span_id: "str | None" = None,
) -> str:
    """Start a span; returns its id ("" when tracing is off)."""
    if _writer is None:
        return ""
    if span_id is None:
        span_id = new_span_id()
    ident = get_ident()
    stack = _stacks.get(ident)
    if stack is None:
        stack = _stacks[ident] = []
    if parent is None:
        parent = stack[-1] if stack else process_span_id
    line = '{"k":"b","s":"%s","p":"%s","n":%s,"t":%d' % (
        span_id,
        parent,
        quote(name),
        monotonic_ns() if t is None else t,
    )
    if ident != _main_ident:
        line += ',"th":%d' % ident
    if attrs:
        line += ',"a":' + encode(attrs)
    if pending:
        flush_pending(stack)
    write(line + "}\n")
    if push:
        stack.append(span_id)
    return span_id


def flush_pending(stack: "list[str]") -> None:
    """Write the held-back begin records of the spans open on this stack, outermost first."""
    for open_id in stack:
        held = pending.pop(open_id, None)
        if held is not None:
            write(held[0])


def end(span_id: str, attrs: "Attrs | None" = None, error: "str | None" = None, t: "int | None" = None) -> None:
    if not span_id or _writer is None:
        return
    if span_id in _foreign:
        _foreign.discard(span_id)
        return
    pop_span(_stacks, span_id)
    now = monotonic_ns() if t is None else t
    if pending:
        held = pending.pop(span_id, None)
        if held is not None:
            if now - held[1] < min_span_ns:
                return  # shorter than STARTTRACE_MIN_IMPORT_US and no descendant was kept: dropped
            write(held[0])
    line = '{"k":"e","s":"%s","t":%d' % (span_id, now)
    if attrs:
        line += ',"a":' + encode(attrs)
    if error is not None:
        line += ',"err":' + quote(error)
    write(line + "}\n")


def instant(name: str, attrs: "Attrs | None" = None, parent: "str | None" = None) -> str:
    """Record a zero-length span (an event such as `ready`)."""
    if _writer is None:
        return ""
    span_id = new_span_id()
    if pending:
        flush_pending(_stack())
    if parent is None:
        parent = current_span()
    line = '{"k":"i","s":"%s","p":"%s","n":%s,"t":%d' % (
        span_id,
        parent,
        quote(name),
        monotonic_ns(),
    )
    if attrs:
        line += ',"a":' + encode(attrs)
    write(line + "}\n")
    return span_id


def set_process_attrs(attrs: "Attrs") -> None:
    """Process identity learnt late (role, rank, ...): applies to every span of the process."""
    changed = {k: v for k, v in attrs.items() if process_attrs.get(k) != v}
    if not changed:
        return
    process_attrs.update(changed)
    write('{"k":"attrs","t":%d,"a":%s}\n' % (monotonic_ns(), encode(changed)))


class span:
    """`with span("cuda.init", {...}) as s:` records a span; an exception marks it as an error."""

    __slots__ = ("attrs", "end_attrs", "name", "span_id")

    def __init__(self, name: str, attrs: "Attrs | None" = None) -> None:
        self.name = name
        self.attrs = attrs
        self.span_id = ""
        self.end_attrs: Attrs = {}

    def __enter__(self) -> "span":
        self.span_id = begin(self.name, self.attrs)
        return self

    def __exit__(self, kind: "Any", exc: "BaseException | None", tb: "Any") -> None:
        error = None if exc is None else f"{kind.__name__}: {exc}"
        end(self.span_id, self.end_attrs or None, error)


def forget_stacks_after_fork() -> None:
    """In a fork child: spans still open belong to the parent's journal."""
    for stack in _stacks.values():
        _foreign.update(stack)
        stack.clear()  # an import frame still running in the child sees its span is no longer on top
    _stacks.clear()
    pending.clear()  # held-back begins of the parent's open imports: never written by the child
    reseed_span_ids()


def credit_import(module: str, cost_ns: "int | None") -> None:
    """`module` was loaded by starttrace and hidden again: credit its cost to the program's first
    import of it (the import probe adds `starttrace.import.footprint_ns` to that span's end)."""
    import_credits[module] = cost_ns
    _post_import_hooks.setdefault(module, [])  # the import probe's slow path looks here


def when_imported(module: str, hook: "Callable[[Any], None]") -> None:
    """Run `hook(module)` right after `module` is first imported (or now if it already is)."""
    loaded = sys.modules.get(module)
    if loaded is not None and getattr(getattr(loaded, "__spec__", None), "_initializing", False) is False:
        run_hook(hook, loaded)
        return
    _post_import_hooks.setdefault(module, []).append(hook)


def run_post_import_hooks(name: str, module: "Any") -> None:
    hooks = _post_import_hooks.pop(name, None)
    if hooks:
        for hook in hooks:
            run_hook(hook, module)


def has_post_import_hooks() -> bool:
    return any(_post_import_hooks.values())


def run_hook(hook: "Callable[[Any], None]", module: "Any") -> None:
    try:
        hook(module)
    except Exception as exc:  # a probe must never break the traced program
        name = getattr(hook, "__qualname__", repr(hook))
        report(f"probe {name} failed: {type(exc).__name__}: {exc}", key=f"hook:{name}")


recorder_imported()  # a light process (activation.py) whose program imported the recorder: it takes over
