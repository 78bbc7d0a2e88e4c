"""The first answer right after a bulk ingest, source trees side by side, alternated per repetition.

    .venv/bin/python benchmarks/ab_first_answer.py [--repeat 4] [--ranks 64] [--nodes 8] [--shared-modules]
        [--at ack,0,0.35,0.6] TREE [TREE ...]
        # e.g. /tmp/base (`git archive <rev> | tar -x -C /tmp/base`, its C cores built) and .

The moment of the question (`--at`, one measurement per moment and turn): `stored` (the default,
what this benchmark always measured: `/runs` polled until it counts every span, then asked at
once), a number of seconds after that moment (the service's background work for the run that just
ended is running then: the model's prebuild starts 0.3 s after the last write, its save follows,
the store's idle checkpoint comes 0.5 s after the last write), or `ack` (asked the moment the last
OTLP request is answered 200, i.e. committed, without polling). The moment a user sees is the worst
of these: the table gives each moment's median and the worst median. `--previous`: a run of the
same shape (`previous`) is ingested just before, so that the background work for the run that just
ended (its prebuild, its save, the checkpoint) runs while the run asked for is stored and opened;
it started an hour before the asked run (a run overlapping it in time, naming the same
rendezvous, would be joined with it: sources/run_groups.py).

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
import threading
import time
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


def send_all(server: bench_service.Server, bodies: list[bytes], clients: int = 4) -> float:
    """Every body sent and answered 200 (each one committed); spans/s until then."""
    queue = list(bodies)
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=server.url, headers={"Content-Type": "application/x-protobuf"}, timeout=120) as c:
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                while (r := c.post("/v1/traces", content=body)).status_code in (429, 503):
                    time.sleep(float(r.headers.get("Retry-After", "1")))
                assert r.status_code == 200, r.status_code

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def runs(server: bench_service.Server) -> list[dict[str, Any]]:
    return list(httpx.get(server.url + "/runs", timeout=120).json()["runs"])


def measure(
    tree: Path, bodies: list[bytes], total: int, at: str = "stored", previous: list[bytes] | None = None
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="st-first-ab-"))
    server = bench_service.Server(tree, tmp / "first.db")
    try:
        if previous:
            send_all(server, previous)  # a run that just ended: its background work starts now
        t0 = time.perf_counter()
        send_all(server, bodies)
        if at != "ack":  # /runs polled until it counts every span of the run (bench_service.ingest)
            while not any(r["run_id"] == "bench" and r["spans"] == total for r in runs(server)):
                time.sleep(0.05)
        ingest = {"spans_s": total / (time.perf_counter() - t0)}
        if at not in ("ack", "stored"):
            time.sleep(float(at))
        before = proc_counters(server.proc.pid)
        with httpx.Client(base_url=server.url, timeout=300) as client:
            seconds, response = bench_service.timed(client, "/startup/bench")
        after = proc_counters(server.proc.pid)
        rss, peak = proc_memory(server.proc.pid)
        assert response.status_code == 200, response.status_code
        assert response.json()["run_id"] == "bench"
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
    parser.add_argument("--at", default="stored", help="moments, comma-separated: stored, ack, or seconds after stored")
    parser.add_argument("--previous", action="store_true", help="another run of the same shape ingested just before")
    args = parser.parse_args()
    moments = [m.strip() for m in args.at.split(",") if m.strip()]
    variants = [(str(tree), tree.resolve()) for tree in args.trees]
    run = bench_service.make_multinode_run(
        args.nodes, args.ranks // args.nodes, args.spans_per_rank, run_id="bench", seed=42,
        shared_modules=args.shared_modules,
    )  # fmt: skip
    bodies = bench_service.protobuf_batches(run, 512)
    previous = None
    if args.previous:
        before = bench_service.make_multinode_run(
            args.nodes, args.ranks // args.nodes, args.spans_per_rank, run_id="previous", seed=43,
            shared_modules=args.shared_modules, t0=1_800_000_000_000_000_000 - 3600 * 10**9,  # not joined
        )  # fmt: skip
        previous = bench_service.protobuf_batches(before, 512)
    print(f"{run.span_count:,} spans ({args.ranks} ranks on {args.nodes} nodes), {len(bodies)} requests, 4 clients")
    results: dict[tuple[str, str], list[dict[str, Any]]] = {(n, m): [] for n, _ in variants for m in moments}
    for turn in range(args.repeat):
        for moment in moments:
            for name, tree in variants:
                got = measure(tree, bodies, run.span_count, moment, previous)
                results[(name, moment)].append(got)
                print(
                    f"  {turn + 1}. {name} at {moment}: first {got['first_s']:.2f} s (user {got['user_s']:.2f}, "
                    f"system {got['sys_s']:.2f}, {got['faults']:,} faults); ingest {got['ingest']:,.0f} spans/s; "
                    f"RSS {got['rss_mib']:.0f} MiB (peak {got['peak_mib']:.0f})",
                    flush=True,
                )
    print(
        "\n| tree | asked at | first answer, median (range) | user s | system s | page faults | ingest spans/s "
        "| RSS MiB | peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    medians: dict[tuple[str, str], dict[str, float]] = {}
    for (name, moment), rows in results.items():
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        medians[(name, moment)] = med
        lo, hi = min(r["first_s"] for r in rows), max(r["first_s"] for r in rows)
        print(
            f"| {name} | {moment} | {med['first_s']:.2f} s ({lo:.2f}-{hi:.2f}) | {med['user_s']:.2f} "
            f"| {med['sys_s']:.2f} | {med['faults']:,.0f} | {med['ingest']:,.0f} | {med['rss_mib']:.0f} "
            f"| {med['peak_mib']:.0f} |"
        )
    worst = {name: max(medians[(name, m)]["first_s"] for m in moments) for name, _ in variants}
    for name, seconds in worst.items():
        print(f"{name}: the moment a user sees (worst median over {', '.join(moments)}): {seconds:.2f} s")
    first = variants[0][0]
    for name, _ in variants[1:]:
        print(f"{first} / {name}: worst first answer {worst[first] / worst[name]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
