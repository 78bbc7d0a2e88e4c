"""Service benchmark: OTLP ingest throughput over real HTTP (protobuf) and the page's answers for a
16-rank x 6000-span run (and optionally a 64 x 6000 one), side by side with another source tree.

    .venv/bin/python benchmarks/bench_service.py [--ranks 16] [--spans-per-rank 6000] [--clients 4]
        [--large-ranks 64] [--nodes 8 [--shared-modules]] [--baseline /tmp/base [--large-baseline]]
        # /tmp/base: `git archive HEAD | tar -x -C /tmp/base`; --large-baseline: the large run there too

`--nodes 8` makes the large run a multi-node one: 8 hosts x 8 ranks, each host's clock off by up to
50 ms, pids repeating across hosts (tests/synth_multinode.py); the service aligns the clocks and
groups the lanes by node in every answer (docs/multinode.md). Each rank imports a tree of modules
of its own there (`r<rank>.…`: no module shared by two ranks, so the import hotspots hold 384k
modules and the preload findings have no candidate); `--shared-modules` gives every rank the same
tree (`pkg.…`), as real ranks have, and the preload findings their full walk.

For each tree (this one, and the `--baseline` tree when given) it starts
`python -m starttrace.service.server` from that tree on a free loopback port with a fresh SQLite
file, posts pre-serialized protobuf requests (512 spans each, like the OpenTelemetry SDK's
batches) from several client threads, waits until every span is stored, then times:

- `first`: the first `GET /startup/{run}` right after the last span is stored (the service may
  still be building the model then: it builds it as soon as ingest goes idle, and this request
  waits for that build);
- `prebuilt`: on a second fresh server, how long after the last span is stored the service has
  built the model and the first answer by itself (`/healthz` `models_pending` 0), and the first
  `GET /startup/{run}` after that;
- `warm`: the same request again (median and p95 of `--repeat`);
- `html`: the page itself (first and warm), `/metrics`;
- `lane` / `window`: one lane's spans, and one lane's spans in a zoom window (this tree only);
- `restart`: the service stopped and started on the same database, then the first JSON answer
  and the first HTML page (what a user opening the page later gets).

Targets (this tree): ingest >= 100k spans/s; first answer <= 1 s cold, <= 100 ms warm, <= 2 MB;
HTML <= 1 s; 64 x 6000: first answer <= 3 s cold. Wall times on a shared machine vary: the server
CPU seconds during ingest and until the first answer are printed too; with `--baseline`, a ratio column.
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
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from synth_multinode import make_multinode_run  # noqa: E402
from synth_runs import make_run, protobuf_batches  # noqa: E402

HTML = {"Accept": "text/html"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process's children (the service's decoder worker; not the spawn
    resource tracker), 0 when it has none or they cannot be read."""
    import psutil

    total = 0.0
    try:
        for child in psutil.Process(pid).children():
            if "resource_tracker" not in " ".join(child.cmdline()):
                times = child.cpu_times()
                total += times.user + times.system
    except psutil.Error:
        pass
    return total


