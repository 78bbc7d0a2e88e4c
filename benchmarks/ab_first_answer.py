"""The first answer right after a bulk ingest, source trees side by side, alternated per repetition.

    .venv/bin/python benchmarks/ab_first_answer.py [--repeat 4] [--ranks 64] [--nodes 8] [--shared-modules]
        TREE [TREE ...]
        # e.g. /tmp/base (`git archive <rev> | tar -x -C /tmp/base`, its C cores built) and .

What `bench_service.py` measures as "first GET /startup/{run} right after ingest", alone, several
times: a fresh service per measurement (its `Server`), the 64 x 6000 run on 8 nodes
(`tests/synth_multinode.py`; `--shared-modules`: every rank imports the same modules, as real
ranks do) ingested as there, then one `GET /startup/bench`. Besides the wall
time it prints what the service process spent until that answer, from /proc: user and system CPU
seconds and minor page faults, and its memory: resident set after the answer (VmRSS) and its peak
(VmHWM) in MiB. One measurement swings
by +-25 % on this VM: the build touches hundreds of MB of new memory, and what a page fault costs
depends on whether the host still backs the page the kernel hands out (docs/benchmarks.md, "The
service"). So the trees take turns and the medians are compared.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_service


def proc_counters(pid: int) -> tuple[float, float, int]:
    """user s, system s, minor faults of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7])


def proc_memory(pid: int) -> tuple[float, float]:
    """VmRSS and VmHWM of a process, MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def measure(tree: Path, bodies: list[bytes], total: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="st-first-ab-"))
    server = bench_service.Server(tree, tmp / "first.db")
    try:
        ingest = bench_service.ingest(server, bodies, total, clients=4)
        before = proc_counters(server.proc.pid)
        with httpx.Client(base_url=server.url, timeout=300) as client:
            seconds, response = bench_service.timed(client, "/startup/bench")
        after = proc_counters(server.proc.pid)
        rss, peak = proc_memory(server.proc.pid)
        assert response.status_code == 200, response.status_code
        return {
            "first_s": seconds,
            "user_s": after[0] - before[0],
            "sys_s": after[1] - before[1],
            "faults": after[2] - before[2],
            "ingest": ingest["spans_s"],
            "rss_mib": rss,
            "peak_mib": peak,
        }
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--spans-per-rank", type=int, default=6000)
    parser.add_argument("--shared-modules", action="store_true")
    args = parser.parse_args()
    variants = [(str(tree), tree.resolve()) for tree in args.trees]
    run = bench_service.make_multinode_run(
        args.nodes, args.ranks // args.nodes, args.spans_per_rank, run_id="bench", seed=42,
        shared_modules=args.shared_modules,
    )  # fmt: skip
    bodies = bench_service.protobuf_batches(run, 512)
    print(f"{run.span_count:,} spans ({args.ranks} ranks on {args.nodes} nodes), {len(bodies)} requests, 4 clients")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    for turn in range(args.repeat):
        for name, tree in variants:
            got = measure(tree, bodies, run.span_count)
            results[name].append(got)
            print(
                f"  {turn + 1}. {name}: first {got['first_s']:.2f} s (user {got['user_s']:.2f}, system "
                f"{got['sys_s']:.2f}, {got['faults']:,} faults); "
                f"ingest {got['ingest']:,.0f} spans/s; RSS {got['rss_mib']:.0f} MiB (peak {got['peak_mib']:.0f})",
                flush=True,
            )
    print(
        "\n| tree | first answer, median (range) | user s | system s | page faults | ingest spans/s "
        "| RSS MiB | peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    medians = {}
    for name, rows in results.items():
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        medians[name] = med
        lo, hi = min(r["first_s"] for r in rows), max(r["first_s"] for r in rows)
        print(
            f"| {name} | {med['first_s']:.2f} s ({lo:.2f}-{hi:.2f}) | {med['user_s']:.2f} | {med['sys_s']:.2f} "
            f"| {med['faults']:,.0f} | {med['ingest']:,.0f} | {med['rss_mib']:.0f} | {med['peak_mib']:.0f} |"
        )
    first = variants[0][0]
    for name in list(results)[1:]:
        print(f"{first} / {name}: first answer {medians[first]['first_s'] / medians[name]['first_s']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
