"""Service benchmark: OTLP ingest throughput over real HTTP (protobuf) and warm `/startup` JSON
latency for a 16-rank x 6000-span run.

    .venv/bin/python benchmarks/bench_service.py [--ranks 16] [--spans-per-rank 6000] [--clients 4]

Starts `python -m starttrace.service.server` on a free loopback port with a fresh SQLite file,
posts pre-serialized protobuf requests (512 spans each, like the OpenTelemetry SDK's batches)
from several client threads, waits until every span is stored, then times GET /startup/{run}.
Targets: >= 50k spans/s ingest, <= 300 ms warm /startup.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from synth_runs import make_run, protobuf_batches  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float | None:
    """user + system CPU seconds of a process (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--spans-per-rank", type=int, default=6000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="st-bench-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("STARTTRACE", None)
    env.pop("STARTTRACE_TOKEN", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "starttrace.service.server", "--port", str(port), "--db", str(tmp / "bench.db")],
        env=env,
    )
    try:
        deadline = time.time() + 30
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise SystemExit("server did not start")
            time.sleep(0.1)

        run = make_run(ranks=args.ranks, imports_per_rank=args.spans_per_rank, run_id="bench", seed=42)
        bodies = protobuf_batches(run, args.batch)
        total = run.span_count
        print(
            f"run: {args.ranks} ranks, {total} spans, {len(bodies)} requests of <= {args.batch} spans, "
            f"{sum(map(len, bodies)) / 1e6:.1f} MB protobuf"
        )

        queue = list(enumerate(bodies))
        lock = threading.Lock()
        statuses: dict[int, int] = {}

        def client() -> None:
            with httpx.Client(base_url=url, headers={"Content-Type": "application/x-protobuf"}, timeout=60) as c:
                while True:
                    with lock:
                        if not queue:
                            return
                        _, body = queue.pop()
                    while True:
                        r = c.post("/v1/traces", content=body)
                        with lock:
                            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                        if r.status_code != 429:
                            break
                        time.sleep(float(r.headers.get("Retry-After", "1")))

        cpu0 = cpu_seconds(server.pid)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t_sent = time.perf_counter() - t0
        while True:
            runs = httpx.get(url + "/runs").json()["runs"]
            if runs and runs[0]["spans"] == total:
                break
            time.sleep(0.1)
        t_stored = time.perf_counter() - t0
        cpu1 = cpu_seconds(server.pid)
        print(
            f"ingest: all requests answered in {t_sent:.2f} s, all spans stored in {t_stored:.2f} s "
            f"-> {total / t_stored:,.0f} spans/s (statuses {statuses})"
        )
        if cpu0 is not None and cpu1 is not None:
            # the CPU the server spent (all threads): a steadier measure than wall time on a shared machine
            cpu = max(cpu1 - cpu0, 1e-9)
            print(f"server CPU during ingest: {cpu:.2f} s ({total / cpu:,.0f} spans per CPU-second)")

        with httpx.Client(base_url=url, timeout=120) as c:
            t = time.perf_counter()
            r = c.get("/startup/bench")
            cold = time.perf_counter() - t
            assert r.status_code == 200
            size = len(r.content)
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                r = c.get("/startup/bench")
                times.append(time.perf_counter() - t)
                assert r.status_code == 200
            t = time.perf_counter()
            h = c.get("/startup/bench", headers={"Accept": "text/html"})
            html_s = time.perf_counter() - t
            t = time.perf_counter()
            m = c.get("/metrics")
            metrics_s = time.perf_counter() - t
        print(
            f"/startup JSON ({size / 1e6:.1f} MB): cold {cold * 1000:.0f} ms, warm median "
            f"{statistics.median(times) * 1000:.1f} ms, p95 {sorted(times)[int(len(times) * 0.95) - 1] * 1000:.1f} ms"
        )
        print(
            f"/startup HTML (warm model): {html_s * 1000:.0f} ms ({h.status_code}); "
            f"/metrics: {metrics_s * 1000:.0f} ms ({m.status_code})"
        )
        ok_ingest = total / t_stored >= 50_000
        ok_latency = statistics.median(times) <= 0.3
        print(
            f"targets: ingest >= 50k spans/s: {'OK' if ok_ingest else 'MISSED'}; "
            f"warm /startup <= 300 ms: {'OK' if ok_latency else 'MISSED'}"
        )
        return 0 if ok_ingest and ok_latency else 1
    finally:
        os.kill(server.pid, signal.SIGTERM)
        server.wait(20)


if __name__ == "__main__":
    raise SystemExit(main())
