"""The compile probe's cost: a compile-heavy start, traced vs untraced, side by side in one run.

    .venv/bin/python benchmarks/bench_compile.py [--reps 5] [--layers 6] [--json]

The program (a small torch module of `--layers` blocks under `torch.compile`, one forward pass)
starts cold every time: each run gets a fresh, empty TORCHINDUCTOR_CACHE_DIR, so Dynamo, AOT
autograd and Inductor (codegen + C++ compile) all run, as on a first start. Runs alternate
(untraced, traced, traced, untraced, ...) so that drift of the machine hits both sides alike.
Reported: median wall time of the whole process, median CPU time (user + system, the process and
the children it waited for), median compile time the program measures around
its first call, the traced/untraced ratios (target <= 1.02), and how many `compile.*` spans a
traced run recorded (the probe's events: two journal records each).

On a machine shared with other jobs the wall times of whole compiles spread by far more than 2 %,
so the probe's own cost is also measured directly, in one traced process (`--events`, default
20000): the time of a start/end pair of torch's ChromiumEventLogger calls inside a compile context,
through the probe's wrappers vs the originals (the same torch code runs either way), times the
events a traced cold run recorded, against that run's compile time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from starttrace.sources.journal_reader import read_run

PROGRAM = r"""
import sys, time
import torch

LAYERS = int(sys.argv[1])


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(256, 512)
        self.b = torch.nn.Linear(512, 256)
        self.norm = torch.nn.LayerNorm(256)

    def forward(self, x):
        return self.norm(x + self.b(torch.nn.functional.gelu(self.a(x))))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x.softmax(-1)


model = torch.compile(Model())
start = time.perf_counter()
with torch.no_grad():
    model(torch.randn(16, 256))
print(time.perf_counter() - start)
"""


EVENT_COST = r"""
import json, sys, time
import torch._dynamo.utils as utils
import torch._guards as guards

events = int(sys.argv[1])
logger = utils.get_chromium_event_logger()
wrapped = (utils.ChromiumEventLogger.log_event_start, utils.ChromiumEventLogger.log_event_end)
assert getattr(wrapped[0], "__starttrace__", False), "the compile probe did not attach"
original = (wrapped[0].__wrapped__, wrapped[1].__wrapped__)


def pairs(start, end, n):
    # a graph open (the "dynamo" event), then n child events, as inside a compile
    t0 = time.perf_counter()
    start(logger, "dynamo", time.time_ns(), {})
    for _ in range(n):
        start(logger, "bench_step", time.time_ns(), {})
        end(logger, "bench_step", time.time_ns(), {}, 0, False)
    end(logger, "dynamo", time.time_ns(), {}, 0, False)
    return time.perf_counter() - t0


with guards.compile_context(guards.CompileContext(guards.CompileId(frame_id=0, frame_compile_id=0))):
    best = {"original": [], "wrapped": []}
    for _ in range(5):
        best["original"].append(pairs(*original, events))
        best["wrapped"].append(pairs(*wrapped, events))
