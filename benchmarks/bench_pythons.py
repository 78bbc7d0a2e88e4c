"""starttrace's overhead in instructions on each Python version (valgrind callgrind), traced vs untraced.

    .venv/bin/python benchmarks/bench_pythons.py build/pythons/3.12/bin/python ... [--imports 1000] [--json]

Each argument is the interpreter of a venv with starttrace installed from its wheel, as a user
installs it (scripts/test_pythons.sh makes build/pythons/X.Y). The cases and the environment are
bench_instructions.py's (PYTHONHASHSEED=0, bytecode caches written beforehand, a fixed environment,
journals in a temporary folder, run in that folder), each run untraced, traced with the C core,
and traced with STARTTRACE_PURE_PYTHON=1:

1. activation: `python -c pass`, traced minus untraced;
2. one import span: N one-line modules, (traced - untraced - activation) / N;
3. a standard-library workload: `python -c 'import <STDLIB>'`, the same modules on every version
   (how many import spans that is differs by version: counted in one traced run outside valgrind);
4. `python -c 'import torch'`, where the venv has torch.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_instructions import IMPORT_LOOP, WORK, base_env, instructions, warm

STDLIB = (
    "asyncio, email.mime.multipart, http.server, xml.dom.minidom, unittest, decimal, logging.handlers, "
    "sqlite3, tarfile, zipfile, csv, json, difflib, pydoc, argparse, dataclasses, inspect, typing"
)


def import_spans(python: str, program: str) -> int:
    """Import spans one traced run of `program` records (outside valgrind)."""
    from starttrace.sources.journal_reader import read_run

    with tempfile.TemporaryDirectory() as tmp:
        env = base_env(traced=True)
        env["STARTTRACE_DIR"] = tmp
        subprocess.run([python, "-c", program], env=env, check=True, capture_output=True)
        (run_dir,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
        run = read_run(run_dir)
        return int((run.spans["phase"] == "import").sum())


def measure(python: str, imports: int, torch: bool) -> dict[str, object]:
    off, on, pure = base_env(), base_env(traced=True), base_env(traced=True, pure=True)
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0])"], env=off, capture_output=True, text=True, check=True
    ).stdout.strip()
    built = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('starttrace.tracer._hotpath') is not None)"],
        env=off, capture_output=True, text=True, check=True,
    ).stdout.strip() == "True"  # fmt: skip
    if not built:
        raise SystemExit(f"{python}: starttrace's C core is not built in this venv")
    result: dict[str, object] = {"python": python, "version": version}
    print(f"\n== Python {version} ({python})")
    print(f"  {'case':<40} {'untraced':>14} {'traced, C':>14} {'ratio':>8} {'traced, Python':>15} {'ratio':>8}")

    def count(name: str, cmd: list[str]) -> tuple[int, int, int]:
        warm(cmd, off, on, pure)
        a, b, c = instructions(cmd, off, WORK), instructions(cmd, on, WORK), instructions(cmd, pure, WORK)
        print(f"  {name:<40} {a:>14,} {b:>14,} {b / a:>7.4f}x {c:>15,} {c / a:>7.4f}x")
        result[name] = {"untraced": a, "traced": b, "traced_python": c, "ratio": b / a, "ratio_python": c / a}
        return a, b, c

    pass_off, pass_on, pass_pure = count("python -c pass (activation)", [python, "-c", "pass"])
    folder = WORK / "mods"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for i in range(imports):
        (folder / f"synth_mod_{i}.py").write_text(f"VALUE = {i}\n")
    loop = [python, "-c", IMPORT_LOOP.format(folder=str(folder), count=imports)]
    imp_off, imp_on, imp_pure = count(f"import {imports} one-line modules", loop)
    result["activation"] = pass_on - pass_off
    result["activation_python"] = pass_pure - pass_off
    result["per_import_span"] = (imp_on - imp_off - (pass_on - pass_off)) / imports
    result["per_import_span_python"] = (imp_pure - imp_off - (pass_pure - pass_off)) / imports
    stdlib = f"import {STDLIB}"
    count("stdlib workload", [python, "-c", stdlib])
    result["stdlib_import_spans"] = import_spans(python, stdlib)
    if torch:
        cmd = [python, "-c", "import torch"]
        if subprocess.run(cmd, env=off, capture_output=True).returncode == 0:
            count("python -c 'import torch'", cmd)
            result["torch_import_spans"] = import_spans(python, "import torch")
        else:
            print("  (no torch in this venv: skipped)")
    print(
        f"  activation {result['activation']:,} instructions (Python code {result['activation_python']:,}); "
        f"one import span {result['per_import_span']:,.0f} (Python code {result['per_import_span_python']:,.0f}); "
        f"stdlib workload: {result['stdlib_import_spans']} import spans"
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pythons", nargs="+", help="venv interpreters with starttrace installed")
    parser.add_argument("--imports", type=int, default=1000, help="synthetic modules in the per-span case")
    parser.add_argument("--no-torch", action="store_true", help="skip `import torch`")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install -y valgrind)")
    print("valgrind callgrind, PYTHONHASHSEED=0; the environment of benchmarks/bench_instructions.py")
    pythons = [str(Path(python).absolute()) for python in args.pythons]
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir()
    here = os.getcwd()
    os.chdir(WORK)  # not the checkout: `python -c` puts the folder it runs in first on sys.path
    try:
        results = [measure(python, args.imports, not args.no_torch) for python in pythons]
    finally:
        os.chdir(here)
        shutil.rmtree(WORK, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
