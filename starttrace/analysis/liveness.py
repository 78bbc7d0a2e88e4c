"""Liveness from evidence: which processes of a run are dead, and how their open spans end.

A process is running only while its pid is alive *and* is the same process (`Process.alive`). One
dead without a recorded exit was `killed`; one whose journal was cut short (a full disk) is `lost`.
Either way its open spans end at its last record, so nothing of it grows with the clock.
`run_status(run)` is the model's status computed from the run type alone (for `starttrace runs`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import polars as pl

from starttrace.run import Process, Run, journal_cut

_WARNINGS = {
    "killed": "killed: the process died without recording its exit; its open spans end at its last record",
    "lost": "lost: its journal was cut short (disk full?); nothing after its last record is known",
}


def ending(process: Process, still_open: bool) -> tuple[str | None, bool]:
    """(`lost` (journal cut short) | `killed` (dead, no exit recorded) | None, dead); `still_open`:
    the process's `process` span is open or missing (`open_process_spans`)."""
    dead = bool(process.exited) or process.alive is False
    if still_open and journal_cut(process.warnings or []) is not None:
        return "lost", dead
    return ("killed" if dead and still_open else None), dead


def open_process_spans(run: Run) -> set[str]:
    """The lanes whose `process` span is still open or missing (one filter of the span table)."""
    own = pl.DataFrame(
        [(p.instance_id, p.process_span_id) for p in run.processes if p.process_span_id],
        schema={"lane": pl.String, "span_id": pl.String},
        orient="row",
    )
    ended = pl.col("end").is_not_null() & ~pl.col("in_progress").fill_null(False)
    rows = run.spans.select("lane", "span_id", "end", "in_progress")
    closed = rows.filter(pl.col("span_id").is_in(own["span_id"].implode()) & ended).join(own, on=["lane", "span_id"])
    return {p.instance_id for p in run.processes} - set(closed["lane"].to_list())


def dead_lanes(run: Run, lanes_by_id: dict[str, Any]) -> dict[int, tuple[Any, str]]:
    """The lanes of killed or lost processes (by id of the Lane), each with why. Every dead
    process's lane is marked exited, and a killed or lost one says why in its warnings."""
    out: dict[int, tuple[Any, str]] = {}
    still_open = open_process_spans(run)
    for p in run.processes:
        why, dead = ending(p, p.instance_id in still_open)
        lane = lanes_by_id[p.instance_id]
        if dead:
            lane.exited = True
        if why is None:
            continue
        out[id(lane)] = (lane, why)
        if _WARNINGS[why] not in lane.warnings:
            lane.warnings.append(_WARNINGS[why])
    return out


def run_status(run: Run) -> str:
    """The run's status as the model gives it (`lanes._status`, with `dead_lanes`)."""
    spans = run.spans
    if spans.select((pl.col("name") == "ready").any()).item():
        return "ready"
    roots_open = [s.open for s in run.root_spans if s.name == "startup"]
    if not roots_open:  # a source that keeps the root span in its process's lane
        startup = spans.filter(pl.col("name") == "startup").join(
            spans.select(pl.col("span_id").alias("parent_id")).unique(), on="parent_id", how="anti"
        )
        roots_open = (startup["in_progress"].fill_null(False) | startup["end"].is_null()).to_list()
    if roots_open and not any(roots_open):
        return "finished"
    still_open = open_process_spans(run)
    states = [ending(p, p.instance_id in still_open) for p in run.processes]
    if states and all(dead for _, dead in states):
        return ended_status([why for why, _ in states if why is not None]) or "exited"
    return "running"


def ended_status(whys: Iterable[str]) -> str | None:
    """The status of a run whose processes are all gone, some killed or lost: `killed` when one
    was killed, else `lost` (a journal cut short: how it ended is not known); None: neither."""
    whys = set(whys)
    return "killed" if "killed" in whys else "lost" if "lost" in whys else None
