"""Prometheus metrics (`GET /metrics`). The names are a contract with the dashboards. No label
names a run: a run id per label value made a new set of series per run (unbounded cardinality,
against Prometheus's naming guidance). Runs across a fleet are asked of `GET /fleet` (ClickHouse or
the embedded store, docs/fleet.md); Prometheus gets distributions and the last run's values.

histograms (each run observed once, when its fleet facts are derived; since the service started)
  starttrace_run_time_to_ready_seconds{service}
  starttrace_run_phase_seconds{service,role,phase}          per run: its slowest process of the role
gauges (the newest run of each service; rank label "" when unknown)
  starttrace_phase_duration_seconds{service,role,rank,phase}
  starttrace_time_to_ready_seconds{service,role,rank}
  starttrace_run_startup_seconds{service}
  starttrace_import_duration_seconds{service,module}          top 50 modules, summed over processes
  starttrace_import_ranks_paid{service,module}
counters
  starttrace_ingested_spans_total{source}                      source = otlp | journal
  starttrace_otlp_requests_total{encoding,code}
  starttrace_label_values_cut_total{label}                     label values cut to LABEL_MAX characters

Label values come from span data (a phase, a role, a module name): each is cut to LABEL_MAX
characters (each value cut counted once), and a family keeps at most MAX_SERIES label sets (later
phases go to the set with phase "other"), so a hostile span (a 1 MiB `starttrace.phase`, a million
phases) leaves /metrics small.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from starttrace.analysis.model import RunModel

METRIC_RUNS = 20  # newest runs looked at for each service's last run
TOP_MODULES = 50
# seconds: a startup takes from under a second (a small tree) to many minutes (a large model)
BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)
MAX_OBSERVED_IDS = 100_000  # run ids remembered so that a run is observed once
LABEL_MAX = 120  # characters of a label value (phase, role, module, service names are far shorter)
MAX_SERIES = 2_000  # label sets per histogram family


def label(value: str) -> str:
    """A label value cut to LABEL_MAX characters (the cut marked with an ellipsis)."""
    return value if len(value) <= LABEL_MAX else value[: LABEL_MAX - 1] + "…"


class _Histogram:
    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.buckets[bisect.bisect_left(BUCKETS, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        bounds = (*map(str, BUCKETS), "+Inf")
        return [(bound, float(n)) for bound, n in zip(bounds, itertools.accumulate(self.buckets), strict=True)]


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ingested: dict[str, float] = {"otlp": 0.0, "journal": 0.0}
        self.requests: dict[tuple[str, str], float] = {}
        self.ttr: dict[str, _Histogram] = {}
        self.phase: dict[tuple[str, str, str], _Histogram] = {}
        self._observed: dict[str, None] = {}
        self.cut: dict[str, float] = {}  # label name -> distinct values cut
        self._cut_seen: dict[tuple[str, int], None] = {}

    def add_ingested(self, source: str, n: int) -> None:
        with self._lock:
            self.ingested[source] = self.ingested.get(source, 0.0) + n

    def add_request(self, encoding: str, code: int) -> None:
        key = (encoding, str(code))
        with self._lock:
            self.requests[key] = self.requests.get(key, 0.0) + 1

    def _label(self, name: str, value: str) -> str:
        """`label(value)`, a cut value counted once (the lock held)."""
        if len(value) > LABEL_MAX and (name, hash(value)) not in self._cut_seen:
            self._cut_seen[(name, hash(value))] = None
            if len(self._cut_seen) > MAX_OBSERVED_IDS:
                del self._cut_seen[next(iter(self._cut_seen))]
            self.cut[name] = self.cut.get(name, 0.0) + 1
        return label(value)

    def label(self, name: str, value: str) -> str:
        """A label value from span data, cut to LABEL_MAX characters; each value cut is counted once."""
        with self._lock:
            return self._label(name, value)

    def observe_run(self, facts: dict[str, Any]) -> None:
        """A run's fleet facts (`analysis.fleet.run_facts`) into the histograms, once per run."""
        with self._lock:
            if facts["run_id"] in self._observed:
                return
            self._observed[facts["run_id"]] = None
            if len(self._observed) > MAX_OBSERVED_IDS:
                del self._observed[next(iter(self._observed))]
            service = self._label("service", str(facts.get("service") or ""))
            if facts.get("time_to_ready_s") is not None and (service in self.ttr or len(self.ttr) < MAX_SERIES):
                self.ttr.setdefault(service, _Histogram()).observe(float(facts["time_to_ready_s"]))
            for key, secs in (facts.get("role_phases") or {}).items():
                role, _, phase = key.partition("/")
                series = (service, self._label("role", role), self._label("phase", phase))
                if series not in self.phase and len(self.phase) >= MAX_SERIES:
                    series = (service, series[1], "other")
                self.phase.setdefault(series, _Histogram()).observe(float(secs))


