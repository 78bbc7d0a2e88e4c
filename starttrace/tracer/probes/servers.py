"""Server readiness probe: uvicorn "startup complete" -> `starttrace.tracer.lifecycle.mark_ready`.

Wraps (after the traced program imported uvicorn; standard library only here):
- `uvicorn.server.Server.startup` -> span `uvicorn.startup` (phase `server_startup`): the ASGI
  lifespan startup and the bind of the listening sockets.
- `uvicorn.server.Server.main_loop` -> at its entry, the server is started (subclasses such as
  vLLM's `NoSignalServer` have finished their own startup work too) and answers requests: the
  `ready` instant is recorded (via `lifecycle.mark_ready`) with the listening address.

`mark_ready` is idempotent (one `ready` per process), so several servers in one process, or a
restart, record the first readiness only.
"""

from starttrace.tracer import lifecycle, recorder
from starttrace.tracer.probes._wrap import _mark, note_attached, note_missing, patch, publish_probe_list, traced

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
    if patch(server, "startup", lambda fn: traced(fn, "uvicorn.startup", "server_startup")):
        note_attached("uvicorn.server.Server.startup")
    else:
        note_missing("uvicorn.server.Server.startup")
    if patch(server, "main_loop", _ready_on_entry):
        note_attached("uvicorn.server.Server.main_loop")
    else:
        note_missing("uvicorn.server.Server.main_loop")
    publish_probe_list()


def _ready_on_entry(original: "Callable[..., Any]") -> "Callable[..., Any]":
    async def main_loop(self: "Any", *args: "Any", **kwargs: "Any") -> "Any":
        if recorder._writer is not None:
            try:
                ready(_server_attrs(self))
            except Exception as exc:
                recorder.report(f"readiness probe failed: {type(exc).__name__}: {exc}", key="ready-probe")
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


def ready(attrs: "dict[str, Any] | None" = None) -> None:
    """Record readiness (lifecycle.mark_ready: once per process, ends the run's `startup` span)."""
    lifecycle.mark_ready(attrs)
