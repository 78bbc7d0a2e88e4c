"""Tests' view of a run's span table as `Span` objects (`run.span_of` per row): for assertions that
read a process's spans one by one, as they did when a process held a list of them."""

from __future__ import annotations

from starttrace.run import Process, Run, Span, span_of


def spans_of(run: Run, process: Process) -> list[Span]:
    """The process's spans, in table order (a journal's: by start)."""
    return [span_of(row) for row in run.spans_of(process).iter_rows(named=True)]


def all_spans(run: Run) -> list[tuple[Process | None, Span]]:
    """Every span with its process; the run's root spans first, with process None."""
    lanes = {p.instance_id: p for p in run.processes}
    out: list[tuple[Process | None, Span]] = [(None, s) for s in run.root_spans]
    out.extend((lanes.get(row["lane"]), span_of(row)) for row in run.spans.iter_rows(named=True))
    return out
