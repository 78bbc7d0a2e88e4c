"""Prometheus metrics (`GET /metrics`). The names are a contract with the dashboards:

gauges (newest METRIC_RUNS runs only; rank label "" when unknown)
  starttrace_phase_duration_seconds{run_id,service,role,rank,phase}
  starttrace_time_to_ready_seconds{run_id,service,role,rank,pid}
  starttrace_run_startup_seconds{run_id,service}
  starttrace_import_duration_seconds{run_id,service,module}   top 50 modules, summed over processes
  starttrace_import_ranks_paid{run_id,service,module}
counters
  starttrace_ingested_spans_total{source}                      source = otlp | journal
  starttrace_otlp_requests_total{encoding,code}
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from starttrace.analysis.model import RunModel

METRIC_RUNS = 20
TOP_MODULES = 50


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ingested: dict[str, float] = {"otlp": 0.0, "journal": 0.0}
        self.requests: dict[tuple[str, str], float] = {}

    def add_ingested(self, source: str, n: int) -> None:
        with self._lock:
            self.ingested[source] = self.ingested.get(source, 0.0) + n

    def add_request(self, encoding: str, code: int) -> None:
        key = (encoding, str(code))
        with self._lock:
            self.requests[key] = self.requests.get(key, 0.0) + 1


class StartTraceCollector:
    def __init__(self, counters: Counters, models: Callable[[], list[RunModel]]) -> None:
        self.counters = counters
        self.models = models

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        # Long by design: one metric family after the other, each a few lines, in the order /metrics lists them.
        phase = GaugeMetricFamily(
            "starttrace_phase_duration_seconds",
            "Seconds a process spent in a startup phase (union of its spans of that phase).",
            labels=["run_id", "service", "role", "rank", "phase"],
        )
        ttr = GaugeMetricFamily(
            "starttrace_time_to_ready_seconds",
            "Seconds from the run start to the process being ready.",
            labels=["run_id", "service", "role", "rank", "pid"],
        )
        run_s = GaugeMetricFamily(
            "starttrace_run_startup_seconds",
            "Seconds from the run start to ready (to the newest span while not ready).",
            labels=["run_id", "service"],
        )
        imp = GaugeMetricFamily(
            "starttrace_import_duration_seconds",
            "Cumulative import seconds of a module, summed over the processes of the run (top 50).",
            labels=["run_id", "service", "module"],
        )
        paid = GaugeMetricFamily(
            "starttrace_import_ranks_paid",
            "Number of ranks (processes without a rank count one each) that imported the module.",
            labels=["run_id", "service", "module"],
        )
        for model in self.models():
            service = model.service or ""
            run_s.add_metric([model.run_id, service], model.startup_s)
            seen_phase: set[tuple[str, ...]] = set()
            seen_ttr: set[tuple[str, ...]] = set()
            for lane in model.lanes:
                role = lane.role or ""
                rank = "" if lane.rank is None else str(lane.rank)
                pid = "" if lane.pid is None else str(lane.pid)
                for ph, ns in lane.phases.items():
                    labels = (model.run_id, service, role, rank, ph)
                    if labels in seen_phase:  # two processes without rank and the same role
                        labels = (model.run_id, service, role, f"pid{pid}" if not rank else rank, ph)
                    if labels in seen_phase:
                        continue
                    seen_phase.add(labels)
                    phase.add_metric(list(labels), ns / 1e9)
                if lane.ready_ns is not None:
                    labels = (model.run_id, service, role, rank, pid)
                    if labels not in seen_ttr:
                        seen_ttr.add(labels)
                        ttr.add_metric(list(labels), max(0, lane.ready_ns - model.t0) / 1e9)
            for h in model.hotspots[:TOP_MODULES]:
                imp.add_metric([model.run_id, service, h["module"]], h["cumulative_s"])
                paid.add_metric([model.run_id, service, h["module"]], h["ranks_paid"])
        ingested = CounterMetricFamily(
            "starttrace_ingested_spans", "Spans written to the store, by source.", labels=["source"]
        )
        requests = CounterMetricFamily(
            "starttrace_otlp_requests",
            "OTLP/HTTP export requests, by body encoding and status code.",
            labels=["encoding", "code"],
        )
        with self.counters._lock:
            for source, v in sorted(self.counters.ingested.items()):
                ingested.add_metric([source], v)
            for (enc, code), v in sorted(self.counters.requests.items()):
                requests.add_metric([enc, code], v)
        yield from (phase, ttr, run_s, imp, paid, ingested, requests)


def render(counters: Counters, models: Callable[[], list[RunModel]]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StartTraceCollector(counters, models))  # type: ignore[arg-type]
    return generate_latest(registry)