class StartTraceCollector:
    def __init__(self, counters: Counters, models: Callable[[], list[RunModel]]) -> None:
        self.counters = counters
        self.models = models

    def collect(self) -> Iterator[Metric]:
        # Long by design: one metric family after the other, each a few lines, in the order /metrics lists them.
        ttr_h = HistogramMetricFamily(
            "starttrace_run_time_to_ready_seconds",
            "Seconds from a run's start to ready, one observation per run.",
            labels=["service"],
        )
        phase_h = HistogramMetricFamily(
            "starttrace_run_phase_seconds",
            "Seconds of a startup phase per run: the slowest process of the role (union of its spans).",
            labels=["service", "role", "phase"],
        )
        with self.counters._lock:
            for service, h in sorted(self.counters.ttr.items()):
                ttr_h.add_metric([service], h.cumulative(), h.sum)
            for (service, role, ph), h in sorted(self.counters.phase.items()):
                phase_h.add_metric([service, role, ph], h.cumulative(), h.sum)
        phase = GaugeMetricFamily(
            "starttrace_phase_duration_seconds",
            "Seconds a process of the service's newest run spent in a startup phase (union of its spans).",
            labels=["service", "role", "rank", "phase"],
        )
        ttr = GaugeMetricFamily(
            "starttrace_time_to_ready_seconds",
            "Seconds from the start of the service's newest run to the process being ready.",
            labels=["service", "role", "rank"],
        )
        run_s = GaugeMetricFamily(
            "starttrace_run_startup_seconds",
            "Seconds from the start of the service's newest run to ready (to the newest span while not ready).",
            labels=["service"],
        )
        imp = GaugeMetricFamily(
            "starttrace_import_duration_seconds",
            "Cumulative import seconds of a module in the service's newest run, summed over its processes (top 50).",
            labels=["service", "module"],
        )
        paid = GaugeMetricFamily(
            "starttrace_import_ranks_paid",
            "Ranks of the service's newest run (a process without a rank counts one) that imported the module.",
            labels=["service", "module"],
        )
        for model in self.models():
            cut_label = self.counters.label
            service = cut_label("service", model.service or "")
            run_s.add_metric([service], model.startup_s)
            phases: dict[tuple[str, ...], float] = {}
            ready: dict[tuple[str, ...], float] = {}
            for lane in model.lanes:
                role = cut_label("role", lane.role or "")
                rank = "" if lane.rank is None else str(lane.rank)
                for ph, ns in lane.phases.items():
                    key = (service, role, rank, cut_label("phase", ph))
                    if key not in phases and len(phases) >= MAX_SERIES:
                        key = (service, role, rank, "other")  # processes of one role without a rank: the slowest
                    phases[key] = max(phases.get(key, 0.0), ns / 1e9)
                if lane.ready_ns is not None:
                    key = (service, role, rank)
                    ready[key] = max(ready.get(key, 0.0), max(0, lane.ready_ns - model.t0) / 1e9)
            for key, value in phases.items():
                phase.add_metric(list(key), value)
            for key, value in ready.items():
                ttr.add_metric(list(key), value)
            for h in model.hotspots[:TOP_MODULES]:
                module = cut_label("module", h["module"])
                imp.add_metric([service, module], h["cumulative_s"])
                paid.add_metric([service, module], h["ranks_paid"])
        ingested = CounterMetricFamily(
            "starttrace_ingested_spans", "Spans written to the store, by source.", labels=["source"]
        )
        requests = CounterMetricFamily(
            "starttrace_otlp_requests",
            "OTLP/HTTP export requests, by body encoding and status code.",
            labels=["encoding", "code"],
        )
        cut = CounterMetricFamily(
            "starttrace_label_values_cut",
            f"Label values from span data cut to {LABEL_MAX} characters, by label (each value once).",
            labels=["label"],
        )
        with self.counters._lock:
            for source, v in sorted(self.counters.ingested.items()):
                ingested.add_metric([source], v)
            for (enc, code), v in sorted(self.counters.requests.items()):
                requests.add_metric([enc, code], v)
            for name, v in sorted(self.counters.cut.items()):
                cut.add_metric([name], v)
        yield from (ttr_h, phase_h, phase, ttr, run_s, imp, paid, ingested, requests, cut)


def newest_per_service(run_ids: list[str], model_of: Callable[[str], RunModel | None]) -> list[RunModel]:
    """The newest run's model of each service, from run ids newest first."""
    seen: set[str] = set()
    out = []
    for rid in run_ids:
        model = model_of(rid)
        if model is None or (model.service or "") in seen:
            continue
        seen.add(model.service or "")
        out.append(model)
    return out


def render(counters: Counters, models: Callable[[], list[RunModel]]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StartTraceCollector(counters, models))  # type: ignore[arg-type]
    return generate_latest(registry)
