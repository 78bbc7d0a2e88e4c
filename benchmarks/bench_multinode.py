"""What aligning the hosts' clocks costs a cold answer: the same 64 x 6000 spans on 8 nodes (clocks
off by up to 50 ms) and on one node, ingested into a Store, then each step of the answer timed in
CPU seconds (`time.process_time`), side by side in one run.

    .venv/bin/python benchmarks/bench_multinode.py [--nodes 8] [--ranks 64] [--spans-per-rank 6000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from synth_multinode import make_multinode_run  # noqa: E402
from synth_runs import make_run, protobuf_batches  # noqa: E402

from starttrace.analysis.clocks import correct_clocks  # noqa: E402
from starttrace.analysis.lanes import build_model  # noqa: E402
from starttrace.sources.otlp import parse_and_decode  # noqa: E402
from starttrace.sources.run_groups import RunGroups  # noqa: E402
from starttrace.sources.store import Store  # noqa: E402
from starttrace.views.startup_json import first_payload  # noqa: E402


def _cpu(f: Callable[[], Any]) -> tuple[float, Any]:
    start = time.process_time()
    result = f()
    return time.process_time() - start, result


def breakdown(nodes: int, ranks: int, spans_per_rank: int) -> dict[str, float]:
    if nodes > 1:
        synth = make_multinode_run(nodes, ranks // nodes, spans_per_rank, run_id="bench", seed=42)
    else:
        synth = make_run(ranks=ranks, imports_per_rank=spans_per_rank, run_id="bench", seed=42)
    with tempfile.TemporaryDirectory(prefix="st-bench-mn-") as tmp:
        store = Store(Path(tmp) / "bench.db")
        for body in protobuf_batches(synth, 512):
            store.ingest_now(parse_and_decode(body, "application/x-protobuf").batch)
        out: dict[str, float] = {"spans": synth.span_count}
        out["which runs to join"], _ = _cpu(lambda: RunGroups(store).version("bench"))
        out["store rows -> run type"], run = _cpu(lambda: store.load_run("bench"))
        out["correct_clocks (in place)"], run = _cpu(lambda: correct_clocks(run, owned=True))
        out["build_model"], model = _cpu(lambda: build_model(run))
        out["the first answer"], _ = _cpu(lambda: first_payload(model))
        store.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--spans-per-rank", type=int, default=6000)
    args = ap.parse_args()
    columns = {
        f"{args.nodes} nodes": breakdown(args.nodes, args.ranks, args.spans_per_rank),
        "1 node": breakdown(1, args.ranks, args.spans_per_rank),
    }
    print(f"{args.ranks} ranks x {args.spans_per_rank} spans, CPU s; load average {os.getloadavg()[0]:.1f}")
    print("| step | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for key in next(iter(columns.values())):
        cells = [f"{c[key]:,.0f}" if key == "spans" else f"{c[key]:.2f}" for c in columns.values()]
        print(f"| {key} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
