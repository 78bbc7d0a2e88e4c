"""OTLP ingest alone, source trees side by side: spans/s until stored, and the service's CPU.

    .venv/bin/python benchmarks/bench_ingest_ab.py [--repeat 3] TREE [TREE ...]
        # e.g. /tmp/base (`git archive <rev> | tar -x -C /tmp/base`) and . : alternated per repetition

The same 16 ranks x 6000 spans (96,112 spans in 195 protobuf requests of 512 spans, 4 client
threads) as `bench_service.py`, through its `Server` and `ingest`, and nothing else: a quicker
A/B of an ingest change than the whole service benchmark. The CPU columns: the service process,
and its decoder worker process beside it (0 for a tree without one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_service


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--spans-per-rank", type=int, default=6000)
    args = parser.parse_args()
    run = bench_service.make_run(ranks=args.ranks, imports_per_rank=args.spans_per_rank, run_id="bench", seed=42)
    bodies = bench_service.protobuf_batches(run, 512)
    print(f"{run.span_count:,} spans in {len(bodies)} requests, 4 clients")
    for _ in range(args.repeat):
        for tree in args.trees:
            tmp = Path(tempfile.mkdtemp(prefix="st-ingest-ab-"))
            server = bench_service.Server(tree.resolve(), tmp / "ingest.db")
            time.sleep(1.0)  # the service's own start (and a decoder worker's) out of the way
            try:
                r = bench_service.ingest(server, bodies, run.span_count, 4)
            finally:
                server.stop()
                shutil.rmtree(tmp, ignore_errors=True)
            cpu = "?" if r["cpu_s"] is None else f"{r['cpu_s']:.2f} s"
            print(
                f"  {tree!s:<24} {r['spans_s']:>9,.0f} spans/s  stored in {r['stored_s']:.2f} s"
                f"  service CPU {cpu} (+ worker {r['worker_cpu_s']:.2f} s)  {r['statuses']}"
                f"  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
