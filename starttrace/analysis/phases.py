"""Phases: which phase a span belongs to, and interval arithmetic for phase seconds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

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


def union_ns(intervals: Iterable[tuple[int, int]]) -> int:
    return sum(e - s for s, e in merge_intervals(intervals))
