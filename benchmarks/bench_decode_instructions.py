"""Instructions per span of OTLP decoding (`sources.otlp.decode`), source trees side by side.

    .venv/bin/python benchmarks/bench_decode_instructions.py TREE [TREE ...]
        # e.g. /tmp/base (`git archive <rev> | tar -x -C /tmp/base`) and .

Wall time on this shared 2-core machine swings by +-15 % and more; instruction counts do not.
For each tree, `valgrind --tool=callgrind` (Debian `valgrind`, PYTHONHASHSEED=0) runs one Python
process twice: once decoding `--bodies` protobuf requests of 512 spans (from `tests/synth_runs.py`,
two ranks, seed 42) after three warm-up decodes, once with the warm-up only. The difference divided
by the spans decoded is the cost of one span, request parsing included.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from synth_runs import make_run, protobuf_batches  # noqa: E402

PROGRAM = r"""
import pickle, sys
sys.path.insert(0, sys.argv[1])
from starttrace.sources import otlp
bodies = pickle.load(open(sys.argv[2], "rb"))
for body in bodies[:3]:
    otlp.decode(body)  # warm-up: imports, caches, first allocations
if sys.argv[3] == "1":
    for body in bodies:
        otlp.decode(body)
"""


def _spans_in(body: bytes) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    msg = ExportTraceServiceRequest.FromString(body)
    return sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)


def instructions(tree: Path, bodies: Path, program: Path, decode: bool) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", sys.executable, str(program),
             str(tree), str(bodies), "1" if decode else "0"],
            env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree)},
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    found = re.search(r"refs:\s*([\d,]+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise SystemExit(f"callgrind failed in {tree}:\n{out.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--bodies", type=int, default=20)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    run = make_run(ranks=2, imports_per_rank=6000, run_id="bench", seed=42)
    bodies = protobuf_batches(run, 512)[: args.bodies]
    spans = sum(_spans_in(body) for body in bodies)
    with tempfile.TemporaryDirectory() as tmp:
        body_file, program = Path(tmp) / "bodies.pkl", Path(tmp) / "decode.py"
        body_file.write_bytes(pickle.dumps(bodies))
        program.write_text(PROGRAM)
        print(f"{len(bodies)} requests, {spans:,} spans")
        for tree in args.trees:
            tree = tree.resolve()
            base = instructions(tree, body_file, program, decode=False)
            full = instructions(tree, body_file, program, decode=True)
            print(f"  {tree!s:40s} {(full - base) / spans:10,.0f} instructions per span")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
