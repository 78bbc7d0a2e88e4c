"""starttrace overhead, traced vs untraced, side by side in one run.

    .venv/bin/python benchmarks/bench_overhead.py [--reps 7] [--imports 2000] [--no-torch] [--json]

Every pair is run alternately (untraced, traced, traced, untraced, ...) so that drift of the machine
hits both sides alike; the tables show medians and the traced/untraced ratio.

1. switched off: the whole cost of an installed starttrace is its `.pth` line; it is timed
   in-process (env unset, and STARTTRACE=0), and `python -c pass` is timed with the env unset vs
   STARTTRACE=0.
2. wall time of whole programs: `python -c pass`, `python -c 'import torch'`,
   `python examples/tree.py --no-torch` (7 processes: spawn, fork, forkserver + 2, subprocess).
3. per event: a program imports N synthetic modules (fresh files, nothing cached in sys.modules);
   (traced - untraced) / N is the cost of one import span (begin + end record: two copies into the
   journal's memory-mapped segment, no system call). Instructions instead of seconds:
   benchmarks/bench_instructions.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TREE = REPO / "examples" / "tree.py"
PTH = REPO / "starttrace.pth"


def base_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STARTTRACE", "VLLM_STARTTRACE", "OTEL_"))
        and k.lower() != "traceparent"
        and k != "PYTHONDONTWRITEBYTECODE"  # measure with bytecode caches, as installed packages have them
    }


def wall(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed ({proc.returncode}):\n{proc.stderr.decode(errors='replace')}")
    return elapsed


def reported(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> float:
    """The seconds the program itself prints on its last stdout line."""
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed ({proc.returncode}):\n{proc.stderr}")
    return float(proc.stdout.strip().splitlines()[-1])


def pair(
    reps: int, run_a: Callable[[], float], run_b: Callable[[], float], settle: float = 0.0
) -> tuple[list[float], list[float]]:
    """Alternate A and B (ABBA ...): returns the samples of each. `settle`: seconds to wait after
    each run, so that what a traced root leaves running (the clock-state helper it starts at exit,
    ~70 ms of CPU) does not run beside the next one."""
    a: list[float] = []
    b: list[float] = []
    for rep in range(reps):
        for first in ((run_a, a), (run_b, b)) if rep % 2 == 0 else ((run_b, b), (run_a, a)):
            first[1].append(first[0]())
            time.sleep(settle)
    return a, b


def row(name: str, a: list[float], b: list[float], unit: str = "ms", scale: float = 1e3) -> dict[str, object]:
    ma, mb = statistics.median(a), statistics.median(b)
    return {
        "case": name,
        "untraced": ma * scale,
        "traced": mb * scale,
        "delta": (mb - ma) * scale,
        "ratio": mb / ma if ma else float("nan"),
        "unit": unit,
        "n": len(a),
    }


def print_table(title: str, rows: list[dict[str, object]], a_name: str = "untraced", b_name: str = "traced") -> None:
    print(f"\n{title}")
    print(f"  {'case':<44} {a_name:>12} {b_name:>12} {'delta':>10} {'ratio':>7}")
    for r in rows:
        unit = r["unit"]
        print(
            f"  {r['case']:<44} {r['untraced']:>9.2f} {unit:<2} {r['traced']:>9.2f} {unit:<2}"
            f" {r['delta']:>+7.2f} {unit:<2} {r['ratio']:>6.3f}x"
        )


AB_PROGRAM = """
import json, sys, time
from starttrace.tracer import recorder
from starttrace.tracer.probes import imports
sys.path.insert(0, {folder!r})
names = ["synth_mod_%d" % i for i in range({count})]

def batch():
    start = time.perf_counter()
    for name in names:
        __import__(name)
    elapsed = time.perf_counter() - start
    for name in names:
        del sys.modules[name]
    return elapsed

batch()  # warm
result = {{"on": [], "off": []}}
for i in range({batches}):
    for hooked in ((True, False) if i % 2 == 0 else (False, True)):
        imports.install() if hooked else imports.uninstall()
        result["on" if hooked else "off"].append(batch())
imports.install()
loops = 20000
start = time.perf_counter()
for _ in range(loops):
    recorder.end(recorder.begin("bench", None))
result["record_us"] = (time.perf_counter() - start) / loops * 1e6
print(json.dumps(result))
"""

IMPORT_LOOP = """
import sys, time
sys.path.insert(0, {folder!r})
names = ["synth_mod_%d" % i for i in range({count})]
start = time.perf_counter()
for name in names:
    __import__(name)
