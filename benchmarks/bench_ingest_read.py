"""The store's side of a run, in one process (no HTTP): ingest (decode + pack as the decoder worker
does, then the store's write) and the read back as one span table (`Store.load_rows`, then the run
type: `run_from_rows`), for runs of 16 and 64 ranks x 6000 spans.

    .venv/bin/python benchmarks/bench_ingest_read.py [--ranks 16 64] [--repeat 3]

CPU seconds (`time.process_time`, steadier than wall time on a shared machine) and wall seconds of
the first read and of the best of the next `--repeat` - 1, and the process's RSS after each run.
Runs against another tree too (`cd /tmp/base && python /path/to/this/script`): only the API named
above is used.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from synth_runs import make_run, protobuf_batches  # noqa: E402

from starttrace.service.decoder import decode_packed  # noqa: E402
from starttrace.sources.otlp import PROTOBUF  # noqa: E402
from starttrace.sources.store import Store, run_from_rows  # noqa: E402


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for ranks in args.ranks:
        run = make_run(ranks=ranks, imports_per_rank=6000, run_id="bench", seed=42)
        bodies = protobuf_batches(run, 512)
        with tempfile.TemporaryDirectory() as tmp:
            st = Store(Path(tmp) / "s.db")
            t = time.process_time()
            batches = [decode_packed(b, PROTOBUF).batch for b in bodies]
            decode_s = time.process_time() - t
            t = time.process_time()
            for b in batches:
                st.ingest_now(b)
            write_s = time.process_time() - t
            del batches
            n = run.span_count
            print(
                f"{ranks} x 6000: {n:,} spans; decode+pack {n / decode_s:,.0f} spans/s CPU,"
                f" store write {n / write_s:,.0f} spans/s CPU"
            )
            times: list[tuple[float, float, float, float]] = []  # load_rows and run_from_rows: CPU, wall
            for _ in range(max(2, args.repeat)):
                w, c = time.perf_counter(), time.process_time()
                rows = st.load_rows("bench")
                w1, c1 = time.perf_counter(), time.process_time()
                the_run = run_from_rows(rows)  # type: ignore[arg-type]
                w2, c2 = time.perf_counter(), time.process_time()
                times.append((c1 - c, w1 - w, c2 - c1, w2 - w1))
                del rows
            # the first read (a store that reads alongside its writer answers it from memory), and
            # the best of the others (read back from the database)
            for label, (lc, lw, rc, rw) in (("first", times[0]), ("again", min(times[1:], key=lambda t: t[0] + t[2]))):
                print(
                    f"  {label:<6} load_rows {lc:.3f} s CPU {lw:.3f} s wall; run_from_rows {rc:.3f} s CPU {rw:.3f} s"
                    f" wall; read {lc + rc:.3f} s CPU {lw + rw:.3f} s wall"
                )
            table = getattr(the_run, "spans", None)
            size = f"table {table.height:,} rows, {table.estimated_size('mb'):.0f} MB; " if table is not None else ""
            print(f"  {size}RSS {_rss_mib():.0f} MiB")
            st.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
