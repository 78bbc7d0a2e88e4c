"""The export formats, one view module each, by name (`starttrace export -f`, `GET /runs/{id}/export`),
and the export detail settings (`--detail`, `STARTTRACE_OTLP_DETAIL`, `STARTTRACE_SUMMARY_IMPORTS`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starttrace.analysis.detail import DEFAULT_DETAIL, DEFAULT_IMPORT_BUDGET, DETAILS
from starttrace.run import Run

FORMATS = ("perfetto", "jaeger", "otlp-json")
ENV_DETAIL = "STARTTRACE_OTLP_DETAIL"
ENV_SUMMARY_IMPORTS = "STARTTRACE_SUMMARY_IMPORTS"


def check_detail(detail: str) -> None:
    if detail not in DETAILS:
        raise ValueError(f"unknown detail {detail!r}; one of {', '.join(DETAILS)}")


def parse_import_budget(value: str | int | None, source: str = ENV_SUMMARY_IMPORTS) -> int:
    """The summary's import budget per process: a whole number >= 0 (default 300)."""
    if value is None or value == "":
        return DEFAULT_IMPORT_BUDGET
    try:
        budget = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{source}={value!r}: expected a whole number of imports per process") from None
    if budget < 0:
        raise ValueError(f"{source}={value!r}: must be >= 0")
    return budget


def detail_from_env(environ: Mapping[str, str]) -> tuple[str, int]:
    """(detail, import budget) for automatic export; ValueError names the bad variable."""
    raw = environ.get(ENV_DETAIL, "").strip().lower() or DEFAULT_DETAIL
    if raw not in DETAILS:
        raise ValueError(f"{ENV_DETAIL}={environ.get(ENV_DETAIL)!r}: expected one of {', '.join(DETAILS)}")
    return raw, parse_import_budget(environ.get(ENV_SUMMARY_IMPORTS))


def export_document(
    run: Run,
    fmt: str,
    now_ns: int | None = None,
    detail: str = DEFAULT_DETAIL,
    import_budget: int = DEFAULT_IMPORT_BUDGET,
) -> dict[str, Any]:
    """The run as a JSON document in format `fmt` (one of FORMATS) at `detail` (full | summary)."""
    check_detail(detail)
    if fmt == "perfetto":
        from starttrace.views.perfetto import to_perfetto

        return to_perfetto(run, now_ns, detail, import_budget)
    if fmt == "jaeger":
        from starttrace.views.jaeger import to_jaeger

        return to_jaeger(run, now_ns, detail, import_budget)
    if fmt == "otlp-json":
        from starttrace.views.otlp import to_otlp_json

        return to_otlp_json(run, now_ns=now_ns, detail=detail, import_budget=import_budget)
    raise ValueError(f"unknown export format {fmt!r}; one of {', '.join(FORMATS)}")
