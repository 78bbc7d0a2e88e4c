"""Tests' view of a run's span table as `Span` objects (`run.span_of` per row): for assertions that
read a process's spans one by one, as they did when a process held a list of them."""

from __future__ import annotations

import polars as pl

from starttrace.run import Process, Run, Span, span_of


def _spans(rows: pl.DataFrame) -> list[Span]:
    return [span_of(row) for row in rows.iter_rows(named=True)]


def spans_of(run: Run, process: Process) -> list[Span]:
    """The process's spans, in table order (a journal's: by start)."""
    return _spans(run.spans_of(process))


def named(run: Run, process: Process, name: str) -> list[Span]:
    """The process's spans called `name`, in table order."""
    return _spans(run.spans_of(process).filter(pl.col("name") == name))


def children(run: Run, process: Process, parent: Span) -> list[Span]:
    """The process's spans whose parent is `parent`, in table order."""
    return _spans(run.spans_of(process).filter(pl.col("parent_id") == parent.span_id))


def spans_named(run: Run, name: str) -> list[Span]:
    """Every process's spans called `name` (the run's root spans not included), in table order."""
    return _spans(run.spans.filter(pl.col("name") == name))


def all_spans(run: Run) -> list[tuple[Process | None, Span]]:
    """Every span with its process; the run's root spans first, with process None."""
    lanes = {p.instance_id: p for p in run.processes}
    out: list[tuple[Process | None, Span]] = [(None, s) for s in run.root_spans]
    out.extend((lanes.get(row["lane"]), span_of(row)) for row in run.spans.iter_rows(named=True))
    return out


def span_index(run: Run) -> dict[str, tuple[Process | None, Span]]:
    """Span id -> (its process, the span), over every span of the run (`all_spans`)."""
    return {span.span_id: (process, span) for process, span in all_spans(run)}
