"""Server readiness probe: span `uvicorn.startup` (phase `server_startup`) around
`uvicorn.server.Server.startup`, and `ready` (`lifecycle.mark_ready`: the first one per process)
with the listening address when `Server.main_loop` begins: the server answers requests then.
Standard library only.
"""

from starttrace.tracer import lifecycle, recorder
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
