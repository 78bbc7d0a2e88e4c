"""starttrace overhead in instructions (valgrind callgrind), traced vs untraced, side by side.

    .venv/bin/python benchmarks/bench_instructions.py [--imports 3000] [--no-torch] [--json]

Needs valgrind (`apt-get install -y valgrind`). Instruction counts are deterministic where wall
time is not: every program runs under `valgrind --tool=callgrind` with PYTHONHASHSEED=0, bytecode
caches written beforehand, and journals in a temporary folder that is removed afterwards. Each case
runs untraced and traced one after the other in the same invocation and prints the ratio.

1. activation: `python -c pass` traced minus untraced (run creation, process record, probes).
2. one import span: a program imports N one-line modules (fresh files, none cached in sys.modules);
   (traced - untraced - activation) / N is the cost of one import span (begin + end record).
3. `python -c 'import torch'`: traced / untraced.

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

IMPORT_LOOP = """
import sys
sys.path.insert(0, {folder!r})
for i in range({count}):
    __import__("synth_mod_%d" % i)
"""


def base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STARTTRACE", "VLLM_STARTTRACE", "OTEL_", "PYTHONPROFILEIMPORTTIME"))
        and k.lower() != "traceparent"
        and k != "PYTHONDONTWRITEBYTECODE"  # measure with bytecode caches, as installed packages have them
    }
    env["PYTHONHASHSEED"] = "0"
    # callgrind counts every thread: idle OpenBLAS / OpenMP workers spin for as long as the
    # program runs, so their count follows wall time, not the work done. One thread each.
    env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = "1"
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--imports", type=int, default=3000, help="synthetic modules in the per-span case")
    parser.add_argument("--no-torch", action="store_true", help="skip `import torch`")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install -y valgrind)")

    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="starttrace-instr-"))
    off = base_env()
    on = dict(off, STARTTRACE="1", STARTTRACE_DIR=str(work / "runs"))
    results: dict[str, object] = {}
    try:
        print(f"python {python} ({sys.version.split()[0]}), valgrind callgrind, PYTHONHASHSEED=0")
        print(f"  {'case':<44} {'untraced':>14} {'traced':>14} {'delta':>12} {'ratio':>8}")

        def show(name: str, a: int, b: int) -> None:
            print(f"  {name:<44} {a:>14,} {b:>14,} {b - a:>+12,} {b / a:>7.4f}x")
            results[name] = {"untraced": a, "traced": b, "delta": b - a, "ratio": b / a}

        # 1. activation
        cmd = [python, "-c", "pass"]
        warm(cmd, off, on)
        pass_off, pass_on = instructions(cmd, off, work), instructions(cmd, on, work)
        show("python -c pass (activation)", pass_off, pass_on)
        activation = pass_on - pass_off

        # 2. per import span
        folder = work / "mods"
        folder.mkdir()
        for i in range(args.imports):
            (folder / f"synth_mod_{i}.py").write_text(f"VALUE = {i}\n")
        cmd = [python, "-c", IMPORT_LOOP.format(folder=str(folder), count=args.imports)]
        warm(cmd, off, on)
        imp_off, imp_on = instructions(cmd, off, work), instructions(cmd, on, work)
        show(f"import {args.imports} one-line modules", imp_off, imp_on)
        per_span = (imp_on - imp_off - activation) / args.imports
        results["per_import_span"] = per_span
        results["activation"] = activation

        # 3. import torch
        if not args.no_torch:
            cmd = [python, "-c", "import torch"]
            if subprocess.run(cmd, env=off, capture_output=True).returncode == 0:
                warm(cmd, off, on)
                show("python -c 'import torch'", instructions(cmd, off, work), instructions(cmd, on, work))
            else:
                print("  (torch is not installed: skipped)")

        print(f"\n  activation: {activation:,} instructions")
        print(f"  one import span (begin + end record): {per_span:,.0f} instructions")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
