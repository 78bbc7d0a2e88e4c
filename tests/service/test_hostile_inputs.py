"""The smaller reliability items of issue 26, each with the input that broke it: out-of-range
times (4xx, not 500), run ids that cannot round-trip (refused at ingest), reads after an
acknowledged write (whole spans), one span count per run, implausible timestamps (named in
problems, kept out of metrics), exports cached per run version. None of them yields a 5xx."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from synth_runs import SProcess, SRun, SSpan, make_run, to_protobuf

PB = {"Content-Type": "application/x-protobuf"}
T0 = 1_796_269_000_000_000_000  # 2026-12-03


def _post(c: TestClient, run: SRun, processes: list[SProcess] | None = None) -> ExportTraceServiceResponse:
    r = c.post("/v1/traces", content=to_protobuf(run, processes).SerializeToString(), headers=PB)
    assert r.status_code == 200, r.text
    return ExportTraceServiceResponse.FromString(r.content)


def _small(run_id: str, trace_id: str = "ab" * 16, n: int = 11, t0: int = T0) -> SRun:
    res = {"service.name": "svc", "service.instance.id": f"i-{run_id}", "process.pid": 42, "starttrace.run_id": run_id}
    spans = [
        SSpan("%016x" % (i + 1), "%016x" % 1 if i else None, f"s{i}", t0 + i * 1000, t0 + i * 1000 + 500)
        for i in range(n)
    ]
    return SRun(run_id, trace_id, [SProcess(res, spans)])


@pytest.mark.parametrize(
    "query",
    [
        "since=1796269000000",  # epoch milliseconds
        "since=1e10",
        "since=inf",
        "since=-inf",
        "since=nan",
        "since=9999-01-01",
        "until=0001-01-01",
        "until=1e300",
        "since=99999999999999999999999",
    ],
)
def test_out_of_range_times_are_a_clear_4xx(client: TestClient, query: str) -> None:
    r = client.get("/runs?" + query, headers={"Accept": "application/json"})
    assert r.status_code == 400, (query, r.status_code, r.text)
    assert "out of range" in r.json()["error"] or "invalid time" in r.json()["error"]


def test_other_hostile_queries_never_5xx(client: TestClient) -> None:
    _post(client, _small("q"))
    for path in (
        "/startup/q/lanes/0/spans?start_us=99999999999999999999999&end_us=-99999999999999999999",
        "/startup/q/lanes/99999999999999999999999/spans",
        "/startup/q/lanes/0/spans?min_us=99999999999999999999999",
        "/runs?limit=99999999999999999999",
        "/runs/q/export?format=jaeger&summary_imports=99999999999999999999",
        "/runs?since=2h&until=1e9",
    ):
        r = client.get(path, headers={"Accept": "application/json"})
        assert r.status_code < 500, (path, r.status_code, r.text[:300])


def test_run_ids_round_trip_or_are_refused_at_ingest(client: TestClient) -> None:
    bad = _small("team/run-1", trace_id="cd" * 16)
    resp = _post(client, bad)
    assert resp.partial_success.rejected_spans == 11
    assert "run id" in resp.partial_success.error_message and "'/'" in resp.partial_success.error_message
    ids = [r["run_id"] for r in client.get("/runs", headers={"Accept": "application/json"}).json()["runs"]]
    assert "team/run-1" not in ids and "team" not in ids
    for odd in ("run ?#%&+ ü", "run..x", "ü" * 50):  # odd but whole path segments: every URL opens them
        _post(client, _small(odd, trace_id="%032x" % abs(hash(odd))))
        enc = quote(odd, safe="")
        assert client.get(f"/startup/{enc}", headers={"Accept": "application/json"}).json()["run_id"] == odd
        assert client.get(f"/runs/{enc}/export?format=jaeger").status_code == 200
        assert client.get(f"/startup/{enc}/lanes/0/spans").status_code == 200
        assert odd in client.get(f"/startup/{enc}", headers={"Accept": "text/html"}).text.replace("&amp;", "&")


def test_a_read_after_the_acknowledgement_sees_the_whole_span(client: TestClient) -> None:
    """An exporter sends a span in progress (one attribute), then ended with 50k attributes: an
    export requested right after the second 200 has every attribute."""
    run = _small("whole", trace_id="ef" * 16, n=2)
    proc = run.processes[0]
    proc.spans[1].attrs = {"starttrace.in_progress": True}
    _post(client, run)
    assert client.get("/runs/whole/export?format=jaeger").status_code == 200  # the in-progress copy read
    proc.spans[1].attrs = {f"k{i}": i for i in range(50_000)}
    _post(client, run)  # answered once stored: the next read sees it whole
    doc = client.get("/runs/whole/export?format=jaeger").json()
    span = next(s for t in doc["data"] for s in t["spans"] if s["operationName"] == "s1")
    keys = {t["key"] for t in span["tags"]}
    assert {f"k{i}" for i in range(50_000)} <= keys


def test_one_span_count_per_run_when_two_runs_share_a_trace(client: TestClient) -> None:
    a, b = _small("twin-a", trace_id="12" * 16), _small("twin-b", trace_id="12" * 16)
    b.processes[0].resource["service.instance.id"] = "other"
    _post(client, a)
    _post(client, b)
    rows = {r["run_id"]: r for r in client.get("/runs", headers={"Accept": "application/json"}).json()["runs"]}
    for rid in ("twin-a", "twin-b"):
        model_spans = sum(
            len(lane["spans"])
            for lane in client.get(f"/startup/{rid}?spans=all", headers={"Accept": "application/json"}).json()["lanes"]
        )
        assert rows[rid]["spans"] == model_spans == 11, (rid, rows[rid]["spans"], model_spans)


def test_implausible_timestamps_are_named_and_kept_out_of_metrics(client: TestClient) -> None:
    run = _small("epoch0", trace_id="34" * 16)
    run.processes[0].resource["service.name"] = "svc-epoch0"  # the service's newest run: this one
    run.processes[0].spans[3].start = 0  # start_time_unix_nano=0: 1970
    run.processes[0].spans[3].end = T0 + 3000
    _post(client, run)
    doc = client.get("/startup/epoch0", headers={"Accept": "application/json"}).json()
    assert any("implausible" in p and "1970-01-01" in p and "'s3'" in p for p in doc["problems"]), doc["problems"]
    metrics = client.get("/metrics").text
    startup = re.search(r'starttrace_run_startup_seconds\{service="svc-epoch0"\} (\S+)', metrics)
    # (the run has no ready: it is live, so its startup runs to now; 1970 would make it 1.8e9 s)
    assert startup is not None and float(startup.group(1)) < 30 * 86400, startup
    assert "s3" not in {row[2] for lane in doc["lanes"] for row in lane["spans"]}
    (row,) = [
        r for r in client.get("/runs", headers={"Accept": "application/json"}).json()["runs"] if r["run_id"] == "epoch0"
    ]
    assert row["start_ns"] == T0  # the runs list does not start it in 1970 either


def test_exports_are_cached_per_run_version(make_client: Callable[..., TestClient]) -> None:
    c = make_client(prebuild_idle_s=None)
    run = make_run(ranks=2, imports_per_rank=3000, run_id="cached")
    _post(c, run)
    url = "/runs/cached/export?format=otlp-json"
    t = time.perf_counter()
    first = c.get(url)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    second = c.get(url)
    warm = time.perf_counter() - t
    assert first.status_code == second.status_code == 200 and first.content == second.content
    assert warm < cold / 2, (cold, warm)
    more = _small("cached", trace_id=run.trace_id, n=3, t0=1_700_000_000_000_000_000 + 10**12)  # make_run's t0
    more.processes[0].resource["starttrace.run_id"] = "cached"
    for i, s in enumerate(more.processes[0].spans):
        s.span_id = "%016x" % (0xFEED0000 + i)
        s.parent_id = None
    _post(c, more)  # a new version: the export says so
    third = c.get(url)
    assert third.content != first.content and b"feed0000" in third.content
