"""Fixtures for the service tests: a real `serve` subprocess on a free loopback port, and an
in-process app (TestClient) for fast checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from st_service_helpers import Server, start_server

from starttrace.service.app import Settings, create_app


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def make(*args: str, env: dict[str, str] | None = None) -> Server:
        srv = start_server(tmp_path, *args, env=env)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture
def server(server_factory: Callable[..., Server]) -> Server:
    return server_factory()


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(**kw: Any) -> TestClient:
        kw.setdefault("db", tmp_path / f"app{len(clients)}.db")
        client = TestClient(create_app(Settings(**kw)), base_url="http://localhost")
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()
