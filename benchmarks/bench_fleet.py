"""Fleet queries on ClickHouse's engine (chdb): N runs in `otel_traces`, as the Collector's
exporter fills it, then `GET /fleet?by=service.version` and a single run's waterfall from a real
`starttrace serve --clickhouse chdb:DIR`.

    .venv/bin/python benchmarks/bench_fleet.py --runs 2000 --runs 10000 [--json out.json]

For each N:
- `insert_s`: N synthetic vLLM-like runs (tests/synth_runs.py, 2 ranks, 40 distinct ones cloned
  with their own ids, starts, versions and hosts; the newest version's weights load 2 s slower: a
  regression to find) turned into the exporter's rows (tests/otel_clickhouse.py) and inserted;
  plus one large run (`--big-imports` imports per rank: a real TP=2 start's size);
- `derive_s`, `derive_ms_per_run`: every run's fleet facts derived once through the real path
  (load from otel_traces in batches, build the model, write starttrace_runs); above
  `--derive-limit` runs (2000), only the 40 templates and the large run are derived that way and
  the clones' facts are copied from their template's, changed as their spans were (`facts_copied`);
- `fleet_cold_s`: the first `GET /fleet?by=service.version` of a fresh service process (targets:
  <= 2 s cold); `fleet_warm_s`: the median of the next 10 (<= 0.2 s);
- `open_big_run_s`: the large run's first `GET /startup/{run}` (load from ClickHouse, model, first
  answer; target <= 1 s), `load_run_s`: its load alone (in-process); `open_small_run_s`: the same
  for one of the N runs (120 spans).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402
from otel_clickhouse import create_tables, exporter_rows, insert  # noqa: E402
from synth_runs import make_run, to_protobuf  # noqa: E402

from starttrace.sources.clickhouse.client import close_all, connect  # noqa: E402
from starttrace.sources.clickhouse.facts import ClickHouseFacts  # noqa: E402
from starttrace.sources.clickhouse.runs import ClickHouseRuns  # noqa: E402

VERSIONS = ("0.30.0", "0.31.0", "0.32.0", "0.33.0")
T0 = 1_790_000_000 * 10**9
BATCH = 1000
TEMPLATES = 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def synth(i: int, n: int, imports: int = 3, run_id: str | None = None) -> Any:
    version = VERSIONS[min(len(VERSIONS) - 1, i * len(VERSIONS) // n)]
    run = make_run(
        ranks=2, imports_per_rank=imports, seed=i + 1, run_id=run_id or f"fleet-{i:06d}", t0=T0 + i * 60 * 10**9
    )
    for p in run.processes:
        p.resource["service.version"] = version
        p.resource["host.name"] = f"node{i % 16:02d}"
    return run


def clone(template: list[dict[str, Any]], i: int, n: int) -> list[dict[str, Any]]:
    """The exporter's rows of template run `template`, as run i: its own trace id, run id, start,
    version and host (span ids are unique within a trace, as OTLP asks)."""
    version = VERSIONS[min(len(VERSIONS) - 1, i * len(VERSIONS) // n)]
    shift = i * 60 * 10**9
    trace = f"{i + 1:032x}"
    slower = version == VERSIONS[-1]
    resources: dict[int, dict[str, str]] = {}
    out = []
    for row in template:
        res = resources.get(id(row["ResourceAttributes"]))
        if res is None:
            res = dict(row["ResourceAttributes"])
            res.update(
                {"starttrace.run_id": f"fleet-{i:06d}", "service.version": version, "host.name": f"node{i % 16:02d}"}
            )
            resources[id(row["ResourceAttributes"])] = res
        sec, _, frac = row["Timestamp"].partition(".")
        ns = int(sec) * 10**9 + int(frac) + shift
        dur = row["Duration"]
        if slower and row["SpanAttributes"].get("starttrace.phase") == "model_load":
            dur += 2 * 10**9
        out.append(
            dict(row, TraceId=trace, ResourceAttributes=res, Timestamp=f"{ns // 10**9}.{ns % 10**9:09d}", Duration=dur)
        )
    return out


def fill(client: Any, n: int, big_imports: int) -> str:
    # TEMPLATES distinct synthetic runs (their own timings), each the exporter's rows; run i is
    # template i % TEMPLATES with its own ids, start, version and host; the newest version loads its
    # weights 2 s slower (a regression to find)
    templates = [exporter_rows(to_protobuf(synth(k, TEMPLATES))) for k in range(TEMPLATES)]
    rows: list[dict[str, Any]] = []
    for i in range(n):
        rows.extend(clone(templates[i % TEMPLATES], i, n))
        if (i + 1) % BATCH == 0:
            insert(client, rows)
            rows = []
    big_id = "fleet-big"
    rows.extend(exporter_rows(to_protobuf(synth(n, n + 1, imports=big_imports, run_id=big_id))))
    insert(client, rows)
    return big_id


def start_service(data: Path, port: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "starttrace.service.server", "--port", str(port), "--clickhouse", f"chdb:{data}"]
    proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the service did not start: " + (proc.stderr.read().decode() if proc.stderr else ""))


def copy_facts(facts: Any, n: int) -> int:
    """Facts of runs TEMPLATES..n-1 from their template's derived facts, changed as `clone` changes
    the spans: run id, trace id, start, version, host; the newest version's model_load 2 s longer.
    (Deriving 10,000 runs one by one takes longer than this benchmark should: see derive_ms_per_run.)"""
    rows = {r["RunId"]: r for r in facts.client.arrow(f"SELECT * FROM {facts.facts} FINAL").to_pylist()}
    out = []
    for i in range(TEMPLATES, n):
        k = i % TEMPLATES
        src = rows[f"fleet-{k:06d}"]
        version = VERSIONS[min(len(VERSIONS) - 1, i * len(VERSIONS) // n)]
        extra = 2.0 if version == VERSIONS[-1] else 0.0
        phases = {p: v + (extra if p == "model_load" else 0.0) for p, v in dict(src["Phases"]).items()}
        roles = {p: v + (extra if p.endswith("/model_load") else 0.0) for p, v in dict(src["RolePhases"]).items()}
        identity = dict(src["Identity"], **{"service.version": version, "host.name": f"node{i % 16:02d}"})
        identity["hosts"] = identity["host.name"]
        out.append(
            {
                "run_id": f"fleet-{i:06d}",
                "trace_id": f"{i + 1:032x}",
                "service": src["ServiceName"],
                "start_ns": T0 + i * 60 * 10**9,
                "status": src["Status"],
                "time_to_ready_s": src["TimeToReadyS"],
                "startup_s": src["StartupS"],
                "phases": phases,
                "role_phases": roles,
                "findings": dict(src["Findings"]),
                "identity": identity,
                "processes": src["Processes"],
                "spans": src["Spans"],
                "version": src["SpanRows"],
                "facts_version": src["FactsVersion"],
            }
        )
        if len(out) == 5000:
            facts.write(out)
            out = []
    facts.write(out)
    return n - TEMPLATES


def prepare(data: Path, n: int, big_imports: int, derive_limit: int) -> dict[str, Any]:
    """Fill otel_traces and derive the facts (run in a process of its own: chdb is one engine per
    process, and the service opens the directory after this process has exited)."""
    from starttrace.service.fleet import Prefetching, derive, derive_all, direct_loader

    shutil.rmtree(data, ignore_errors=True)
    client = connect(f"chdb:{data}", create=True)
    create_tables(client)
    t = time.perf_counter()
    big = fill(client, n, big_imports)
    insert_s = time.perf_counter() - t
    rows = int(client.arrow("SELECT count() AS n FROM otel.otel_traces").column(0)[0].as_py())
    runs = ClickHouseRuns(client)
    t = time.perf_counter()
    big_run = runs.load_run(big)
    load_run_s = time.perf_counter() - t
    assert big_run is not None
    facts = ClickHouseFacts(client)
    pre = Prefetching(runs.load_runs)
    t = time.perf_counter()
    if n <= derive_limit:
        derived = derive_all(facts, direct_loader(pre.load_run, pre))
        copied = 0
    else:  # the templates (and the large run) through the real path; the clones' facts copied from them
        ids = [f"fleet-{i:06d}" for i in range(min(n, TEMPLATES))] + [big]
        derive(ids, direct_loader(pre.load_run, pre), facts)
        derived = len(ids)
        copied = copy_facts(facts, n)
    derive_s = time.perf_counter() - t
    close_all()
    return {
        "runs": n,
        "span_rows": rows,
        "big_run": big,
        "big_run_spans": big_run.span_count(),
        "insert_s": round(insert_s, 2),
        "derived": derived,
        "facts_copied": copied,
        "derive_s": round(derive_s, 2),
        "derive_ms_per_run": round(derive_s / max(1, derived) * 1000, 2),
        "load_run_s": round(load_run_s, 3),
    }


def measure(n: int, big_imports: int, workdir: Path, derive_limit: int) -> dict[str, Any]:
    data = workdir / f"chdb-{n}"
    kept = workdir / f"chdb-{n}.json"
    if kept.exists():  # prepared before (--keep): measured again with the code of now
        res: dict[str, Any] = json.loads(kept.read_text())
    else:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        cmd = [sys.executable, __file__, "--prepare", str(data), "--runs", str(n), "--big-imports", str(big_imports)]
        cmd += ["--derive-limit", str(derive_limit)]
        out = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, check=True)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        kept.write_text(json.dumps(res))
    big = res.pop("big_run")
    port = free_port()
    proc = start_service(data, port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
            t = time.perf_counter()
            first = http.get("/fleet", params={"by": "service.version"})
            cold = time.perf_counter() - t
            assert first.status_code == 200, first.text
            answer = first.json()
            assert answer["runs"] == n + 1, answer["runs"]
            warm = []
            for _ in range(10):
                t = time.perf_counter()
                http.get("/fleet", params={"by": "service.version"}).raise_for_status()
                warm.append(time.perf_counter() - t)
            t = time.perf_counter()
            page = http.get(f"/startup/{big}")
            open_s = time.perf_counter() - t
            assert page.status_code == 200, page.text[:500]
            small = "fleet-000001"
            t = time.perf_counter()
            http.get(f"/startup/{small}").raise_for_status()
            open_small_s = time.perf_counter() - t
    finally:
        proc.terminate()
        proc.wait(30)
    res.update(
        {
            "fleet_cold_s": round(cold, 3),
            "fleet_warm_s": round(statistics.median(warm), 3),
            "open_big_run_s": round(open_s, 3),
            "open_small_run_s": round(open_small_s, 3),
            "groups": [(g["value"], g["runs"], g["time_to_ready_s"]["p50"]) for g in answer["groups"]],
            "regressions": answer["regressions"][:3],
        }
    )
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, action="append", help="runs in otel_traces (repeatable; default 2000)")
    parser.add_argument("--big-imports", type=int, default=12000, help="imports per rank of the one large run")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)  # internal: fill and derive in DIR
    parser.add_argument(
        "--keep", type=Path, help="keep the filled chdb directories here; a second run measures them again"
    )
    parser.add_argument(
        "--derive-limit",
        type=int,
        default=2000,
        help="up to this many runs every run's facts are derived through the real path; above, the templates'"
        " facts are derived and copied to their clones",
    )
    args = parser.parse_args()
    if args.prepare is not None:
        print(json.dumps(prepare(args.prepare, (args.runs or [2000])[0], args.big_imports, args.derive_limit)))
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for n in args.runs or [2000]:
            res = measure(n, args.big_imports, workdir, args.derive_limit)
            print(json.dumps(res), flush=True)
            results.append(res)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