print(json.dumps({k: min(v) / events for k, v in best.items()}))
"""


def event_cost(events: int, work: Path) -> tuple[float, float]:
    """Seconds per child-event pair (start + end), through the probe's wrappers and without."""
    env = base_env()
    env.update(STARTTRACE="1", STARTTRACE_DIR=str(work / "runs-events"))
    done = subprocess.run([sys.executable, "-c", EVENT_COST, str(events)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"event cost run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    shutil.rmtree(work / "runs-events", ignore_errors=True)
    return result["wrapped"], result["original"]


def base_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STARTTRACE", "VLLM_STARTTRACE", "OTEL_", "TORCHINDUCTOR_")) and k.lower() != "traceparent"
    }


def one_run(traced: bool, layers: int, work: Path, index: int) -> tuple[float, float, int, float]:
    """(wall seconds, compile seconds the program measured, compile.* spans recorded, CPU seconds
    of the process and the children it waited for: less sensitive to other jobs than wall time)."""
    cache = work / f"cache-{index}"
    runs = work / f"runs-{index}"
    env = base_env()
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    if traced:
        env.update(STARTTRACE="1", STARTTRACE_DIR=str(runs))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(layers)], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    compile_s = float(done.stdout.strip().splitlines()[-1])
    spans = 0
    if traced:
        (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
        spans = read_run(run_dir).spans.filter(pl.col("name").str.starts_with("compile.")).height
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(runs, ignore_errors=True)
    return wall, compile_s, spans, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="runs per side (default 5)")
    parser.add_argument("--layers", type=int, default=6, help="blocks in the compiled module (default 6)")
    parser.add_argument("--events", type=int, default=20000, help="event pairs for the per-event cost (default 20000)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    results: dict[bool, list[tuple[float, float, int, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as tmp:
        work = Path(tmp)
        one_run(False, args.layers, work, -1)  # warm the OS caches (torch's files), not the compile cache
        index = 0
        for rep in range(args.reps):
            order = (False, True) if rep % 2 == 0 else (True, False)
            for traced in order:
                results[traced].append(one_run(traced, args.layers, work, index))
                index += 1
                if not args.json:
                    wall, compile_s, spans, cpu = results[traced][-1]
                    side = "traced  " if traced else "untraced"
                    print(
                        f"  {side} wall {wall:7.2f} s  cpu {cpu:7.2f} s  compile {compile_s:7.2f} s"
                        f"  compile spans {spans}",
                        flush=True,
                    )
        wrapped_s, original_s = event_cost(args.events, work)
    summary: dict[str, object] = {"reps": args.reps, "layers": args.layers}
    for traced, side in ((False, "untraced"), (True, "traced")):
        summary[f"{side}_wall_median_s"] = round(statistics.median(r[0] for r in results[traced]), 3)
        summary[f"{side}_compile_median_s"] = round(statistics.median(r[1] for r in results[traced]), 3)
        summary[f"{side}_cpu_median_s"] = round(statistics.median(r[3] for r in results[traced]), 3)
    summary["compile_spans_per_run"] = statistics.median(r[2] for r in results[True])
    summary["wall_ratio"] = round(summary["traced_wall_median_s"] / summary["untraced_wall_median_s"], 4)  # type: ignore[operator]
    summary["compile_ratio"] = round(summary["traced_compile_median_s"] / summary["untraced_compile_median_s"], 4)  # type: ignore[operator]
    summary["cpu_ratio"] = round(summary["traced_cpu_median_s"] / summary["untraced_cpu_median_s"], 4)  # type: ignore[operator]
    summary["event_pair_us_wrapped"] = round(wrapped_s * 1e6, 2)
    summary["event_pair_us_original"] = round(original_s * 1e6, 2)
    probe_s = (wrapped_s - original_s) * summary["compile_spans_per_run"]  # type: ignore[operator]
    summary["probe_seconds_per_run"] = round(probe_s, 5)
    summary["probe_share_of_compile"] = round(probe_s / summary["untraced_compile_median_s"], 6)  # type: ignore[operator]
    if args.json:
        print(json.dumps(summary))
        return
    print(
        f"untraced: wall {summary['untraced_wall_median_s']} s, compile {summary['untraced_compile_median_s']} s "
        f"(medians of {args.reps})\n"
        f"traced:   wall {summary['traced_wall_median_s']} s, compile {summary['traced_compile_median_s']} s, "
        f"{summary['compile_spans_per_run']} compile spans per run\n"
        f"CPU: untraced {summary['untraced_cpu_median_s']} s, traced {summary['traced_cpu_median_s']} s\n"
        f"ratio traced/untraced: wall {summary['wall_ratio']}, compile {summary['compile_ratio']}, "
        f"CPU {summary['cpu_ratio']} (target <= 1.02)\n"
        f"one event pair (start + end): {summary['event_pair_us_wrapped']} us through the probe, "
        f"{summary['event_pair_us_original']} us torch alone: the probe's own cost "
        f"{summary['probe_seconds_per_run']} s per run = {summary['probe_share_of_compile']:.4%} of the compile"
    )


if __name__ == "__main__":
    main()
