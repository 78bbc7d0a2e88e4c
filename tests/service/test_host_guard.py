"""Loopback safety (issue 26): a foreign Host header (DNS rebinding) is refused; binding beyond
loopback without a token is warned about once at start."""

from __future__ import annotations

import http.client
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from st_service_helpers import Server, start_server, wait_for
from synth_runs import make_run, to_protobuf

from starttrace.service.app import HostGuard

PB = {"Content-Type": "application/x-protobuf"}


def _get(url: str, path: str, host: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    """A raw request with exactly this Host header (what a rebinding page's browser sends)."""
    hostport = url.split("//", 1)[1]
    conn = http.client.HTTPConnection(hostport, timeout=30)
    try:
        headers = {"Host": host}
        if body is not None:
            headers["Content-Type"] = "application/x-protobuf"
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_foreign_host_header_is_refused(server: Server) -> None:
    port = server.url.rsplit(":", 1)[1]
    body = to_protobuf(make_run(ranks=1, imports_per_rank=5, run_id="rebind")).SerializeToString()
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "app.localhost"):
        assert _get(server.url, "/runs", host)[0] == 200, host
    assert _get(server.url, "/v1/traces", f"localhost:{port}", "POST", body)[0] == 200
    for host in (f"attacker.example:{port}", "attacker.example", f"evil.com.:{port}", "10.0.0.1", "example"):
        for path, method in (("/runs", "GET"), ("/startup/rebind", "GET"), ("/healthz", "GET"), ("/v1/traces", "POST")):
            status, data = _get(server.url, path, host, method, body if method == "POST" else None)
            assert status == 421, (host, path, status)
            assert b"DNS rebinding" in data and b"rebind" not in data.replace(b"rebinding", b"")


def test_allowed_names_and_beyond_loopback(make_client: Callable[..., TestClient]) -> None:
    guard = HostGuard(lambda *a: None, "127.0.0.1", ("st.internal",))  # type: ignore[arg-type, return-value]
    assert guard.allows("st.internal:4318") and guard.allows("LOCALHOST") and guard.allows("127.1.2.3:80")
    assert not guard.allows("st.internal.attacker.example") and not guard.allows("starttrace")
    wide = HostGuard(lambda *a: None, "0.0.0.0")  # type: ignore[arg-type, return-value]
    # in a container: the service name, an IP literal; a rebinding attack's dotted name still refused
    assert wide.allows("starttrace:4318") and wide.allows("10.1.2.3:4318") and wide.allows("[fe80::1]:4318")
    assert not wide.allows("attacker.example:4318")
    c = make_client(allowed_hosts=("st.internal",))
    assert c.get("/runs", headers={"Host": "st.internal"}).status_code == 200
    assert c.get("/runs", headers={"Host": "rebind.attacker.example"}).status_code == 421


@pytest.mark.parametrize("token", [None, "s3cret"])
def test_binding_beyond_loopback_without_a_token_warns_once(tmp_path: Path, token: str | None) -> None:
    args = ["--host", "0.0.0.0"] + (["--token", token] if token else [])
    srv = start_server(tmp_path, *args)
    try:
        wait_for(lambda: srv.log.stat().st_size >= 0)
        log = srv.log.read_text()
        warned = log.count("without a token")
        assert warned == (0 if token else 1), log
    finally:
        srv.stop()
    local = start_server(tmp_path)  # loopback: no warning
    try:
        assert "without a token" not in local.log.read_text()
    finally:
        local.stop()
