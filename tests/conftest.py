"""Shared fixtures: the project's interpreter, a traced environment, a traced process tree, and a
small real OTLP/HTTP receiver on loopback.

    def test_x(run_tree):
        run = run_tree("--no-torch")          # examples/tree.py, traced, read back with read_run

    def test_y(venv_python, traced_env, only_run_dir, journal_root):
        subprocess.run([venv_python, "-c", "import json"], env=traced_env, check=True)
        run_dir = only_run_dir(journal_root)

Helpers are fixtures (`clean_env`, `only_run_dir`), not imports: several conftest.py files exist
under tests/, and `import conftest` would pick whichever one came first.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
TREE = REPO / "examples" / "tree.py"

# Variables that would leak the caller's tracing context (or an OTLP endpoint) into a test.
_LEAKY_PREFIXES = ("STARTTRACE", "VLLM_STARTTRACE", "OTEL_")
_LEAKY_NAMES = ("TRACEPARENT", "traceparent", "PYTHONPROFILEIMPORTTIME")


# Kept: how the hot path records (scripts/test_pythons.sh runs the tree tests again with the Python code).
_KEPT_NAMES = ("STARTTRACE_PURE_PYTHON",)


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without any tracing switch, run context or OTLP settings; plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k in _KEPT_NAMES or (not k.startswith(_LEAKY_PREFIXES) and k not in _LEAKY_NAMES)
    }
    env.update(extra)
    return env


@pytest.fixture(name="clean_env", scope="session")
def clean_env_fixture() -> Callable[..., dict[str, str]]:
    """clean_env(**extra): os.environ without tracing switches, run context or OTLP settings."""
    return clean_env


@pytest.fixture(name="only_run_dir", scope="session")
def only_run_dir_fixture() -> Callable[[Path], Path]:
    """only_run_dir(root): the single run folder under root (fails when there is none or several)."""
    return only_run_dir


@pytest.fixture(scope="session")
def venv_python() -> str:
    """The interpreter of the project's venv (starttrace installed with its .pth): pytest's own when
    pytest runs in a venv (scripts/test_pythons.sh runs these tests in one venv per Python version,
    with the package installed from a wheel), else .venv's."""
    if sys.prefix != sys.base_prefix:
        return sys.executable
    candidate = REPO / ".venv" / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable


@pytest.fixture
def journal_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    return root


@pytest.fixture
def traced_env(journal_root: Path) -> dict[str, str]:
    """An environment that switches tracing on, with journals under a per-test folder."""
    return clean_env(STARTTRACE="1", STARTTRACE_DIR=str(journal_root))


def only_run_dir(root: Path) -> Path:
    """The single run folder under `root` (fails the test when there is none or several)."""
    runs = [p for p in root.iterdir() if p.is_dir()]
    assert len(runs) == 1, f"expected exactly one run in {root}, found {[p.name for p in runs]}"
    return runs[0]


@pytest.fixture
def run_tree(venv_python: str, traced_env: dict[str, str], journal_root: Path) -> Callable[..., Any]:
    """run_tree(*args, env=None, timeout=120) -> reader.Run of a traced examples/tree.py run.

    Returns once every process of the run has exited. The Run has the tree's stdout (its JSON line
    with the pids) as attribute `tree_stdout`.
    """
    from st_service_helpers import wait_final

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Any:
        merged = dict(traced_env)
        merged.update(env or {})
        proc = subprocess.run(
            [venv_python, str(TREE), *args], env=merged, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, f"tree.py failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        run_dir = only_run_dir(Path(merged["STARTTRACE_DIR"]))
        # Helpers (resource tracker, forkserver) exit just after the root, and the clock file comes
        # after that: wait for both, so that the run read here is final.
        result = wait_final(run_dir, environ=merged)
        result.tree_stdout = proc.stdout
        return result

    return run


# --- a real OTLP/HTTP receiver (protobuf), as the OTLP spec 1.11 describes one ---------------------


@dataclass
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int
    links: list[tuple[str, str]]


def _any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


@dataclass
class OtlpReceiver:
    url: str  # base URL; traces go to url + "/v1/traces"
    requests: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def traces_url(self) -> str:
        return self.url + "/v1/traces"

    def spans(self, facts: bool = False) -> list[ReceivedSpan]:
        """The run spans that arrived; `facts`: the runs' `starttrace.run` facts spans instead (each
        export of a run carries one, run/facts_attrs.py)."""
        return [s for s in self.all_spans() if (s.name == "starttrace.run") == facts]

    def all_spans(self) -> list[ReceivedSpan]:
        with self.lock:
            requests = list(self.requests)
        result = []
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = {kv.key: _any_value(kv.value) for kv in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        result.append(
                            ReceivedSpan(
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_id=span.parent_span_id.hex(),
                                name=span.name,
                                start_ns=span.start_time_unix_nano,
                                end_ns=span.end_time_unix_nano,
                                attributes={kv.key: _any_value(kv.value) for kv in span.attributes},
                                resource=resource,
                                status_code=span.status.code,
                                links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            )
                        )
        return result

    def wait_for_spans(self, count: int, timeout: float) -> list[ReceivedSpan]:
        """Wait until at least `count` spans arrived (returns what arrived by the deadline)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if len(spans) >= count or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)


@contextlib.contextmanager
def running_otlp_receiver() -> Iterator[OtlpReceiver]:
    """POST /v1/traces with a protobuf ExportTraceServiceRequest -> 200 + ExportTraceServiceResponse."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    receiver = OtlpReceiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding", "").lower() == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces" or "protobuf" not in self.headers.get("Content-Type", ""):
                self.send_response(404 if self.path != "/v1/traces" else 415)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            request = ExportTraceServiceRequest()
            try:
                request.ParseFromString(body)
            except Exception:
                self.send_response(400)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with receiver.lock:
                receiver.requests.append(request)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A local OTLP/HTTP receiver for one test (see `running_otlp_receiver`)."""
    with running_otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def module_otlp_receiver() -> Iterator[OtlpReceiver]:
    """The same receiver, shared by the tests of a module (e.g. one real vLLM run)."""
    with running_otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def session_otlp_receiver() -> Iterator[OtlpReceiver]:
    """The same receiver for the whole session (the real vLLM run the e2e modules share)."""
    with running_otlp_receiver() as receiver:
        yield receiver
