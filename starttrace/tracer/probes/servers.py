"""Server readiness probe: span `uvicorn.startup` (phase `server_startup`) around
`uvicorn.server.Server.startup`, and `ready` (`lifecycle.mark_ready`: the first one per process)
with the listening address when `Server.main_loop` begins: the server answers requests then.

Then the server's first served request (probes/first_request.py): `Server.main_loop` also wraps
the ASGI application uvicorn hands each new connection (`config.loaded_app`), so the first HTTP
request that is no health check or scrape becomes span `server.first_request` (phase
`first_request`) with the instant `first_token` when its first response body byte was sent.
Standard library only.
"""

from starttrace.tracer import lifecycle, recorder
from starttrace.tracer.probes import first_request
from starttrace.tracer.probes._wrap import _mark, note, note_missing, patch, publish_probe_list, traced

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def install() -> None:
    recorder.when_imported("uvicorn.server", _patch_uvicorn)


def _patch_uvicorn(module: "Any") -> None:
    server = getattr(module, "Server", None)
    if server is None:
        note_missing("uvicorn.server.Server")
        publish_probe_list()
        return
    note(
        "uvicorn.server.Server.startup",
        patch(server, "startup", lambda fn: traced(fn, "uvicorn.startup", "server_startup")),
    )
    note("uvicorn.server.Server.main_loop", patch(server, "main_loop", _ready_on_entry))
    publish_probe_list()


def _ready_on_entry(original: "Callable[..., Any]") -> "Callable[..., Any]":
    async def main_loop(self: "Any", *args: "Any", **kwargs: "Any") -> "Any":
        if recorder._writer is not None:
            try:
                lifecycle.mark_ready(_server_attrs(self))
            except Exception as exc:
                recorder.report(f"readiness probe failed: {type(exc).__name__}: {exc}", key="ready-probe")
            _watch_first_request(self)
        return await original(self, *args, **kwargs)

    return _mark(main_loop, original)


def _server_attrs(server: "Any") -> "dict[str, Any]":
    attrs: dict[str, Any] = {"starttrace.ready.source": "uvicorn"}
    config = getattr(server, "config", None)
    sockets: list[Any] = []
    for listener in getattr(server, "servers", None) or []:
        sockets.extend(getattr(listener, "sockets", None) or [])
    for sock in sockets:
        try:
            name = sock.getsockname()
        except Exception:
            continue
        if isinstance(name, tuple) and len(name) >= 2:
            attrs["server.address"] = str(name[0])
            attrs["server.port"] = int(name[1])
            break
        if isinstance(name, str) and name:
            attrs["server.address"] = name
            break
    if "server.port" not in attrs and config is not None:
        host, port = getattr(config, "host", None), getattr(config, "port", None)
        if isinstance(host, str):
            attrs["server.address"] = host
        if isinstance(port, int):
            attrs["server.port"] = port
    return attrs


def _watch_first_request(server: "Any") -> None:
    """Wrap the ASGI app the server's connections call (they read `config.loaded_app` when they
    are made: after main_loop began, every connection gets the wrapper)."""
    try:
        config = server.config
        app = getattr(config, "loaded_app", None)
        if app is None or getattr(app, "__starttrace__", False) or first_request.state.done:
            return
        config.loaded_app = _first_request_app(app)
    except Exception as exc:
        recorder.report(f"first request probe failed: {type(exc).__name__}: {exc}", key="first-request-probe")


def _first_request_app(app: "Any") -> "Any":
    async def app_with_first_request(scope: "Any", receive: "Any", send: "Any") -> "Any":
        state = first_request.state
        if state.done or state.span_id or recorder._writer is None:
            return await app(scope, receive, send)
        try:
            path = scope.get("path") if scope.get("type") == "http" else None
            span_id = first_request.begin(_request_attrs(scope, path)) if first_request.counts(path) else ""
        except Exception as exc:
            recorder.report(f"first request probe failed: {type(exc).__name__}: {exc}", key="first-request-probe")
            span_id = ""
        if not span_id:
            return await app(scope, receive, send)
        status: list[int] = []

        async def send_and_mark(message: "Any") -> None:
            await send(message)
            try:
                kind = message.get("type")
                if kind == "http.response.start" and isinstance(message.get("status"), int):
                    status.append(message["status"])
                elif kind == "http.response.body" and message.get("body"):
                    first_request.first_token()
            except Exception as exc:
                recorder.report(f"first request probe failed: {type(exc).__name__}: {exc}", key="first-request-send")

        try:
            result = await app(scope, receive, send_and_mark)
        except BaseException as exc:
            first_request.end(None, f"{type(exc).__name__}: {exc}")
            raise
        first_request.end({"http.response.status_code": status[0]} if status else None)
        return result

    app_with_first_request.__wrapped__ = app  # type: ignore[attr-defined]
    app_with_first_request.__starttrace__ = True  # type: ignore[attr-defined]
    return app_with_first_request


def _request_attrs(scope: "Any", path: str) -> "dict[str, Any]":
    attrs: dict[str, Any] = {"url.path": path[:200]}
    method = scope.get("method")
    if isinstance(method, str):
        attrs["http.request.method"] = method[:16]
    return attrs
