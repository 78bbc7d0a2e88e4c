"""Phases: which phase a span belongs to, and interval arithmetic for phase seconds (over a few
intervals in Python, over a table of them with `union_by` and `merged_by`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import polars as pl

from starttrace.analysis.model import NAME_PHASES


def phase_of(name: str, attrs: dict[str, Any]) -> str:
    phase = attrs.get("starttrace.phase")
    if isinstance(phase, str) and phase:
        return phase
    return phase_by_name(name)


def phase_by_name(name: str) -> str:
    """The phase of a span without a `starttrace.phase` attribute."""
    known = NAME_PHASES.get(name)
    if known:
        return known
    if name.startswith("import "):
        return "import"
    if name.startswith("preload "):
        return "forkserver_preload"
    return "other"


def merge_intervals(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if e < s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def union_by(frame: pl.DataFrame, keys: list[str], start: str = "start", end: str = "end") -> pl.DataFrame:
    """Per group of `keys`: the length of the union of the rows' [start, end] intervals (`ns`)."""
    prev = pl.col(end).cum_max().shift(1).over(keys)
    return (
        frame.with_row_index("_first")
        .sort([*keys, start])
        .with_columns(
            (pl.col(end) - pl.max_horizontal(pl.col(start), prev.fill_null(pl.col(start))))
            .clip(lower_bound=0)
            .alias("_part")
        )
        .group_by(keys)
        .agg(pl.col("_part").sum().alias("ns"), pl.col("_first").min())
        .sort("_first")  # each group where its first row stands (a lane's phases: in the order they began)
        .drop("_first")
    )


def merged_by(frame: pl.DataFrame, keys: list[str], start: str = "start", end: str = "end") -> pl.DataFrame:
    """Per group of `keys`: the merged intervals of the rows (`start`, `end`), in order."""
    prev = pl.col(end).cum_max().shift(1).over(keys)
    return (
        frame.sort([*keys, start])
        .with_columns((prev.is_null() | (pl.col(start) > prev)).cast(pl.Int32).cum_sum().over(keys).alias("_seg"))
        .group_by([*keys, "_seg"], maintain_order=True)
        .agg(pl.col(start).min(), pl.col(end).max())
        .drop("_seg")
    )
