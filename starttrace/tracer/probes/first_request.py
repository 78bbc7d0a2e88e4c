"""The first request a traced server serves after ready (phase `first_request`; docs/probes.md).

Shared by the server probe (probes/servers.py: the ASGI request that opens the span
`server.first_request` and the `first_token` instant when its first response byte was sent) and
the vLLM probe (probes/vllm.py: the parts of that request in the API server, and each process's
first engine step or model execution). Every call is guarded: a failure is reported once and the
request goes on. Standard library only.
"""

from starttrace.tracer import recorder
from starttrace.tracer.probes._wrap import _begin_quietly, _end_quietly, _mark, call_in_span

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Attrs = dict[str, Any]

PHASE = "first_request"
REQUEST_SPAN = "server.first_request"
FIRST_TOKEN = "first_token"
# requests that are no user's request: a load balancer's or an orchestrator's probes
NOT_A_REQUEST = frozenset(
    (
        "/health",
        "/healthz",
        "/ready",
        "/readyz",
        "/livez",
        "/ping",
        "/metrics",
        "/version",
        "/v1/models",
        "/load",
        "/is_sleeping",
        "/server_info",
        "/favicon.ico",
    )
)


class _State:
    span_id = ""  # the open `server.first_request` span ("" when none is open)
    done = False  # this process recorded its first request: no other is recorded
    token_sent = False
    parts: "set[str]" = set()  # parts recorded (each once)


state = _State()


def counts(path: "Any") -> bool:
    """Whether a request to `path` is a served request (not a health check or a scrape)."""
    return isinstance(path, str) and path.rstrip("/") not in NOT_A_REQUEST and not path.startswith("/metrics")


def begin(attrs: "Attrs") -> str:
    """Open `server.first_request` (the process's first served request); "" when one was opened."""
    if state.span_id or state.done or recorder._writer is None:
        return ""
    state.span_id = _begin_detached(REQUEST_SPAN, {"starttrace.phase": PHASE, **attrs}, recorder.process_span_id)
    return state.span_id


def _begin_detached(name: str, attrs: "Attrs", parent: str) -> str:
    # push=False: the request runs among other coroutines on the event loop's thread; a span on
    # the thread's stack would become the parent of whatever else that thread records
    try:
        return recorder.begin(name, attrs, parent=parent, push=False)
    except Exception as exc:
        recorder.report(f"first request span {name} failed: {type(exc).__name__}: {exc}", key=f"first:{name}")
        return ""


def first_token(attrs: "Attrs | None" = None) -> None:
    """The first response byte of the first request was handed to the transport: `first_token`."""
    if not state.span_id or state.token_sent:
        return
    state.token_sent = True
    try:
        recorder.instant(FIRST_TOKEN, {"starttrace.phase": PHASE, **(attrs or {})}, parent=state.span_id)
    except Exception as exc:
        recorder.report(f"first token mark failed: {type(exc).__name__}: {exc}", key="first:token")


def end(attrs: "Attrs | None" = None, error: "str | None" = None) -> None:
    span_id, state.span_id = state.span_id, ""
    state.done = True
    _end_quietly(span_id, attrs, error)


def claim(part: str) -> str:
    """The parent span of `part` of the first request when that request is open and `part` was not
    recorded yet (claimed now), else ""."""
    if not state.span_id or part in state.parts:
        return ""
    state.parts.add(part)
    return state.span_id


def part_span(part: str, attrs: "Attrs | None" = None) -> str:
    """Begin span `part` inside the open first request (once per part); "" when not recorded."""
    parent = claim(part)
    return _begin_detached(part, {"starttrace.phase": PHASE, **(attrs or {})}, parent) if parent else ""


def first_part(original: "Callable[..., Any]", part: str) -> "Callable[..., Any]":
    """`original` (sync or async) recorded as span `part` the first time it runs inside the first
    request."""
    code = getattr(getattr(original, "__func__", original), "__code__", None)
    if code is not None and code.co_flags & 0x80:  # a coroutine function

        async def async_wrapper(*args: "Any", **kwargs: "Any") -> "Any":
            span_id = part_span(part) if state.span_id else ""
            if not span_id:
                return await original(*args, **kwargs)
            try:
                result = await original(*args, **kwargs)
            except BaseException as exc:
                _end_quietly(span_id, None, f"{type(exc).__name__}: {exc}")
                raise
            _end_quietly(span_id)
            return result

        return _mark(async_wrapper, original)

    def wrapper(*args: "Any", **kwargs: "Any") -> "Any":
        span_id = part_span(part) if state.span_id else ""
        if not span_id:
            return original(*args, **kwargs)
        return call_in_span(span_id, original, args, kwargs)

    return _mark(wrapper, original)


def first_item(original: "Callable[..., Any]", part: str) -> "Callable[..., Any]":
    """An async generator function whose first call inside the first request records span `part`
    from the call to its first item (vLLM's `generate`: the wait for the engine's first output)."""

    def wrapper(*args: "Any", **kwargs: "Any") -> "Any":
        agen = original(*args, **kwargs)
        span_id = part_span(part) if state.span_id else ""
        return _timed_until_first(agen, span_id) if span_id else agen

    return _mark(wrapper, original)


async def _timed_until_first(agen: "Any", span_id: str) -> "Any":
    open_span = span_id
    try:
        async for item in agen:
            if open_span:
                _end_quietly(open_span)
                open_span = ""
            yield item
    except BaseException as exc:
        if open_span:
            _end_quietly(open_span, None, f"{type(exc).__name__}: {exc}")
            open_span = ""
        raise
    finally:
        if open_span:
            _end_quietly(open_span, {"starttrace.first_request.no_output": True})
        await agen.aclose()


_first_calls: "set[str]" = set()


def first_call(
    original: "Callable[..., Any]", name: str, when: "Callable[[tuple[Any, ...]], bool] | None" = None
) -> "Callable[..., Any]":
    """`original` (sync) recorded as span `name` (phase first_request) on its first call in this
    process for which `when(args)` holds (default: the first call): an engine core's first step
    with a request, a worker's first execute_model. A span on the thread's stack: what the call
    compiles, captures, loads or imports is inside it."""

    def wrapper(*args: "Any", **kwargs: "Any") -> "Any":
        if name in _first_calls or recorder._writer is None:
            return original(*args, **kwargs)
        try:
            wanted = when is None or when(args)
        except Exception as exc:
            recorder.report(f"first request probe {name} failed: {type(exc).__name__}: {exc}", key=f"first:{name}")
            wanted = False
        if not wanted:
            return original(*args, **kwargs)
        _first_calls.add(name)
        span_id = _begin_quietly(name, {"starttrace.phase": PHASE})
        return call_in_span(span_id, original, args, kwargs)

    return _mark(wrapper, original)


def in_first_call(name: str) -> bool:
    """Whether the first call `name` was recorded (it may be running now)."""
    return name in _first_calls