def cpu_seconds(pid: int) -> float | None:
    """user + system CPU seconds of a process (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Server:
    def __init__(self, tree: Path, db: Path) -> None:
        self.tree, self.db = tree, db
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=str(tree))
        for key in ("STARTTRACE", "VLLM_STARTTRACE", "STARTTRACE_TOKEN"):
            env.pop(key, None)
        command = [sys.executable, "-m", "starttrace.service.server", "--port", str(self.port), "--db", str(db)]
        self.proc = subprocess.Popen(command, env=env, cwd=str(tree))
        deadline = time.time() + 60
        while True:
            try:
                health = httpx.get(self.url + "/healthz", timeout=1)
                # ready, and its decoder worker too (a service is up before a startup is traced)
                if health.status_code == 200 and health.json().get("decoder", "off") != "starting":
                    return
            except httpx.HTTPError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"server from {tree} did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)


def ingest(server: Server, bodies: list[bytes], total: int, clients: int) -> dict[str, Any]:
    queue = list(bodies)
    lock = threading.Lock()
    statuses: dict[int, int] = {}

    def client() -> None:
        with httpx.Client(base_url=server.url, headers={"Content-Type": "application/x-protobuf"}, timeout=120) as c:
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                while True:
                    r = c.post("/v1/traces", content=body)
                    with lock:
                        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    if r.status_code != 429:
                        break
                    time.sleep(float(r.headers.get("Retry-After", "1")))

    cpu0 = cpu_seconds(server.proc.pid)
    worker0 = worker_cpu_seconds(server.proc.pid)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sent = time.perf_counter() - t0
    while True:
        runs = httpx.get(server.url + "/runs", timeout=120).json()["runs"]
        if runs and runs[0]["spans"] == total:
            break
        time.sleep(0.05)
    stored = time.perf_counter() - t0
    cpu1 = cpu_seconds(server.proc.pid)
    cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    worker = worker_cpu_seconds(server.proc.pid) - worker0
    return {
        "spans_s": total / stored, "stored_s": stored, "sent_s": sent, "cpu_s": cpu, "worker_cpu_s": worker,
        "statuses": statuses,
    }  # fmt: skip


def prebuilt_after(server: Server, timeout: float = 300) -> float | None:
    """Seconds until the service has built the run's model and first answer by itself
    (`/healthz` models_pending back to 0); None: a service without prebuilding."""
    t0 = time.perf_counter()
    time.sleep(0.05)
    while time.perf_counter() - t0 < timeout:
        health = httpx.get(server.url + "/healthz", timeout=60).json()
        if "models_pending" not in health:
            return None
        if health["models_pending"] == 0:
            return time.perf_counter() - t0
        time.sleep(0.05)
    return None


def timed(c: httpx.Client, path: str, headers: dict[str, str] | None = None) -> tuple[float, httpx.Response]:
    t = time.perf_counter()
    r = c.get(path, headers=headers)
    return time.perf_counter() - t, r


def page(server: Server, run_id: str, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with httpx.Client(base_url=server.url, timeout=300) as c:
        cpu0 = cpu_seconds(server.proc.pid)
        out["first_s"], r = timed(c, f"/startup/{run_id}")
        cpu1 = cpu_seconds(server.proc.pid)
        out["first_cpu_s"] = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        assert r.status_code == 200, r.status_code
        out["first_mb"] = len(r.content) / 1e6
        doc = r.json()
        lane = next((i for i, ln in enumerate(doc["lanes"]) if ln.get("role") == "worker"), 0)
        warm = []
        for _ in range(repeat):
            s, r = timed(c, f"/startup/{run_id}")
            assert r.status_code == 200
            warm.append(s)
        out["warm_ms"] = statistics.median(warm) * 1000
        out["warm_p95_ms"] = sorted(warm)[max(0, int(len(warm) * 0.95) - 1)] * 1000
        out["html_s"], r = timed(c, f"/startup/{run_id}", HTML)
        assert r.status_code == 200
        out["html_warm_s"], _ = timed(c, f"/startup/{run_id}", HTML)
        out["metrics_s"], _ = timed(c, "/metrics")
        s, r = timed(c, f"/startup/{run_id}/lanes/{lane}/spans")
        if r.status_code == 200:
            out["lane_s"], out["lane_spans"] = s, len(r.json()["spans"])
            span_us = int(doc["duration_s"] * 1e6)
            window = f"start_us={span_us // 2}&end_us={span_us // 2 + span_us // 20}&min_us={span_us // 20 // 1400}"
            out["window_s"], r = timed(c, f"/startup/{run_id}/lanes/{lane}/spans?{window}")
            out["window_spans"] = len(r.json()["spans"])
    return out


def restart(server: Server, run_id: str) -> tuple[Server, dict[str, Any]]:
    server.stop()
    again = Server(server.tree, server.db)
    out: dict[str, Any] = {}
    with httpx.Client(base_url=again.url, timeout=300) as c:
        out["restart_first_s"], r = timed(c, f"/startup/{run_id}")
        assert r.status_code == 200
        out["restart_first_mb"] = len(r.content) / 1e6
        out["restart_html_s"], r = timed(c, f"/startup/{run_id}", HTML)
        assert r.status_code == 200
    return again, out


def measure(
    tree: Path,
    ranks: int,
    spans_per_rank: int,
    clients: int,
    batch: int,
    repeat: int,
    nodes: int = 1,
    shared_modules: bool = False,
) -> dict[str, Any]:
    if nodes > 1:  # `--nodes`: the ranks on that many hosts, each with a skewed clock (tests/synth_multinode.py)
        run = make_multinode_run(
            nodes, ranks // nodes, spans_per_rank, run_id="bench", seed=42, shared_modules=shared_modules
        )
    else:
        run = make_run(ranks=ranks, imports_per_rank=spans_per_rank, run_id="bench", seed=42)
    bodies = protobuf_batches(run, batch)
    tmp = Path(tempfile.mkdtemp(prefix="st-bench-"))
    server = Server(tree, tmp / "bench.db")
    try:
        result = {"spans": run.span_count, "requests": len(bodies), "mb": sum(map(len, bodies)) / 1e6}
        result.update(ingest(server, bodies, run.span_count, clients))
        result.update(page(server, "bench", repeat))
        # the same once more on a fresh server, now waiting for the service's own build first
        second = Server(tree, tmp / "bench2.db")
        try:
            ingest(second, bodies, run.span_count, clients)
            result["prebuilt_s"] = prebuilt_after(second)
            with httpx.Client(base_url=second.url, timeout=300) as c:
                result["first_prebuilt_s"], _ = timed(c, "/startup/bench")
        finally:
            second.stop()
        server, after = restart(server, "bench")
        result.update(after)
        return result
    finally:
        server.stop()
        for path in tmp.iterdir():
            path.unlink()
        tmp.rmdir()


# run inside each tree (PYTHONPATH=tree): CPU seconds of each step of a cold answer, in-process
BREAKDOWN = r"""
import json, sys, tempfile, time, os
sys.path.insert(1, sys.argv[1])
from synth_runs import make_run, protobuf_batches
from starttrace.sources.otlp import parse_and_decode
from starttrace.sources import store as S
from starttrace.analysis.lanes import build_model
run = make_run(ranks=int(sys.argv[2]), imports_per_rank=int(sys.argv[3]), run_id="bench", seed=42)
path = os.path.join(tempfile.mkdtemp(), "b.db")
st = S.Store(path)
for body in protobuf_batches(run, 4096):
    st.ingest_now(parse_and_decode(body, "application/x-protobuf").batch)
