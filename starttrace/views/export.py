"""The export formats, one view module each, by name (`starttrace export -f`, `GET /runs/{id}/export`)."""

from __future__ import annotations

from typing import Any

from starttrace.run import Run

FORMATS = ("perfetto", "jaeger", "otlp-json")


def export_document(run: Run, fmt: str, now_ns: int | None = None) -> dict[str, Any]:
    """The run as a JSON document in format `fmt` (one of FORMATS)."""
    if fmt == "perfetto":
        from starttrace.views.perfetto import to_perfetto

        return to_perfetto(run, now_ns)
    if fmt == "jaeger":
        from starttrace.views.jaeger import to_jaeger

        return to_jaeger(run, now_ns)
    if fmt == "otlp-json":
        from starttrace.views.otlp import to_otlp_json

        return to_otlp_json(run, now_ns=now_ns)
    raise ValueError(f"unknown export format {fmt!r}; one of {', '.join(FORMATS)}")
