"""`straggler` findings: per phase that every rank enters, the spread of the ranks and why the
slowest is late.

Ranks: lanes of role `worker` with a rank. Phases: those every rank has a span of (dist_init,
model_load, kv_cache, ...; not imports, interpreter, bootstrap), and `ready` (each rank's ready
time). Entry: a rank's first span of the phase; exit: its last end. For a wait phase (dist_init,
barriers) exits are near-simultaneous: the straggler is the rank that entered last, and the
others waited for it. For other phases the straggler is the rank that left last. Why: what the
late rank did before that took longer than on the earliest rank (the most specific span whose
time differs by at least 80 % of the largest difference), or that it started later.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from starttrace.analysis.findings.common import WAIT_NAMES, finding, s, short_name
from starttrace.analysis.model import Lane, RunModel

SKIP_PHASES = (
    "import",
    "process",
    "startup",
    "interpreter",
    "bootstrap",
    "fork",
    "launch",
    "other",
    "idle",
    "forkserver",
    "forkserver_preload",
)
MIN_SPREAD_S = 0.1
MIN_SHARE = 0.02  # of the run's startup
MAX_FINDINGS = 6


def straggler_findings(model: RunModel) -> list[dict[str, Any]]:
    ranks = [ln for ln in model.lanes if ln.role == "worker" and ln.rank is not None]
    if len(ranks) < 2:
        return []
    floor = max(MIN_SPREAD_S, MIN_SHARE * model.startup_s)
    out = []
    lower = pl.col("name").str.to_lowercase()
    is_wait = (pl.col("phase") == "dist_init") | pl.any_horizontal(
        [lower.str.contains(w, literal=True) for w in WAIT_NAMES]
    )
    per = (
        model.marks.filter(
            pl.col("lane").is_in([ln.index for ln in ranks])
            & ~pl.col("phase").is_in(list(SKIP_PHASES))
            & ~pl.col("instant")
        )
        .group_by("lane", "phase")
        .agg(pl.col("start").min().alias("entry"), pl.col("eff_end").max().alias("exit"), is_wait.all().alias("waits"))
    )
    by_phase: dict[int, dict[str, tuple[int, int, bool]]] = {ln.index: {} for ln in ranks}
    for lane_i, phase, entry, exit_, waits in per.iter_rows():
        by_phase[lane_i][phase] = (entry, exit_, waits)
    for phase in _common_phases(ranks, by_phase):
        rows = {ln.index: by_phase[ln.index][phase] for ln in ranks}
        got = _phase_finding(
            model,
            ranks,
            phase,
            {i: r[0] for i, r in rows.items()},
            {i: r[1] for i, r in rows.items()},
            all(r[2] for r in rows.values()),
            floor,
        )
        if got is not None:
            out.append(got)
    if all(ln.ready_ns is not None for ln in ranks):
        ready = {ln.index: ln.ready_ns for ln in ranks}
        got = _phase_finding(model, ranks, "ready", ready, ready, False, floor)  # type: ignore[arg-type]
        if got is not None:
            out.append(got)
    out.sort(key=lambda f: -(f["seconds"] or 0))
    return out[:MAX_FINDINGS]


def _common_phases(ranks: list[Lane], by_phase: dict[int, dict[str, tuple[int, int, bool]]]) -> list[str]:
    common = None
    for ln in ranks:
        have = {ph for ph in by_phase[ln.index] if ph not in SKIP_PHASES}
        common = have if common is None else common & have
    order = {ph: i for i, ph in enumerate(ranks[0].phases)}
    return sorted(common or (), key=lambda ph: order.get(ph, 99))


def _phase_finding(
    model: RunModel,
    ranks: list[Lane],
    phase: str,
    entry: dict[int, int],
    exit_: dict[int, int],
    waits: bool,
    floor: float,
) -> dict[str, Any] | None:
    entry_spread = (max(entry.values()) - min(entry.values())) / 1e9
    exit_spread = (max(exit_.values()) - min(exit_.values())) / 1e9
    spread = entry_spread if waits else exit_spread
    if spread < floor:
        return None
    by = {ln.index: ln for ln in ranks}
    key = entry if waits else exit_
    late = by[max(key, key=lambda i: key[i])]
    early = by[min(key, key=lambda i: key[i])]
    lateness = spread
    why = _why(model, late, early, entry[late.index], entry[early.index], lateness)
    name = "dist.init" if phase == "dist_init" else phase
    if waits:
        waited = ", ".join(
            f"{short_name(by[i])} waited {s((entry[late.index] - entry[i]) / 1e9)}"
            for i in sorted(entry, key=lambda i: entry[i])
            if i != late.index
        )
        text = f"{waited} in {name} for {short_name(late)}{why}"
    elif phase == "ready":
        text = f"{short_name(late)} was ready {s(spread)} after {short_name(early)}{why}"
    else:
        text = f"{short_name(late)} left {name} {s(spread)} after {short_name(early)}{why}"
    text += f"; the ranks entered within {s(entry_spread)} and left within {s(exit_spread)}"
    return finding(
        "straggler",
        "warning" if spread >= 1.0 else "info",
        [late] + [ln for ln in ranks if ln is not late],
        spread,
        text,
        f"look at {short_name(late)} before {name}: the waterfall shows it against the other ranks",
        phase=phase,
        slowest_pid=late.pid,
        slowest_rank=late.rank,
        entry_spread_s=round(entry_spread, 6),
        exit_spread_s=round(exit_spread, 6),
        entries={str(by[i].rank): model.seconds(t) for i, t in entry.items()},
        exits={str(by[i].rank): model.seconds(t) for i, t in exit_.items()},
    )


def _durations(model: RunModel, lane: Lane, until: int) -> pl.DataFrame:
    """Per span name: `total` (the summed duration of its spans that ended before `until`) and
    `depth` (the shallowest)."""
    proc = lane.process_span.idx if lane.process_span is not None else -1
    return (
        model.lane_rows(lane)
        .filter(
            (pl.col("idx") != proc)
            & ~pl.col("instant")
            & ~pl.col("in_progress")
            & (pl.col("eff_end") <= until)
            & (pl.col("phase") != "process")
            & ((pl.col("depth") <= 2) | (pl.col("phase") == "import"))
        )
        .group_by("name")
        .agg(pl.col("duration").sum().alias("total"), pl.col("depth").min())
    )


def _why(model: RunModel, late: Lane, early: Lane, t_late: int, t_early: int, lateness: float) -> str:
    started_later = (late.start - early.start) / 1e9
    a, b = _durations(model, late, t_late), _durations(model, early, t_early)
    diffs = a.join(b.select("name", pl.col("total").alias("other")), on="name", how="left").select(
        "name", (pl.col("total") - pl.col("other").fill_null(0)).alias("d"), "depth"
    )
    best = max(int(diffs["d"].max() or 0), 0) if diffs.height else 0
    if started_later >= 0.5 * lateness and started_later * 1e9 >= best:
        return f", which started {s(started_later)} later"
    if best <= 0:
        return ""
    close = diffs.filter(pl.col("d") >= 0.8 * best).sort("depth", "d", "name", descending=True)
    name, d, _depth = close.row(0)
    text = f", whose {_what(name)} took {s(d / 1e9)} longer"
    if not name.startswith("import "):  # the import that differs most, when it is a good part of it
        imports = diffs.filter(pl.col("name").str.starts_with("import ") & (pl.col("d") >= 0.3 * d))
        if imports.height:
            nm, dd, _ = imports.sort("d", "name", descending=True).row(0)
            text += f" ({_what(nm)}: {s(dd / 1e9)} longer)"
    return text


def _what(name: str) -> str:
    return f"import of {name[7:]}" if name.startswith("import ") else name
