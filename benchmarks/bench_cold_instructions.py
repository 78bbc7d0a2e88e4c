"""Instructions of the service's cold path, step by step, source trees side by side.

    .venv/bin/python benchmarks/bench_cold_instructions.py TREE [TREE ...] [--ranks 16] [--spans-per-rank 6000]
        # e.g. /tmp/base (`git archive <rev> | tar -x -C /tmp/base`) and .

What a first `GET /startup/{run}` waits for when nothing is built yet: the store's rows of the run
(`Store.load_rows`), the run type (`run_from_rows`), the waterfall model (`build_model`) and the
page's first answer as JSON (`first_payload`). Wall time on this shared 2-core machine swings by
+-15 % and more; instruction counts do not. For each tree, one Python process under
`valgrind --tool=callgrind --instr-atstart=no` (Debian `valgrind`, PYTHONHASHSEED=0) ingests the
synthetic run (`tests/synth_runs.py`, seed 42) into a store over the OTLP decoder, then switches
instrumentation on (`callgrind_control -i on`) and dumps the counters after each step
(`callgrind_control -d`): each dump holds that step's instructions alone. 16 x 6000 takes ~4 min
per tree; `--ranks 4` (24k spans, still above the first answer's whole-run limit) ~1 min.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEPS = ["load_rows", "run_from_rows", "build_model", "first_answer"]

PROGRAM = r"""
import json, os, subprocess, sys, tempfile
sys.path.insert(0, sys.argv[1])
sys.path.insert(1, sys.argv[2])
from synth_runs import make_run, protobuf_batches
from starttrace.analysis.lanes import build_model
from starttrace.sources import store as S
from starttrace.sources.otlp import parse_and_decode
from starttrace.views.startup_json import first_payload
run = make_run(ranks=int(sys.argv[3]), imports_per_rank=int(sys.argv[4]), run_id="bench", seed=42)
path = os.path.join(tempfile.mkdtemp(), "b.db")
st = S.Store(path)
for body in protobuf_batches(run, 4096):
    st.ingest_now(parse_and_decode(body, "application/x-protobuf").batch)
st.close()
st = S.Store(path)  # the run read back from the file (as after a restart), not the writer's live reader
pid = str(os.getpid())
def control(*args):
    subprocess.run(["callgrind_control", *args, pid], check=True, capture_output=True)
control("-i", "on")
rows = st.load_rows("bench")
control("-d", "load_rows")
the_run = S.run_from_rows(rows)
control("-d", "run_from_rows")
model = build_model(the_run)
control("-d", "build_model")
json.dumps(first_payload(model), separators=(",", ":"), default=str)
control("-d", "first_answer")
control("-i", "off")
print(len(model.spans))
"""


def instructions(tree: Path, program: Path, ranks: int, per_rank: int) -> tuple[dict[str, int], int]:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={tmp}/cg.out",
             sys.executable, str(program), str(tree), str(tree / "tests"), str(ranks), str(per_rank)],
            env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree)},
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if out.returncode != 0:
            raise SystemExit(f"callgrind failed in {tree}:\n{out.stderr[-2000:]}")
        steps: dict[str, int] = {}
        for part in sorted(Path(tmp).glob("cg.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1])):
            text = part.read_text(errors="replace")
            trigger = re.search(r"^desc: Trigger: (?:dump |Client Request: )?(\S+)", text, re.M)
            total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
            if trigger and total and trigger.group(1) in STEPS:
                steps[trigger.group(1)] = int(total.group(1))
    missing = [s for s in STEPS if s not in steps]
    if missing:
        raise SystemExit(f"no counters for {missing} in {tree}:\n{out.stderr[-2000:]}")
    return steps, int(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--spans-per-rank", type=int, default=6000)
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    results: dict[str, dict[str, int]] = {}
    spans = 0
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "cold.py"
        program.write_text(PROGRAM)
        for tree in args.trees:
            results[str(tree)], spans = instructions(tree.resolve(), program, args.ranks, args.spans_per_rank)
    names = list(results)
    print(f"{args.ranks} x {args.spans_per_rank}: {spans:,} spans; instructions per span")
    print(f"{'step':<16}" + "".join(f"{name[-28:]:>30}" for name in names) + ("   ratio" if len(names) > 1 else ""))
    for step in [*STEPS, "total"]:
        values = [sum(r.values()) if step == "total" else r[step] for r in results.values()]
        line = f"{step:<16}" + "".join(f"{v / spans:>30,.0f}" for v in values)
        if len(values) > 1:
            line += f"   {values[-1] / values[0]:.3f}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
