"""Idle and half-sent connections are closed after a timeout (issue 26): a client that opens
connections and sends half a request (or half a body) holds nothing open for long."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from st_service_helpers import Server

N = 200


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True  # EOF: the server closed it
    except TimeoutError:
        return False
    except OSError:
        return True  # reset


def test_half_sent_and_idle_connections_are_closed(server_factory: Callable[..., Server]) -> None:
    srv = server_factory("--request-timeout", "2")
    host, port = srv.url.split("//", 1)[1].split(":")
    socks = []
    t0 = time.monotonic()
    for i in range(N):
        s = socket.create_connection((host, int(port)), timeout=10)
        if i % 3 == 0:
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: localhost\r\nContent-Type: app")  # half a head
        elif i % 3 == 1:  # a whole head, half the body it announced
            s.sendall(
                b"POST /v1/traces HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-protobuf\r\n"
                b"Content-Length: 1000\r\n\r\n" + b"\x0a" * 100
            )
        socks.append(s)  # (else: nothing sent at all)
    try:
        deadline = t0 + 15  # one deadline for all of them: a hang fails fast
        closed = [_closed_by_server(s, max(0.05, deadline - time.monotonic())) for s in socks]
        elapsed = time.monotonic() - t0
        assert all(closed), f"{closed.count(False)} of {N} connections still open"
        assert elapsed < 20
        # the service still answers
        ok = socket.create_connection((host, int(port)), timeout=10)
        ok.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        assert ok.recv(100).startswith(b"HTTP/1.1 200")
        ok.close()
    finally:
        for s in socks:
            s.close()
