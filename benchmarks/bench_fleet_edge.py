"""Facts at the edge on ClickHouse's engine (chdb): `/fleet` over N runs whose exports carried their
`starttrace.run` facts span, and what deriving costs for a store whose runs lack them.

    .venv/bin/python benchmarks/bench_fleet_edge.py --runs 10000 [--derive-runs 300] [--json out.json]

- `otel_traces` holds N synthetic vLLM-like runs (benchmarks/bench_fleet.py's 40 templates cloned
  with their own ids, starts, versions and hosts) plus one large run of a real TP=2 start's size;
  each run also has the `starttrace.run` span its exporter ships (views/otlp.py `facts_span`): the
  templates' facts computed by `run_facts` (the service's analysis), the clones' changed as their
  spans were, the row made by the exporter's mapping (every value a string);
- `fleet_cold_s`: the first `GET /fleet?by=service.version` of a fresh `starttrace serve
  --clickhouse chdb:DIR` process; it must be complete (`pending` 0, all N+1 runs; target <= 2 s);
  `fleet_warm_s`: the median of the next 10;
- `derive_big_run_s`: deriving the large run's facts through the real path (load from otel_traces,
  clocks, model, `run_facts`): what deriving costs per real run;
- a second traces table (`otel_traces_derive`, same directory, its own facts table) holds
  `--derive-runs` runs with no facts span: a fresh service's first `/fleet` there
  (`nospan_first_s`, with `pending`), then the time until its background deriver made it complete
  (`nospan_complete_s`, `derived_runs_per_s`, `derive_ms_per_run`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import httpx  # noqa: E402
from bench_fleet import BATCH, TEMPLATES, VERSIONS, clone, free_port, synth  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from otel_clickhouse import _go_float, create_tables, exporter_rows, insert  # noqa: E402
from synth_runs import to_protobuf, to_run  # noqa: E402

from starttrace.analysis.fleet import run_facts  # noqa: E402
from starttrace.analysis.lanes import build_model  # noqa: E402
from starttrace.run.facts_attrs import facts_attributes  # noqa: E402
from starttrace.sources.clickhouse.client import close_all, connect  # noqa: E402
from starttrace.views.otlp import facts_span  # noqa: E402

DERIVE_TABLE = "otel_traces_derive"


def as_string(value: Any) -> str:
    """pcommon.Value.AsString() of an attribute value (tests/otel_clickhouse.py)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _go_float(value)
    return str(value)


