"""Real OTLP exporters (protobuf) and raw OTLP/JSON into a real `serve` subprocess."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import httpx
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext
from st_service_helpers import Server, wait_for
from synth_runs import SRun, SSpan, make_run, to_otlp_json


def export_with_sdk(run: SRun, endpoint: str, compression: Compression = Compression.NoCompression) -> int:
    """Replay a synthetic run through the OpenTelemetry SDK: one TracerProvider (resource) and one
    real OTLPSpanExporter per process, parents carried as span contexts across processes."""
    providers = {}
    owner: dict[str, int] = {}
    spans: dict[str, SSpan] = {}
    for i, p in enumerate(run.processes):
        prov = TracerProvider(resource=Resource.create(p.resource))
        prov.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, compression=compression)))
        providers[i] = prov
        for s in p.spans:
            owner[s.span_id] = i
            spans[s.span_id] = s
    children: dict[str | None, list[SSpan]] = defaultdict(list)
    for s in spans.values():
        children[s.parent_id if s.parent_id in spans else None].append(s)
    contexts: dict[str, SpanContext] = {}
    order = list(children[None])
    count = 0
    while order:
        s = order.pop(0)
        tracer = providers[owner[s.span_id]].get_tracer("starttrace-test")
        ctx = None
        if s.parent_id in contexts:
            ctx = trace.set_span_in_context(NonRecordingSpan(contexts[s.parent_id]))
        span = tracer.start_span(s.name, context=ctx, start_time=s.start, attributes=s.attrs)
        span.end(end_time=s.end)
        contexts[s.span_id] = span.get_span_context()
        count += 1
        order.extend(children[s.span_id])
    for prov in providers.values():
        prov.force_flush(30_000)
        prov.shutdown()
    return count


def test_real_protobuf_exporter_startup_shows_lanes(server: Server) -> None:
    run = make_run(ranks=3, imports_per_rank=40, run_id="sdk-run", seed=3)
    sent = export_with_sdk(run, server.url + "/v1/traces")
    assert sent == run.span_count

    def stored() -> bool:
        r = httpx.get(server.url + "/runs")
        runs = r.json()["runs"]
        return bool(runs) and runs[0]["spans"] == sent

    wait_for(stored)
    doc = httpx.get(server.url + "/startup").json()
    assert doc["run_id"] == "sdk-run"
    assert doc["status"] == "ready"
    roles = [lane["role"] for lane in doc["lanes"]]
    assert roles == ["api_server", "engine_core", "forkserver", "worker", "worker", "worker"]
    assert [lane["rank"] for lane in doc["lanes"] if lane["role"] == "worker"] == [0, 1, 2]
    assert [lane["pid"] for lane in doc["lanes"]] == [1000, 1001, 1002, 1100, 1101, 1102]
    worker = doc["lanes"][3]
    for phase in ("import", "cuda_init", "dist_init", "model_load", "kv_cache", "bootstrap"):
        assert worker["phases"][phase] > 0, phase
    assert worker["time_to_ready_s"] is not None and worker["time_to_ready_s"] < doc["startup_s"]
    # the worker's process span hangs under the forkserver's fork span (another lane)
    assert worker["launched_by"]["name"] == "process.fork"
    assert doc["lanes"][worker["launched_by"]["lane"]]["role"] == "forkserver"
    # vLLM-style span without starttrace attributes is kept, in its process lane
    engine = doc["lanes"][1]
    names = [row[2] for row in engine["spans"]]
    assert "Overall Loading" in names
    assert {r["label"] for r in doc["ranks"]} >= {"worker rank 0 pid 1100", "worker rank 2 pid 1102"}


def test_gzip_protobuf_exporter(server: Server) -> None:
    run = make_run(ranks=2, imports_per_rank=20, run_id="sdk-gzip", seed=4)
    sent = export_with_sdk(run, server.url + "/v1/traces", compression=Compression.Gzip)
    wait_for(lambda: httpx.get(server.url + "/runs").json()["runs"][0]["spans"] == sent)
    metrics = httpx.get(server.url + "/metrics").text
    assert 'starttrace_otlp_requests_total{code="200",encoding="protobuf"}' in metrics


def test_raw_otlp_json_hex_ids(server: Server) -> None:
    run = make_run(ranks=2, imports_per_rank=20, run_id="json-run", seed=5)
    body = json.dumps(to_otlp_json(run)).encode()
    r = httpx.post(server.url + "/v1/traces", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {}
    # gzip-compressed JSON too (same spans: stored once)
    r = httpx.post(
        server.url + "/v1/traces",
        content=gzip.compress(body),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 200
    wait_for(lambda: httpx.get(server.url + "/startup/json-run").status_code == 200)
    wait_for(lambda: httpx.get(server.url + "/runs").json()["runs"][0]["spans"] == run.span_count)
    doc = httpx.get(server.url + "/startup/json-run").json()
    assert doc["trace_id"] == run.trace_id  # hex read as hex, not as base64
    sent_ids = {s.span_id for p in run.processes for s in p.spans}
    got_ids = {row[0] for lane in doc["lanes"] for row in lane["spans"]}
    assert got_ids == sent_ids
    assert [lane["rank"] for lane in doc["lanes"] if lane["role"] == "worker"] == [0, 1]
