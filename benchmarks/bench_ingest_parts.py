"""Ingest's two halves alone, in one process (no HTTP, no threads): OTLP protobuf decoding of a
16 x 6000-span run's requests, pickling the decoded batches (what handing them to another process
would cost), and the store writing them.

    .venv/bin/python benchmarks/bench_ingest_parts.py

What `bench_service.py` measures over HTTP is both halves on one interpreter plus the HTTP server;
this says how far a decode process beside the writer could take it (docs/benchmarks.md).
"""

import pickle
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from synth_runs import make_run, protobuf_batches  # noqa: E402

from starttrace.sources.otlp import decode  # noqa: E402
from starttrace.sources.store import Store  # noqa: E402


def main() -> None:
    bodies = protobuf_batches(make_run(ranks=16, imports_per_rank=6000, run_id="bench"))
    t = time.process_time()
    decoded = [decode(b) for b in bodies]
    decode_s = time.process_time() - t
    spans = sum(d.accepted for d in decoded)
    print(f"{spans:,} spans in {len(bodies)} requests")
    print(f"decode: {decode_s:.3f} s CPU -> {spans / decode_s:,.0f} spans/s")
    t = time.process_time()
    pickled = [pickle.dumps(d.batch, protocol=5) for d in decoded]
    dumps_s = time.process_time() - t
    t = time.process_time()
    for p in pickled:
        pickle.loads(p)
    loads_s = time.process_time() - t
    print(f"pickle: dumps {dumps_s:.3f} s, loads {loads_s:.3f} s, {sum(map(len, pickled)) / 1e6:.1f} MB")
    with tempfile.TemporaryDirectory() as work:
        store = Store(Path(work) / "s.db")
        t, t0 = time.process_time(), time.perf_counter()
        for d in decoded:
            store.ingest_now(d.batch)
        wall = time.perf_counter() - t0
        print(f"store: {time.process_time() - t:.3f} s CPU, {wall:.3f} s wall -> {spans / wall:,.0f} spans/s")
        store.close()


if __name__ == "__main__":
    main()