print(time.perf_counter() - start)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7, help="repetitions of every measurement (default 7)")
    parser.add_argument("--imports", type=int, default=2000, help="synthetic modules in the per-event test")
    parser.add_argument("--no-torch", action="store_true", help="skip `import torch`")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()

    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="starttrace-bench-"))
    journals = work / "runs"
    off = base_env()
    on = dict(off, STARTTRACE="1", STARTTRACE_DIR=str(journals))
    results: dict[str, list[dict[str, object]]] = {}
    try:
        print(f"python {python}  ({sys.version.split()[0]}, {os.cpu_count()} CPUs), {args.reps} repetitions, medians")

        # 1. switched off -----------------------------------------------------------------------
        line = PTH.read_text().strip()
        code = compile(line, "starttrace.pth", "exec")
        saved = {k: os.environ.pop(k) for k in ("STARTTRACE", "VLLM_STARTTRACE") if k in os.environ}
        loops = 200_000
        per_exec_unset = min(timeit.repeat(lambda: exec(code, {}), number=loops, repeat=5)) / loops
        empty = compile("import os", "empty.pth", "exec")  # what any .pth import line costs anyway
        per_exec_unset -= min(timeit.repeat(lambda: exec(empty, {}), number=loops, repeat=5)) / loops
        os.environ.update(saved)
        print("\n1. switched off (starttrace installed, env unset)")
        print(
            f"  the .pth line, env unset: {per_exec_unset * 1e9:.0f} ns per interpreter start"
            " (timed in-process, beyond `import os`)"
        )
        unset_s, zero_s = pair(
            args.reps,
            lambda: wall([python, "-c", "pass"], off),
            lambda: wall([python, "-c", "pass"], dict(off, STARTTRACE="0")),
        )
        off_rows = [row("python -c pass: unset vs STARTTRACE=0", unset_s, zero_s)]
        print_table("   (STARTTRACE=0: the .pth line reads the value and imports nothing)", off_rows, "unset", "=0")
        results["off"] = [{"case": "pth line, env unset", "ns": per_exec_unset * 1e9}, *off_rows]

        # 2. whole programs -----------------------------------------------------------------------
        cases: list[tuple[str, list[str]]] = [("python -c pass", [python, "-c", "pass"])]
        if not args.no_torch:
            cases.append(("python -c 'import torch'", [python, "-c", "import torch"]))
        cases.append(("python examples/tree.py --no-torch", [python, str(TREE), "--no-torch"]))
        program_rows = []
        for name, cmd in cases:
            wall(cmd, off)  # warm the page cache once
            a, b = pair(args.reps, lambda cmd=cmd: wall(cmd, off), lambda cmd=cmd: wall(cmd, on), settle=0.3)
            program_rows.append(row(name, a, b))
        print_table("2. wall time of whole programs (process tree included)", program_rows)
        results["programs"] = program_rows

        # 3. per import span ----------------------------------------------------------------------
        count = args.imports
        folder = work / "mods"
        folder.mkdir()
        for i in range(count):
            (folder / f"synth_mod_{i}.py").write_text(f"VALUE = {i}\n")
        program = IMPORT_LOOP.format(folder=str(folder), count=count)
        reported([python, "-c", program], off)  # writes the bytecode caches once
        a, b = pair(args.reps, lambda: reported([python, "-c", program], off),
                    lambda: reported([python, "-c", program], on))  # fmt: skip
        loop_rows = [row(f"import {count} modules, separate processes", a, b)]
        across = (statistics.median(b) - statistics.median(a)) / count * 1e6
        ab = AB_PROGRAM.format(folder=str(folder), count=count, batches=2 * args.reps)
        proc = subprocess.run([python, "-c", ab], env=on, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"A/B program failed:\n{proc.stderr}")
        inproc = json.loads(proc.stdout.strip().splitlines()[-1])
        loop_rows.append(row(f"import {count} modules, one process, hook off/on", inproc["off"], inproc["on"]))
        print_table("3. per event (synthetic one-line modules, bytecode cached)", loop_rows)
        per_span_us = (statistics.median(inproc["on"]) - statistics.median(inproc["off"])) / count * 1e6
        per_import_us = statistics.median(inproc["off"]) / count * 1e6
        print(
            f"  one import span, A/B in one process: {per_span_us:.2f} us"
            f" (the untraced import itself: {per_import_us:.1f} us); across processes: {across:.2f} us"
        )
        print(f"  the two journal records of a span, recorder.begin + recorder.end alone: {inproc['record_us']:.2f} us")
        results["per_event"] = [
            *loop_rows,
            {
                "case": "per import span",
                "us": per_span_us,
                "across_processes_us": across,
                "record_us": inproc["record_us"],
            },
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