def clone_facts(facts: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    """Template facts as run i's (what `clone` does to the spans: ids, start, version, host, +2 s
    model_load for the newest version)."""
    version = VERSIONS[min(len(VERSIONS) - 1, i * len(VERSIONS) // n)]
    extra = 2.0 if version == VERSIONS[-1] else 0.0
    host = f"node{i % 16:02d}"
    identity = dict(facts["identity"], **{"service.version": version, "host.name": host, "hosts": host})
    return dict(
        facts,
        run_id=f"fleet-{i:06d}",
        trace_id=f"{i + 1:032x}",
        start_ns=int(facts["start_ns"]) + i * 60 * 10**9,
        phases={p: round(v + (extra if p == "model_load" else 0.0), 6) for p, v in facts["phases"].items()},
        role_phases={
            p: round(v + (extra if p.endswith("/model_load") else 0.0), 6) for p, v in facts["role_phases"].items()
        },
        identity=identity,
    )


def span_row(template_row: dict[str, Any], facts: dict[str, Any], resource: dict[str, str]) -> dict[str, Any]:
    ns = int(facts["start_ns"])
    return dict(
        template_row,
        TraceId=facts["trace_id"],
        SpanId=f"{int(facts['trace_id'], 16) & (2**63 - 1) | 2**62:016x}",  # its own, as every export's
        ResourceAttributes=resource,
        Timestamp=f"{ns // 10**9}.{ns % 10**9:09d}",
        SpanAttributes={k: as_string(v) for k, v in facts_attributes(facts, 1).items()} | {"starttrace.phase": "facts"},
    )


def prepare(data: Path, n: int, big_imports: int, derive_runs: int) -> dict[str, Any]:
    """Fill both traces tables (a process of its own: chdb is one engine per process)."""
    client = connect(f"chdb:{data}", create=True)
    create_tables(client)
    t = time.perf_counter()
    templates = []
    for k in range(TEMPLATES):
        srun = synth(k, TEMPLATES)
        run = to_run(srun)
        facts = run_facts(run, build_model(run))
        spans = exporter_rows(to_protobuf(srun))
        facts_row = exporter_rows(encode_spans([facts_span(run, facts, 1)]))[0]
        templates.append((spans, facts, facts_row))
    rows: list[dict[str, Any]] = []
    for i in range(n):
        spans, facts, facts_row = templates[i % TEMPLATES]
        cloned = clone(spans, i, n)
        rows.extend(cloned)
        rows.append(span_row(facts_row, clone_facts(facts, i, n), cloned[0]["ResourceAttributes"]))
        if (i + 1) % BATCH == 0:
            insert(client, rows)
            rows = []
    big = synth(n, n + 1, imports=big_imports, run_id="fleet-big")
    big_run = to_run(big)
    t_big = time.perf_counter()
    big_facts = run_facts(big_run, build_model(big_run))
    facts_big_s = time.perf_counter() - t_big
    rows.extend(exporter_rows(to_protobuf(big)))
    rows.extend(exporter_rows(encode_spans([facts_span(big_run, big_facts, 1)])))
    insert(client, rows)
    insert_s = time.perf_counter() - t
    span_rows = int(client.arrow("SELECT count() FROM otel.otel_traces").column(0)[0].as_py())
    # what deriving one real-size run costs through the real path (into a throwaway facts table)
    from starttrace.service.fleet import derive, direct_loader
    from starttrace.sources.clickhouse.facts import ClickHouseFacts
    from starttrace.sources.clickhouse.runs import ClickHouseRuns

    scratch = connect(f"chdb:{data}?table={DERIVE_TABLE}")
    create_tables(scratch)
    t = time.perf_counter()
    derive(["fleet-big"], direct_loader(ClickHouseRuns(client).load_run), ClickHouseFacts(scratch))
    derive_big_s = time.perf_counter() - t
    scratch.command(f"TRUNCATE TABLE otel.starttrace_runs_{DERIVE_TABLE}")
    # the store without facts spans: small runs only
    rows = []
    for i in range(derive_runs):
        rows.extend(clone(templates[i % TEMPLATES][0], i, derive_runs))
    insert(scratch, rows)
    close_all()
    return {
        "runs": n,
        "span_rows": span_rows,
        "big_run_spans": big_run.span_count(),
        "insert_s": round(insert_s, 2),
        "facts_of_big_run_in_exporter_s": round(facts_big_s, 3),
        "derive_big_run_s": round(derive_big_s, 3),
        "derive_runs": derive_runs,
    }


def start_service(url: str, port: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "starttrace.service.server", "--port", str(port), "--clickhouse", url]
    proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the service did not start: " + (proc.stderr.read().decode() if proc.stderr else ""))


def measure(n: int, big_imports: int, derive_runs: int, workdir: Path) -> dict[str, Any]:
    data = workdir / f"chdb-edge-{n}"
    kept = workdir / f"chdb-edge-{n}.json"
    if kept.exists():  # prepared before (--keep): measured again with the code of now
        res: dict[str, Any] = json.loads(kept.read_text())
        forget = (  # the runs without facts spans: underived again
            "import sys; sys.path[:0] = [sys.argv[2]]\n"
            "from starttrace.sources.clickhouse.client import connect\n"
            f"connect('chdb:' + sys.argv[1]).command('TRUNCATE TABLE IF EXISTS otel.starttrace_runs_{DERIVE_TABLE}')\n"
        )
        subprocess.run([sys.executable, "-c", forget, str(data), str(ROOT)], check=True, timeout=300)
    else:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        cmd = [sys.executable, __file__, "--prepare", str(data), "--runs", str(n), "--big-imports", str(big_imports)]
        cmd += ["--derive-runs", str(derive_runs)]
        out = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(out.stderr[-4000:])
        res = json.loads(out.stdout.strip().splitlines()[-1])
        kept.write_text(json.dumps(res))
    # 1. runs that carry their facts: complete from the first answer
    port = free_port()
    proc = start_service(f"chdb:{data}", port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
            t = time.perf_counter()
            first = http.get("/fleet", params={"by": "service.version"})
            cold = time.perf_counter() - t
            assert first.status_code == 200, first.text
            answer = first.json()
            assert answer["runs"] == n + 1 and answer["pending"] == 0, (answer["runs"], answer["pending"])
            warm = []
            for _ in range(10):
                t = time.perf_counter()
                http.get("/fleet", params={"by": "service.version"}).raise_for_status()
                warm.append(time.perf_counter() - t)
    finally:
        proc.terminate()
        proc.wait(30)
    # 2. runs without the span: pending at first, derived in the background
    port = free_port()
    t0 = time.perf_counter()
    proc = start_service(f"chdb:{data}?table={DERIVE_TABLE}", port)
    started = time.perf_counter() - t0
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
            t = time.perf_counter()
            nospan = http.get("/fleet").json()
            nospan_first = time.perf_counter() - t
            first_counts = (nospan["runs"], nospan["pending"])
            assert sum(first_counts) == derive_runs, first_counts
            while nospan["pending"]:
                time.sleep(0.5)
                nospan = http.get("/fleet").json()
                assert nospan["runs"] + nospan["pending"] == derive_runs
            complete = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(30)
    res.update(
        {
            "fleet_cold_s": round(cold, 3),
            "fleet_warm_s": round(statistics.median(warm), 3),
            "complete_first": True,
            "groups": [(g["value"], g["runs"], g["time_to_ready_s"]["p50"]) for g in answer["groups"]],
            "regressions": answer["regressions"][:2],
            "nospan_service_start_s": round(started, 2),
            "nospan_first_s": round(nospan_first, 3),
            "nospan_first_runs_pending": first_counts,
            "nospan_complete_s": round(complete, 1),
            "derived_runs_per_s": round(derive_runs / complete, 1),
            "derive_ms_per_run": round(complete / derive_runs * 1000, 1),
        }
    )
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10000, help="runs with facts spans in otel_traces")
    parser.add_argument("--big-imports", type=int, default=12000, help="imports per rank of the one large run")
    parser.add_argument("--derive-runs", type=int, default=300, help="runs without facts spans (derived)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--keep", type=Path, help="keep the filled chdb directory here; a second run measures it again")
    parser.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)  # internal: fill DIR
    args = parser.parse_args()
    if args.prepare is not None:
        print(json.dumps(prepare(args.prepare, args.runs, args.big_imports, args.derive_runs)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-fleet-edge-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        res = measure(args.runs, args.big_imports, args.derive_runs, workdir)
    print(json.dumps(res), flush=True)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
