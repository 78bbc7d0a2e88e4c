"""The steps of a cold first answer, in process CPU seconds: a synthetic run ingested over the
OTLP decoder into a fresh store, then read back, clock-aligned, modelled and rendered, step by step.

    .venv/bin/python benchmarks/bench_model_steps.py [--ranks 64] [--nodes 8] [--spans-per-rank 6000] [--repeat 3]

CPU seconds (`time.process_time`: every thread of the process, page faults included) rather than
wall time: these machines are shared, and polars' threads make wall time depend on the other load.
Prints the minimum over the repetitions per step (the run is read back from the database each time).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from synth_multinode import make_multinode_run  # noqa: E402
from synth_runs import protobuf_batches  # noqa: E402

from starttrace.analysis.clocks import correct_clocks  # noqa: E402
from starttrace.analysis.lanes import build_model  # noqa: E402
from starttrace.service.decoder import decode_packed  # noqa: E402
from starttrace.sources.store import Store  # noqa: E402
from starttrace.views.startup_json import first_payload  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--spans-per-rank", type=int, default=6000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    nodes = max(1, min(args.nodes, args.ranks))
    run = make_multinode_run(nodes, args.ranks // nodes, args.spans_per_rank, run_id="bench", seed=42)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "steps.db"))
        for body in protobuf_batches(run, 512):
            store.ingest_now(decode_packed(body, "application/x-protobuf").batch)
        steps: dict[str, list[float]] = {}
        size = 0
        for _ in range(args.repeat):
            t = time.process_time()
            loaded = store.load_run("bench")
            assert loaded is not None
            t1 = time.process_time()
            aligned = correct_clocks(loaded, owned=True)
            t2 = time.process_time()
            model = build_model(aligned)
            t3 = time.process_time()
            size = len(json.dumps(first_payload(model)))
            t4 = time.process_time()
            for name, seconds in (
                ("Store.load_run", t1 - t), ("correct_clocks", t2 - t1), ("build_model", t3 - t2),
                ("first_payload + JSON", t4 - t3), ("the cold path", t4 - t),
            ):  # fmt: skip
                steps.setdefault(name, []).append(seconds)
        store.close()
    print(f"{run.span_count:,} spans ({args.ranks} ranks on {nodes} nodes); first answer {size / 1e6:.2f} MB")
    print("| step | CPU s, min (max) |\n|---|---|")
    for name, values in steps.items():
        print(f"| {name} | {min(values):.2f} ({max(values):.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
