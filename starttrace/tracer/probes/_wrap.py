"""Helpers shared by the probes that wrap library functions (torch, vllm, servers): `traced`
(a span around each call, sync or async), `patch` (replace an attribute with a wrapper, once),
the probe list published on the process (`note_attached`, `note_missing`), and process identity.

Hot path: standard library only.
"""

from _thread import get_ident

from starttrace.tracer import lifecycle, recorder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Attrs = dict[str, Any]

_attached: list[str] = []
_missing: list[str] = []
_open_names: dict[int, dict[str, int]] = {}  # per thread: traced names now running (re-entry guard)
_CO_COROUTINE = 0x80  # inspect.CO_COROUTINE, without importing inspect


def after_fork_in_child() -> None:
    _open_names.clear()
    try:
        if _attached or _missing:
            publish_probe_list()
    except Exception:
        pass


def note_attached(label: str) -> None:
    if label not in _attached:
        _attached.append(label)


def note_missing(label: str) -> None:
    if label not in _missing:
        _missing.append(label)


def note(label: str, attached: bool) -> None:
    (note_attached if attached else note_missing)(label)


def publish_probe_list() -> None:
    attrs: Attrs = {}
    if _attached:
        attrs["starttrace.probes"] = sorted(_attached)
    if _missing:
        attrs["starttrace.probes_missing"] = sorted(_missing)
    if attrs:
        recorder.set_process_attrs(attrs)


def set_role_and_attrs(attrs: "Attrs") -> None:
    """Set process identity; the role also goes through lifecycle.set_role (kept in its state)."""
    role = attrs.get("starttrace.role")
    if role:
        lifecycle.set_role(role)
    recorder.set_process_attrs(attrs)


def _mark(wrapper: "Any", original: "Any") -> "Any":
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        try:
            setattr(wrapper, attr, getattr(original, attr))
        except Exception:
            pass
    try:
        wrapper.__dict__.update(getattr(original, "__dict__", {}))
    except Exception:
        pass
    wrapper.__wrapped__ = original
    wrapper.__starttrace__ = True
    return wrapper


def _begin_quietly(name: str, attrs: "Attrs") -> str:
    try:
        return recorder.begin(name, attrs)
    except Exception as exc:
        recorder.report(f"probe span {name} failed: {type(exc).__name__}: {exc}", key=f"begin:{name}")
        return ""


def _end_quietly(span_id: str, attrs: "Attrs | None" = None, error: str | None = None) -> None:
    if not span_id:
        return
    try:
        recorder.end(span_id, attrs, error)
    except Exception as exc:
        recorder.report(f"probe span end failed: {type(exc).__name__}: {exc}", key="end")


def call_in_span(
    span_id: str, original: "Callable[..., Any]", args: "tuple[Any, ...]", kwargs: "dict[str, Any]"
) -> "Any":
    """`original(*args, **kwargs)` inside the open span `span_id`, which it ends (with the error
    when the call raised)."""
    try:
        result = original(*args, **kwargs)
    except BaseException as exc:
        _end_quietly(span_id, None, f"{type(exc).__name__}: {exc}")
        raise
    _end_quietly(span_id)
    return result


