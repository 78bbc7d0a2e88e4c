"""`starttrace serve`: run the service with uvicorn."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from starttrace.service.app import Settings, create_app, is_loopback, parse_retention

REQUEST_TIMEOUT_S = 10.0  # a connection's request head (and an OTLP body) must arrive within this
# SIGTERM: requests in flight get this long to finish, then are cancelled (an export of a large run
# can take seconds of CPU in a worker thread: uvicorn would otherwise wait for all of them)
STOP_GRACE_S = 2.0


def guarded_protocol(timeout_s: float) -> Any:
    """uvicorn's HTTP protocol with a deadline for each request's head: a connection that sends
    nothing, or half a request line and headers, is closed after `timeout_s` (uvicorn's own
    keep-alive timer stops at a request's first byte). The body's deadline is the handler's
    (`Settings.body_timeout_s`). None: uvicorn's default protocol (no httptools)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class GuardedHttpToolsProtocol(HttpToolsProtocol):  # type: ignore[misc]
        _head_timer: Any = None

        def _arm_head_timer(self) -> None:
            self._disarm_head_timer()
            self._head_timer = self.loop.call_later(timeout_s, self._head_timeout)

        def _disarm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_timer()
            super().connection_lost(exc)

        def on_headers_complete(self) -> None:
            self._disarm_head_timer()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_head_timer()  # the next request on this connection has the same deadline

    return GuardedHttpToolsProtocol


def serve(
    host: str = "127.0.0.1",
    port: int = 4318,
    db: str | Path | None = None,
    journal_dir: str | Path | None = None,
    token: str | None = None,
    retention: str | float | None = None,
    decode_workers: int = 1,
    allow_hosts: list[str] | tuple[str, ...] = (),
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    clickhouse: str | None = None,
) -> None:
    """Serve the OTLP receiver, the API and the web page until interrupted; the options are
    `starttrace serve`'s (docs/service.md). `token` defaults to `$STARTTRACE_TOKEN`, and
    `$STARTTRACE_ALLOWED_HOSTS` (comma-separated) adds to `allow_hosts`."""
    import uvicorn

    if token is None:
        token = os.environ.get("STARTTRACE_TOKEN") or None
    extra = [h for h in os.environ.get("STARTTRACE_ALLOWED_HOSTS", "").split(",") if h.strip()]
    if not is_loopback(host) and not token:
        sys.stderr.write(
            f"starttrace: warning: serving on {host}, beyond loopback, without a token: anyone who can reach"
            " this port can read every run (commands, environment) and post spans; use --token\n"
        )
    settings = Settings(
        db=db,
        journal_dir=journal_dir,
        token=token,
        retention_s=parse_retention(retention),
        decode_workers=decode_workers,
        host=host,
        allowed_hosts=(*allow_hosts, *extra),
        body_timeout_s=request_timeout_s,
        clickhouse=clickhouse,
    )
    app = create_app(settings)
    # idle and half-sent connections are closed (a client that sends half a request holds nothing)
    protocol = guarded_protocol(request_timeout_s)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_keep_alive=5,
        timeout_graceful_shutdown=STOP_GRACE_S,
        **({"http": protocol} if protocol is not None else {}),
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m starttrace.service.server` (tests and benchmarks; the CLI calls `serve`)."""
    import argparse

    parser = argparse.ArgumentParser(prog="starttrace-serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4318)
    parser.add_argument("--db")
    parser.add_argument("--journal-dir")
    parser.add_argument("--token")
    parser.add_argument("--retention")
    parser.add_argument("--decode-workers", type=int, default=1)
    parser.add_argument("--allow-host", dest="allow_hosts", action="append", default=[])
    parser.add_argument("--request-timeout", dest="request_timeout_s", type=float, default=REQUEST_TIMEOUT_S)
    parser.add_argument("--clickhouse")
    serve(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