st.close()
st = S.Store(path)  # the run read back from the file (as after a restart), not the writer's live reader
out = {}
def step(name, f):
    c = time.process_time(); v = f(); out[name] = time.process_time() - c; return v
import gc
gc.disable()  # as the service loads and builds (starttrace.run.gc_paused)
rows = step("load_cpu_s", lambda: st.load_rows("bench"))
the_run = step("run_cpu_s", lambda: S.run_from_rows(rows))
model = step("model_cpu_s", lambda: build_model(the_run))
try:
    from starttrace.views.startup_json import first_payload as answer
except ImportError:
    from starttrace.views.json import to_json as answer
step("answer_cpu_s", lambda: json.dumps(answer(model), separators=(",", ":"), default=str))
print(json.dumps(out))
"""


def cold_breakdown(tree: Path, ranks: int, spans_per_rank: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", BREAKDOWN, str(ROOT / "tests"), str(ranks), str(spans_per_rank)],
        env=env, capture_output=True, text=True, timeout=900, cwd=str(tree),
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"breakdown in {tree} failed:\n{out.stderr}")
    import json

    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


ROWS = [
    ("spans_s", "ingest, protobuf over HTTP, until all stored (spans/s)", "{:,.0f}"),
    ("cpu_s", "server CPU during ingest (s)", "{:.2f}"),
    ("worker_cpu_s", "its decoder worker's CPU during ingest (s)", "{:.2f}"),
    ("first_s", "first GET /startup/{run} right after ingest (s)", "{:.2f}"),
    ("first_cpu_s", "server CPU until that answer (s)", "{:.2f}"),
    ("prebuilt_s", "the service's own build done, after the last span stored (s)", "{:.2f}"),
    ("first_prebuilt_s", "first GET /startup/{run} once that is done (s)", "{:.3f}"),
    ("first_mb", "its size (MB)", "{:.2f}"),
    ("warm_ms", "warm, median (ms)", "{:.1f}"),
    ("warm_p95_ms", "warm, p95 (ms)", "{:.1f}"),
    ("html_s", "page HTML, first (s)", "{:.2f}"),
    ("html_warm_s", "page HTML, again (s)", "{:.3f}"),
    ("lane_s", "one lane's spans, whole (s)", "{:.3f}"),
    ("window_s", "one lane, a zoom window (s)", "{:.3f}"),
    ("metrics_s", "/metrics (s)", "{:.3f}"),
    ("restart_first_s", "after a restart: first JSON answer (s)", "{:.3f}"),
    ("restart_html_s", "after a restart: first HTML page (s)", "{:.3f}"),
    ("load_cpu_s", "cold, in-process CPU: store rows (s)", "{:.2f}"),
    ("run_cpu_s", "cold, in-process CPU: rows -> run type (s)", "{:.2f}"),
    ("model_cpu_s", "cold, in-process CPU: build_model (s)", "{:.2f}"),
    ("answer_cpu_s", "cold, in-process CPU: the JSON answer (s)", "{:.2f}"),
]


def table(title: str, columns: dict[str, dict[str, Any]]) -> None:
    """A markdown table, one column per tree; with two trees also their ratio (this / baseline)."""
    print(f"\n{title}")
    names = list(columns)
    ratio = len(columns) == 2
    print(f"| measure | {' | '.join(names)} |" + (" ratio |" if ratio else ""))
    print("|---|" + "---|" * (len(names) + ratio))
    for key, label, fmt in ROWS:
        values = [col.get(key) for col in columns.values()]
        cells = [fmt.format(v) if v is not None else "-" for v in values]
        if ratio:
            a, b = values
            cells.append(f"{b / a:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else "-")
        print(f"| {label} | {' | '.join(cells)} |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--spans-per-rank", type=int, default=6000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--large-ranks", type=int, default=0, help="also this many ranks (64: this tree only)")
    ap.add_argument("--nodes", type=int, default=1, help="the large run on this many nodes (8: 8 x 8 ranks)")
    ap.add_argument("--shared-modules", action="store_true", help="the large run's ranks import the same modules")
    ap.add_argument("--baseline", type=Path, help="another source tree, measured side by side")
    ap.add_argument("--large-baseline", action="store_true", help="the large run for the --baseline tree too")
    args = ap.parse_args()
    trees = {"this tree": ROOT}
    if args.baseline is not None:
        trees = {f"baseline ({args.baseline})": args.baseline, **trees}
    results: dict[str, dict[str, Any]] = {}
    for name, tree in trees.items():  # alternate the trees' order with --baseline to see drift
        results[name] = measure(tree, args.ranks, args.spans_per_rank, args.clients, args.batch, args.repeat)
        results[name].update(cold_breakdown(tree, args.ranks, args.spans_per_rank))
    sample = next(iter(results.values()))
    table(
        f"{args.ranks} ranks x {args.spans_per_rank} spans: {sample['spans']:,} spans, {sample['requests']} requests,"
        f" {sample['mb']:.1f} MB protobuf, load average {os.getloadavg()[0]:.1f}",
        results,
    )
    ours = results["this tree"]
    checks = {
        "ingest >= 100k spans/s": ours["spans_s"] >= 100_000,
        "first answer <= 1 s (right after ingest, waiting for the build)": ours["first_s"] <= 1.0,
        "first answer <= 1 s (once the service built it)": ours["first_prebuilt_s"] <= 1.0,
        "first answer <= 1 s (after a restart: nothing in memory)": ours["restart_first_s"] <= 1.0,
        "warm <= 100 ms": ours["warm_ms"] <= 100,
        "first answer <= 2 MB": ours["first_mb"] <= 2.0,
        "HTML <= 1 s": max(ours["html_s"], ours["restart_html_s"]) <= 1.0,
    }
    if args.large_ranks:
        large_trees = trees if args.large_baseline else {"this tree": ROOT}
        shape = (args.large_ranks, args.spans_per_rank, args.clients, args.batch, 5, args.nodes, args.shared_modules)
        large = {name: measure(tree, *shape) for name, tree in large_trees.items()}
        mine = large["this tree"]
        where = f" on {args.nodes} nodes (clocks aligned)" if args.nodes > 1 else ""
        where += ", every rank importing the same modules" if args.shared_modules and args.nodes > 1 else ""
        table(f"{args.large_ranks} ranks{where} x {args.spans_per_rank} spans: {mine['spans']:,} spans", large)
        checks[f"{args.large_ranks} x {args.spans_per_rank}: first answer <= 3 s (after ingest)"] = mine["first_s"] <= 3
        checks[f"{args.large_ranks} x {args.spans_per_rank}: first answer <= 3 s (after a restart)"] = (
            mine["restart_first_s"] <= 3
        )
    print()
    for text, ok in checks.items():
        print(f"target {text}: {'OK' if ok else 'MISSED'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
