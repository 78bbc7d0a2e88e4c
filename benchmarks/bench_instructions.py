"""starttrace overhead in instructions (valgrind callgrind), traced vs untraced, side by side.

    .venv/bin/python benchmarks/bench_instructions.py [--imports 3000] [--no-torch] [--layouts 4] [--json]
        [--before TREE]

Needs valgrind (`apt-get install -y valgrind`). Instruction counts are deterministic where wall
time is not: every program runs under `valgrind --tool=callgrind` with PYTHONHASHSEED=0, bytecode
caches written beforehand, and journals in a temporary folder that is removed afterwards. Each case
runs untraced and traced one after the other in the same invocation and prints the ratio.

Where the hot path's C core is built (starttrace/tracer/_hotpath.c), every traced case also runs with
STARTTRACE_PURE_PYTHON=1 (the Python code writing the same records): a third column, and the
per-span cost of both.

1. activation: `python -c pass` traced minus untraced (run creation, process record, probes);
   and a helper's: `python -c 'import ctypes'` in a run a traced root made (the environment it
   hands down, as Inductor's `cdll.LoadLibrary` checks inherit it).
2. one import span: a program imports N one-line modules (fresh files, none cached in sys.modules);
   (traced - untraced - activation) / N is the cost of one import span (begin + end record).
3. `python -c 'import torch'`: traced / untraced, over several starting layouts (--layouts N):
   where the garbage collector's allocation counters stand, and how the heap is laid out, when a
   program starts moves the traced program's extra count by up to ~3 M either way (an extra gen-1
   collection during `import torch` is ~1.7 M). Layout i first keeps i * 7700 / N empty lists
   alive, traced and untraced alike, then imports torch: the gen-0 counter (a collection every 700
   net allocations) starts i/N of its cycle further on, and the gen-1 counter (one every 10 gen-0
   collections, 7000 allocations) i/N of its own. The figure is the mean over the layouts; each
   layout's is printed too.

--before TREE: every traced case also runs with PYTHONPATH=TREE (another checkout of starttrace,
with its C core built, e.g. the tree before a change), and the deltas are printed side by side
with their ratio (after / before).

Callgrind counts instructions executed in user space (the program's and the C library's); a system
call counts as the few instructions around it, so this measures what starttrace itself executes.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

COLLECTED = re.compile(rb"Collected\s*:\s*(\d+)")
# `import torch` after keeping `lists` empty lists alive (layout 0: none)
TORCH_IN_LAYOUT = "_layout = [[] for _ in range({lists})]\nimport torch"
GC_CYCLE = 7000 + 700  # allocations: the gen-1 cycle, plus one gen-0 cycle spread over the layouts

IMPORT_LOOP = """
import sys
sys.path.insert(0, {folder!r})
for i in range({count}):
    __import__("synth_mod_%d" % i)