def traced(
    original: "Callable[..., Any]",
    name: str,
    phase: str,
    attrs: "Attrs | None" = None,
    before: "Callable[[tuple[Any, ...], dict[str, Any]], Attrs | None] | None" = None,
    after: "Callable[[tuple[Any, ...], dict[str, Any], Any], Attrs | None] | None" = None,
    key: str | None = None,
) -> "Callable[..., Any]":
    """A wrapper of `original` that records span `name` around each call (sync or async).

    `before(args, kwargs)` may return extra begin attributes (and may set process attributes);
    `after(args, kwargs, result)` may return end attributes. Both are guarded: a failing callback
    is reported once and the call goes on. A nested call with the same span name on the same
    thread (a subclass calling super()) records no second span; `key` (default: the name) is what
    counts as the same (vLLM's own marks use the function, since two functions share a name).
    """
    # Long by design: a wrapper factory: the sync and async wrappers are closures over the same locals, defined
    # together.
    base: Attrs = {"starttrace.phase": phase}
    idle = phase == "idle"
    if attrs:
        base.update(attrs)

    def _start(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> str:
        begin_attrs = base
        if before is not None:
            try:
                extra = before(args, kwargs)
                if extra:
                    begin_attrs = {**base, **extra}
            except Exception as exc:
                recorder.report(f"probe {name} failed: {type(exc).__name__}: {exc}", key=f"before:{name}")
        return _begin_quietly(name, begin_attrs)

    def _finish(span_id: str, args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> None:
        end_attrs = None
        if after is not None:
            try:
                end_attrs = after(args, kwargs, result)
            except Exception as exc:
                recorder.report(f"probe {name} failed: {type(exc).__name__}: {exc}", key=f"after:{name}")
        _end_quietly(span_id, end_attrs)

    guard = name if key is None else key

    def _enter() -> dict[str, int] | None:
        ident = get_ident()
        running = _open_names.get(ident)
        if running is None:
            running = _open_names[ident] = {}
        if running.get(guard):
            return None
        running[guard] = 1
        return running

    code = getattr(getattr(original, "__func__", original), "__code__", None)
    if code is not None and code.co_flags & _CO_COROUTINE:

        async def async_wrapper(*args: "Any", **kwargs: "Any") -> "Any":
            if recorder._writer is None:
                return await original(*args, **kwargs)
            running = _enter()
            if running is None:
                return await original(*args, **kwargs)
            span_id = _start(args, kwargs)
            try:
                result = await original(*args, **kwargs)
            except BaseException as exc:
                _end_failed(span_id, exc, idle)
                raise
            finally:
                running.pop(guard, None)
            _finish(span_id, args, kwargs, result)
            return result

        return _mark(async_wrapper, original)

    def wrapper(*args: "Any", **kwargs: "Any") -> "Any":
        if recorder._writer is None:
            return original(*args, **kwargs)
        running = _enter()
        if running is None:
            return original(*args, **kwargs)
        span_id = _start(args, kwargs)
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            _end_failed(span_id, exc, idle)
            raise
        finally:
            running.pop(guard, None)
        _finish(span_id, args, kwargs, result)
        return result

    return _mark(wrapper, original)


def _end_failed(span_id: str, exc: BaseException, idle: bool) -> None:
    message = f"{type(exc).__name__}: {exc}".rstrip(": ")
    if idle:
        # A serving loop ends by an exception at shutdown (SystemExit, a cancelled queue): that is
        # how it stops, not a failed startup phase.
        _end_quietly(span_id, {"starttrace.exit_reason": message})
    else:
        _end_quietly(span_id, None, message)


def raw_attr(owner: "Any", attr: str) -> "Any":
    """`owner.attr` as stored (a class's own or inherited staticmethod/classmethod object), or None."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in klass.__dict__:
                return klass.__dict__[attr]
        return None
    return getattr(owner, attr, None)


def replace(owner: "Any", attr: str, raw: "Any", make_wrapper: "Callable[[Callable[..., Any]], Any]") -> None:
    """Set `owner.attr` to `make_wrapper(function)`, kept a staticmethod or classmethod as `raw` was."""
    if isinstance(raw, (staticmethod, classmethod)):
        kind = staticmethod if isinstance(raw, staticmethod) else classmethod
        setattr(owner, attr, kind(make_wrapper(raw.__func__)))
    else:
        setattr(owner, attr, make_wrapper(raw))


def patch(owner: "Any", attr: str, make_wrapper: "Callable[[Callable[..., Any]], Callable[..., Any]]") -> bool:
    """Replace `owner.attr` (function, method, staticmethod or classmethod) with a wrapper.

    Returns False (and patches nothing) when the attribute does not exist, is not callable, or
    is already wrapped by starttrace. Inherited methods are wrapped on `owner` itself.
    """
    try:
        raw = raw_attr(owner, attr)
        function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        if raw is None or not callable(function) or getattr(function, "__starttrace__", False):
            return False
        replace(owner, attr, raw, make_wrapper)
        return True
    except Exception as exc:
        recorder.report(f"cannot wrap {attr}: {type(exc).__name__}: {exc}", key=f"patch:{attr}")
        return False
