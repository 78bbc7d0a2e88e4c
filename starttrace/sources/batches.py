"""What a source hands the store: spans of processes, grouped in ingest batches."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

# (trace_id, span_id, parent_id, name, start_ns, end_ns, in_progress, instant, attrs, error, thread)
# attrs: JSON object text (journal), or the span's raw OTLP protobuf bytes (see `decode_attrs`)
SpanTuple = tuple[
    str, str, "str | None", str, int, "int | None", int, int, "str | bytes | None", "str | None", "int | None"
]


@dataclass
class ProcessBatch:
    """Spans of one process (one OTLP ResourceSpans, or one journal file)."""

    source: str  # "otlp" | "journal"
    resource: dict[str, Any]
    spans: list[SpanTuple]
    run_id: str | None = None  # None: resolved from the resource, else from the trace id
    lane_id: str | None = None  # None: service.instance.id, else pid, else service name
    info: dict[str, Any] = field(default_factory=dict)  # exited, exit_code, warnings, preloaded, journal_path


@dataclass
class RunMeta:
    run_id: str
    trace_id: str | None
    meta: dict[str, Any]
    problems: list[str]
    service: str | None = None


@dataclass
class IngestBatch:
    processes: list[ProcessBatch]
    runs: list[RunMeta] = field(default_factory=list)
    replace_problems: bool = False
    done: threading.Event | None = None

    def span_count(self) -> int:
        return sum(len(p.spans) for p in self.processes)
