"""Load: 16 concurrent real OTLP exporters, 100k spans in total, into a real `serve`."""

from __future__ import annotations

import re
import threading
import time

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from st_service_helpers import Server, wait_for

EXPORTERS = 16
PER_EXPORTER = 6250  # 16 x 6250 = 100k
BATCH = 512


def test_16_exporters_100k_spans(server: Server) -> None:
    results: list[SpanExportResult] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(EXPORTERS)

    def worker(rank: int) -> None:
        try:
            mem = InMemorySpanExporter()
            provider = TracerProvider(
                resource=Resource.create(
                    {
                        "service.name": "load",
                        "service.instance.id": f"load-{rank}",
                        "process.pid": 20_000 + rank,
                        "starttrace.run_id": "load-run",
                        "starttrace.role": "worker",
                        "starttrace.rank": rank,
                    }
                )
            )
            provider.add_span_processor(SimpleSpanProcessor(mem))
            tracer = provider.get_tracer("load")
            t0 = time.time_ns()
            with tracer.start_as_current_span("process", start_time=t0, attributes={"starttrace.phase": "process"}):
                for i in range(PER_EXPORTER - 1):
                    s = tracer.start_span(
                        f"import mod{rank}_{i}", start_time=t0 + i * 1000, attributes={"starttrace.phase": "import"}
                    )
                    s.end(end_time=t0 + i * 1000 + 900)
            spans = list(mem.get_finished_spans())
            assert len(spans) == PER_EXPORTER
            exporter = OTLPSpanExporter(endpoint=server.url + "/v1/traces", timeout=60)
            barrier.wait(60)
            for k in range(0, len(spans), BATCH):
                res = exporter.export(spans[k : k + BATCH])
                with lock:
                    results.append(res)
            exporter.shutdown()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(EXPORTERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors, errors
    assert results and all(r is SpanExportResult.SUCCESS for r in results)

    def stored() -> int:
        runs = httpx.get(server.url + "/runs").json()["runs"]
        return runs[0]["spans"] if runs else 0

    wait_for(lambda: stored() == EXPORTERS * PER_EXPORTER, timeout=60)
    metrics = httpx.get(server.url + "/metrics", timeout=60).text  # cold model build of 100k spans
    codes = set(re.findall(r'starttrace_otlp_requests_total\{code="(\d+)"', metrics))
    assert codes and not any(c.startswith("5") for c in codes), codes
    assert 'starttrace_ingested_spans_total{source="otlp"} 100000.0' in metrics
    doc = httpx.get(server.url + "/startup/load-run", timeout=60).json()
    assert len(doc["lanes"]) == EXPORTERS
    assert sorted(ln["rank"] for ln in doc["lanes"]) == list(range(EXPORTERS))