"""


# What a program's instruction count depends on beyond its own work: the environment's size moves
# the heap, and with it the hash order of everything keyed by address (pybind11's type caches, sets
# of types, ...): the same untraced `import torch` counted 5,178 M to 5,194 M instructions with the
# caller's environment. So every case runs with this fixed environment (plus PYTHONPATH when set,
# for a copy of the tree), in a folder of a fixed name, and the cases differ by one byte:
# STARTTRACE=0 (off: the .pth line imports nothing) or 1, STARTTRACE_PURE_PYTHON=0 or 1.
KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH")
WORK = Path(tempfile.gettempdir()) / "starttrace-instructions"


def base_env(traced: bool = False, pure: bool = False) -> dict[str, str]:
    env = {k: os.environ[k] for k in KEPT if k in os.environ}
    env["PYTHONHASHSEED"] = "0"
    # callgrind counts every thread: idle OpenBLAS / OpenMP workers spin for as long as the
    # program runs, so their count follows wall time, not the work done. One thread each.
    env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = "1"
    env["STARTTRACE"] = "1" if traced else "0"
    env["STARTTRACE_PURE_PYTHON"] = "1" if pure else "0"
    env["STARTTRACE_DIR"] = str(WORK / "runs")
    return env


def instructions(cmd: list[str], env: dict[str, str], work: Path) -> int:
    """Instructions executed by `cmd` (the main process only) under callgrind."""
    out = work / "callgrind.out"
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no", *cmd],
        env=env,
        capture_output=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed under valgrind ({proc.returncode}):\n{proc.stderr.decode(errors='replace')}")
    match = COLLECTED.search(proc.stderr)
    if match is None:
        raise SystemExit(f"no instruction count from valgrind:\n{proc.stderr.decode(errors='replace')}")
    out.unlink(missing_ok=True)
    return int(match.group(1))


def warm(cmd: list[str], *envs: dict[str, str]) -> None:
    """Run `cmd` once in each environment: bytecode caches written, files in the page cache."""
    for env in envs:
        subprocess.run(cmd, env=env, check=True, capture_output=True)


def run_environment(python: str, traced: dict[str, str]) -> dict[str, str]:
    """What a traced root hands down to its children (lifecycle.export_run_environment), as the
    environment of a helper it would start."""
    show = "import os, json; print(json.dumps({k: v for k, v in os.environ.items() if k not in %r}))" % (
        sorted(traced),
    )
    out = subprocess.run([python, "-c", show], env=traced, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--imports", type=int, default=3000, help="synthetic modules in the per-span case")
    parser.add_argument("--no-torch", action="store_true", help="skip `import torch`")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--before", type=Path, help="a checkout of starttrace to compare the traced cases with")
    parser.add_argument("--layouts", type=int, default=4, help="starting layouts `import torch` is counted over")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install -y valgrind)")

    python = sys.executable
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir()
    work = WORK
    off, on = base_env(), base_env(traced=True)
    built = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('starttrace.tracer._hotpath') is not None)"],
        env=off, capture_output=True, text=True,
    ).stdout.strip() == "True"  # fmt: skip
    pure = base_env(traced=True, pure=True) if built else None
    results: dict[str, object] = {"c_core": built}
    try:
        print(f"python {python} ({sys.version.split()[0]}), valgrind callgrind, PYTHONHASHSEED=0")
        print(f"hot path: {'C core, and the Python code (STARTTRACE_PURE_PYTHON=1) beside it' if built else 'Python'}")
        third = f" {'traced, Python':>15} {'delta':>12} {'ratio':>8}" if pure else ""
        print(f"  {'case':<44} {'untraced':>14} {'traced':>14} {'delta':>12} {'ratio':>8}{third}")

        def show(name: str, a: int, b: int, c: int | None = None) -> None:
            extra = f" {c:>15,} {c - a:>+12,} {c / a:>7.4f}x" if c is not None else ""
            print(f"  {name:<44} {a:>14,} {b:>14,} {b - a:>+12,} {b / a:>7.4f}x{extra}")
            results[name] = {"untraced": a, "traced": b, "delta": b - a, "ratio": b / a}
            if c is not None:
                results[name].update(traced_python=c, delta_python=c - a, ratio_python=c / a)  # type: ignore[attr-defined]

        before_deltas: dict[str, tuple[int, int]] = {}

        def count(
            cmd: list[str], name: str = "", extra: dict[str, str] | None = None, python_code: bool = True
        ) -> tuple[int, int, int | None]:
            with_pure = pure if python_code else None
            envs = [dict(e, **(extra or {})) for e in ([off, on, with_pure] if with_pure else [off, on])]
            warm(cmd, *envs)
            counted = (
                instructions(cmd, envs[0], work),
                instructions(cmd, envs[1], work),
                instructions(cmd, envs[2], work) if with_pure else None,
            )
            if args.before is not None and name:
                earlier = dict(envs[1], PYTHONPATH=str(args.before.resolve()))
                warm(cmd, earlier)
                before_deltas[name] = (instructions(cmd, earlier, work) - counted[0], counted[1] - counted[0])
            return counted

        # 1. activation
        pass_off, pass_on, pass_pure = count([python, "-c", "pass"], "activation, python -c pass")
        show("python -c pass (activation)", pass_off, pass_on, pass_pure)
        activation = pass_on - pass_off
        inherited = run_environment(python, on)
        helper = [python, "-c", "import ctypes"]
        show("helper: python -c 'import ctypes' in a run", *count(helper, "activation, a helper in a run", inherited))

        # 2. per import span
        folder = work / "mods"
        folder.mkdir()
        for i in range(args.imports):
            (folder / f"synth_mod_{i}.py").write_text(f"VALUE = {i}\n")
        loop = [python, "-c", IMPORT_LOOP.format(folder=str(folder), count=args.imports)]
        imp_off, imp_on, imp_pure = count(loop, f"import {args.imports} one-line modules")
        show(f"import {args.imports} one-line modules", imp_off, imp_on, imp_pure)
        per_span = (imp_on - imp_off - activation) / args.imports
        results["per_import_span"] = per_span
        results["activation"] = activation
        if pure and pass_pure is not None and imp_pure is not None:
            results["per_import_span_python"] = (imp_pure - imp_off - (pass_pure - pass_off)) / args.imports
            results["activation_python"] = pass_pure - pass_off

        # 3. import torch, over several starting layouts
        if not args.no_torch:
            if subprocess.run([python, "-c", "import torch"], env=off, capture_output=True).returncode == 0:
                torch_counts = []
                layouts = max(1, args.layouts)
                for layout in range(layouts):
                    code = TORCH_IN_LAYOUT.format(lists=layout * GC_CYCLE // layouts)
                    name = "import torch" if layout == 0 else f"import torch, layout {layout}"
                    # the Python code's column for the first layout only: a callgrind run of torch is ~2 min
                    counted = count([python, "-c", code], name, python_code=layout == 0)
                    show(f"python -c 'import torch', layout {layout}", *counted)
                    torch_counts.append(counted[:2])
                mean_off = sum(a for a, _ in torch_counts) / len(torch_counts)
                mean_on = sum(b for _, b in torch_counts) / len(torch_counts)
                deltas = [b - a for a, b in torch_counts]
                results["import torch"] = {
                    "layouts": len(torch_counts),
                    "untraced_mean": mean_off,
                    "traced_mean": mean_on,
                    "delta_mean": mean_on - mean_off,
                    "ratio_mean": mean_on / mean_off,
                    "deltas": deltas,
                }
                print(
                    f"  {'import torch, mean of ' + str(len(torch_counts)) + ' layouts':<44} {mean_off:>14,.0f} "
                    f"{mean_on:>14,.0f} {mean_on - mean_off:>+12,.0f} {mean_on / mean_off:>7.4f}x"
                    f"   (deltas {min(deltas):+,} to {max(deltas):+,})"
                )
            else:
                print("  (torch is not installed: skipped)")

        print(f"\n  activation: {activation:,} instructions")
        print(f"  one import span (begin + end record): {per_span:,.0f} instructions")
        if "per_import_span_python" in results:
            print(f"  the same, Python code: activation {results['activation_python']:,}, "
                  f"one import span {results['per_import_span_python']:,.0f} instructions")  # fmt: skip
        if before_deltas:
            print(f"\n  traced - untraced, C core, before ({args.before}) and now:")
            for name, (earlier, now) in before_deltas.items():
                print(f"  {name:<44} {earlier:>+14,} {now:>+14,} {now / earlier:>7.3f}x")
            if f"import {args.imports} one-line modules" in before_deltas:
                act = before_deltas["activation, python -c pass"]
                loop_delta = before_deltas[f"import {args.imports} one-line modules"]
                spans = [(loop_delta[i] - act[i]) / args.imports for i in (0, 1)]
                print(f"  {'one import span':<44} {spans[0]:>14,.0f} {spans[1]:>14,.0f} {spans[1] / spans[0]:>7.3f}x")
            torch_layouts = [pair for name, pair in before_deltas.items() if name.startswith("import torch")]
            if torch_layouts:
                earlier_mean = sum(b for b, _ in torch_layouts) / len(torch_layouts)
                now_mean = sum(n for _, n in torch_layouts) / len(torch_layouts)
                label = f"import torch, mean of {len(torch_layouts)} layouts"
                print(f"  {label:<44} {earlier_mean:>+14,.0f} {now_mean:>+14,.0f} {now_mean / earlier_mean:>7.3f}x")
            results["before"] = {name: {"before": b, "now": n} for name, (b, n) in before_deltas.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
