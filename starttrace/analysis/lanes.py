"""Build the waterfall model from a run: lanes (one per process), the span table, per-lane facts.

Every per-span step is a table operation over the run's span table (`Run.spans`): phases and
modules resolved, parents and depths linked, lanes ordered, each lane's phase seconds, coverage,
gaps, ready and top imports, the import hotspots. Python loops run over lanes, never over spans.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import polars as pl

from starttrace.analysis.breakdown import set_breakdowns
from starttrace.analysis.critical_path import critical_path
from starttrace.analysis.duplicates import without_vllm_copies
from starttrace.analysis.findings import cuda_audit, find_all, preload_advice_rows
from starttrace.analysis.liveness import dead_lanes, ended_status
from starttrace.analysis.model import (
    GAP_MIN_NS,
    MAX_GAPS,
    MODEL_SCHEMA,
    NAME_PHASES,
    ROLE_ORDER,
    STRUCTURAL_PHASES,
    TOP_HOTSPOTS,
    UNTIL,
    Lane,
    RunModel,
    rank_slot,
)
from starttrace.analysis.nodes import node_key, node_names, node_order
from starttrace.analysis.phases import merged_by, union_by
from starttrace.analysis.trees import cut_cycles, depths
from starttrace.run import SPAN_SCHEMA, Process, Run, int_or_none, spans_table

# a span's name and phase are shown everywhere (lanes, panels, labels of /metrics): bounded
NAME_MAX = 1_000
PHASE_MAX = 120
COMMAND_MAX = 4_096
_IDENTITY_LIMITS = (
    ("role", PHASE_MAX),
    ("service", PHASE_MAX),
    ("host", PHASE_MAX),
    ("start_method", PHASE_MAX),
    ("command", COMMAND_MAX),
)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class NoFirstToken(ValueError):
    """`until="first_token"` asked of a run that served no request (no `first_token`)."""


def build_model(run: Run, now_ns: int | None = None, stall_s: float | None = None, until: str = "ready") -> RunModel:
    """The waterfall model of `run`; `now_ns` (default: now) is the effective end of open spans
    while the run is live; `stall_s` (default: STARTTRACE_STALL_S, else 60) when a span that is
    still open makes a `stalled` finding; `until` (UNTIL) where the lanes' windows, breakdowns and
    the critical path end: the run's ready, or its first token (NoFirstToken when it has none)."""
    if until not in UNTIL:
        raise ValueError(f"until must be one of {', '.join(UNTIL)}, not {until!r}")
    now = time.time_ns() if now_ns is None else now_ns
    run = without_vllm_copies(run)  # vLLM's own OTLP copies of marks the journal holds
    lanes_by_id = {p.instance_id: _lane_of(p, run.service) for p in run.processes}
    frame = _all_spans(run, lanes_by_id)
    for lane_id in dict.fromkeys(frame["lane"].rle().struct.field("value").to_list()):  # lanes without a process
        if lane_id not in lanes_by_id:
            lanes_by_id[lane_id] = _lane_of(Process(lane_id, 0, 0, None, {}, ""), run.service)
    frame, cut = _capped(frame)
    frame, bad_spans = _linked(_resolved(frame))
    bad_spans = _cut_identity(list(lanes_by_id.values())) + cut + bad_spans
    ready_ns = frame.select(pl.col("start").filter(pl.col("name") == "ready").min()).item()
    first_token_ns = frame.select(pl.col("start").filter(pl.col("name") == "first_token").min()).item()
    if until == "first_token" and first_token_ns is None:
        raise NoFirstToken(f"run {run.run_id} served no request: it has no first token to end at")
    dead = dead_lanes(run, lanes_by_id)  # liveness from evidence (analysis/liveness.py)
    status = _status(ready_ns, frame, list(lanes_by_id.values()))
    if dead:
        status = (ended_status(why for _, why in dead.values()) or status) if status == "exited" else status
        frame = _end_open_spans(frame, {lane.id: why for lane, why in dead.values()})
    t_first, t_last = frame.select(pl.col("start").min(), pl.coalesce("end", "start").max().fill_null(0)).row(0)
    t_eff = max(now, t_last) if status == "running" else t_last
    open_end = pl.when("in_progress").then(pl.lit(t_eff, pl.Int64)).otherwise("end")
    frame = frame.with_columns(pl.max_horizontal(open_end, "start").alias("eff_end")).with_columns(
        (pl.col("eff_end") - pl.col("start")).alias("duration")
    )
    t0 = _t0(frame, t_first)
    ordered, frame, side = _order_lanes(frame, lanes_by_id, t_first)
    model = RunModel(
        run_id=run.run_id,
        trace_id=run.trace_id or None,
        service=run.service or next((ln.service for ln in ordered if ln.service), None),
        meta=run.meta,
        problems=list(run.problems) + bad_spans,
        t0=t0,
        t_end=t_eff if frame.height else t0,
        now_ns=now,
        status=status,
        ready_ns=ready_ns,
        lanes=ordered,
        spans=frame,
        side=side,
        phases=[],
        hotspots=[],
        preload_advice=[],
        cuda_audit={},
        critical_path=[],
        version=run.version,
        updated_at=run.updated_at,
        source=run.source,
        first_token_ns=first_token_ns,
        until=until,
    )
    _lane_facts(model, model.end_ns)
    model.phases = list(dict.fromkeys(ph for lane in ordered for ph in lane.phases))
    set_breakdowns(model)
    model.hotspots = import_hotspots(model)
    model.cuda_audit = cuda_audit(model)
    model.critical_path = critical_path(model)
    model.findings = find_all(model, stall_s)
    model.preload_advice = preload_advice_rows(model.findings)
    return model


def _all_spans(run: Run, lanes_by_id: dict[str, Lane]) -> pl.DataFrame:
    """The run's span table with its root spans, each in the lane of the process it belongs to, in
    the order the source gave (ties of start keep it: the frame stays in this order until sorted)."""
    roots = []
    owners = run.root_owners()
    for s in run.root_spans:  # one root per node
        owner = owners[s.span_id]
        if owner is not None and owner.instance_id in lanes_by_id:
            roots.append((owner.instance_id, s))
    parts = [spans_table(roots)] if roots else []
    spans = (
        run.spans
        if run.spans.schema == pl.Schema(SPAN_SCHEMA)
        else run.spans.select(list(SPAN_SCHEMA)).cast(SPAN_SCHEMA)
    )  # type: ignore[arg-type]
    parts.append(spans)
    frame = pl.concat(parts, how="vertical") if len(parts) > 1 else parts[0]
    return frame


def _resolved(frame: pl.DataFrame) -> pl.DataFrame:
    """Phases and modules resolved, open spans without an end, instants that are closed; a column
    is rewritten only where a row needs it (most sources name every span's phase and module)."""
    name = pl.col("name")
    by_name = name.replace_strict(NAME_PHASES, default=None, return_dtype=pl.String).fill_null(
        pl.when(name.str.starts_with("import "))
        .then(pl.lit("import"))
        .when(name.str.starts_with("preload "))
        .then(pl.lit("forkserver_preload"))
        .otherwise(pl.lit("other"))
    )
    has_phase = pl.col("phase").is_not_null() & (pl.col("phase") != "")
    open_ = pl.col("in_progress") | pl.col("end").is_null()
    needs = frame.select(
        (~has_phase).any(ignore_nulls=False),
        (pl.col("module").is_null() & name.str.starts_with("import ")).any(ignore_nulls=False),
        open_.any(ignore_nulls=False),
    ).row(0)
    resolved = [
        [pl.when(has_phase).then(pl.col("phase")).otherwise(by_name).alias("phase")],
        [pl.coalesce("module", pl.when(name.str.starts_with("import ")).then(name.str.slice(7))).alias("module")],
        [
            open_.alias("in_progress"),
            pl.when(open_).then(None).otherwise(pl.col("end")).alias("end"),
            (pl.col("instant") & ~open_).alias("instant"),
        ],
    ]
    return frame.with_columns(
        expr for need, exprs in zip(needs, resolved, strict=True) if need is not False for expr in exprs
    )


def _end_open_spans(frame: pl.DataFrame, ended: dict[str, str]) -> pl.DataFrame:
    """The open spans of the killed or lost lanes (`dead_lanes`) end at the lane's last record,
    the reason as their error."""
    last = (
        frame.filter(pl.col("lane").is_in(list(ended)))
        .group_by("lane")
        .agg(pl.coalesce("end", "start").max().alias("last"))
    )
    why = pl.DataFrame({"lane": list(ended), "why": list(ended.values())}, schema={"lane": pl.String, "why": pl.String})
    hit = pl.col("why").is_not_null() & pl.col("in_progress")
    return (
        frame.join(last, on="lane", how="left", maintain_order="left")
        .join(why, on="lane", how="left", maintain_order="left")
        .with_columns(
            pl.when(hit).then(pl.max_horizontal("last", "start")).otherwise(pl.col("end")).alias("end"),
            pl.when(hit & pl.col("error").is_null())
            .then(pl.col("why") + ": the process ended before this span did (ended at its last record)")
            .otherwise(pl.col("error"))
            .alias("error"),
            pl.when(hit).then(False).otherwise(pl.col("instant")).alias("instant"),
            pl.when(hit).then(False).otherwise(pl.col("in_progress")).alias("in_progress"),
        )
        .drop("last", "why")
    )


def _lane_of(p: Process, service: str | None) -> Lane:
    res = p.resource or {}
    return Lane(
        index=-1,
        id=p.instance_id,
        pid=p.pid if p.pid else int_or_none(res.get("process.pid")),
        ppid=p.ppid if p.ppid else int_or_none(res.get("process.parent_pid")),
        role=_str(res.get("starttrace.role")) or None,
        rank=int_or_none(res.get("starttrace.rank")),
        local_rank=int_or_none(res.get("starttrace.local_rank")),
        world_size=int_or_none(res.get("starttrace.world_size")),
        start_method=_str(res.get("starttrace.start_method")),
        service=_str(res.get("service.name")) or service,
        host=_str(res.get("host.name")),
        command=_command(res.get("process.command_args")),
        resource=res,
        exited=p.exited,
        exit_code=p.exit_code,
        warnings=list(p.warnings or []),
        preloaded=list(p.preloaded or []),
    )


def _status(ready_ns: int | None, frame: pl.DataFrame, lanes: list[Lane]) -> str:
    """ready: the server answers (`ready`; a lane's own `process.ready` is not the run's);
    finished: the startup span ended; exited: every process exited; else running."""
    if ready_ns is not None:
        return "ready"
    roots = _roots(frame)
    if roots.height and not roots["in_progress"].any():
        return "finished"
    if lanes and all(lane.exited for lane in lanes):
        return "exited"
    return "running"


def _roots(frame: pl.DataFrame) -> pl.DataFrame:
    """The `startup` spans whose parent is not a span of the run."""
    startup = (pl.col("phase") == "startup") & (pl.col("_up") < 0)
    return frame.lazy().filter(startup).select("phase", "_up", "start", "in_progress").collect()


def _t0(frame: pl.DataFrame, t_first: int | None) -> int:
    roots = _roots(frame)["start"].to_list()
    return min(roots + ([t_first] if t_first is not None else [0]))


def _parents(frame: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per row (in the frame's order): the row of its parent anywhere (-1: none), and of its parent
    in its own lane (-1: none); and what was wrong. A span is a process's span id: where processes
    reuse span ids, a parent is looked for in the span's own process first, then the id's first row
    anywhere (a child process's `process` span under its launcher). Parent cycles are cut, each
    once (trees.cut_cycles), and named."""
    notes: list[str] = []
    up = _rows_of(frame["span_id"], frame["parent_id"])
    distinct = frame["span_id"].n_unique()
    # an id in more than one process (the pairs counted only when some id repeats: rare)
    if distinct < frame.height and frame.select(pl.struct("lane", "span_id").n_unique()).item() > distinct:
        keyed = frame.select(pl.struct("lane", "span_id").alias("own"), pl.struct("lane", "parent_id").alias("want"))
        own = _rows_of(keyed["own"], keyed["want"])
        up = np.where(own >= 0, own, up)
        ids = (
            frame.group_by("span_id")
            .agg(pl.col("lane").n_unique().alias("n"), pl.col("name").first())
            .filter(pl.col("n") > 1)
        )
        sid, name = ids.row(0)[0], ids.row(0)[2]
        notes.append(
            f"{ids.height} span id{'s' if ids.height > 1 else ''} reused by several processes"
            f" (e.g. {sid[:32]!r}, {name[:80]!r}): kept apart, each a span of its own process;"
            " a parent is looked for in the span's own process first"
        )
    rows = np.arange(len(up), dtype=np.int64)
    up[up == rows] = -1  # its own parent
    up, cut = cut_cycles(up)
    if len(cut):
        first = frame.row(int(cut[0]), named=True)
        notes.append(
            f"{len(cut)} parent cycle{'s' if len(cut) > 1 else ''} cut (e.g. at {first['name'][:80]!r},"
            f" span {str(first['span_id'])[:32]!r}, now without a parent)"
        )
    lanes = frame["lane"].hash().to_numpy()
    same = np.where((up >= 0) & (lanes[np.maximum(up, 0)] == lanes), up, -1)
    return up, same, notes


def _rows_of(ids: pl.Series, wanted: pl.Series) -> np.ndarray:
    """For each value of `wanted`: the first row of `ids` that holds it (-1: none, or null). Joined
    on the ids' 64-bit hashes (a string join costs ~10x more); a match is taken when a second,
    independent hash agrees too (two ids alike in both: ~2**-128)."""
    table = ids.hash().to_frame("h").with_row_index("row")
    keys = wanted.hash().to_frame("h")
    got = keys.join(table, on="h", how="left", maintain_order="left")
    if got.height != keys.height:  # a wanted hash held by several rows: its first row (rare, and costly)
        got = keys.join(table.unique("h", keep="first", maintain_order=True), on="h", how="left", maintain_order="left")
    found = got["row"].cast(pl.Int64).fill_null(-1).to_numpy(writable=True)
    found[~wanted.is_not_null().to_numpy()] = -1
    check = np.flatnonzero(found >= 0)
    second_ids = ids.hash(seed=7).to_numpy()
    second_wanted = wanted.hash(seed=7).to_numpy()
    wrong = check[second_ids[found[check]] != second_wanted[check]]
    if len(wrong):  # a hash shared by two ids: those rows by their strings
        exact = ids.to_frame("id").with_row_index("row").unique("id", keep="first", maintain_order=True)
        again = pl.DataFrame({"id": wanted.gather(wrong)}).join(exact, on="id", how="left", maintain_order="left")
        found[wrong] = again["row"].cast(pl.Int64).fill_null(-1).to_numpy()
    return found


def _linked(frame: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """`_up` and `_same` (rows of the parent anywhere, in the same lane; -1: none) and `depth`;
    and the problems of the spans' links and times (`_parents`, `_bad_times`)."""
    up, same, notes = _parents(frame)
    linked = frame.with_columns(
        pl.Series("_up", up),
        pl.Series("_same", same),
        pl.Series("depth", depths(same), dtype=pl.Int32),
        (pl.col("instant") | (pl.col("end") < pl.col("start")).fill_null(False)).alias("instant"),
    )
    return linked, notes + _bad_times(frame)


def _capped(frame: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """Span names and modules over NAME_MAX and phases over PHASE_MAX characters cut (an ellipsis
    ends them), and how many names and phases were, named."""
    long_name = pl.col("name").str.len_chars() > NAME_MAX
    long_phase = (pl.col("phase").str.len_chars() > PHASE_MAX).fill_null(False)
    long_module = (pl.col("module").str.len_chars() > NAME_MAX).fill_null(False)
    names, phases = frame.select(long_name.sum(), long_phase.sum()).row(0)
    if not names and not phases:
        return frame, []
    notes = [
        f"{n} span {what}{'s' if n > 1 else ''} over {limit} characters cut (the longest"
        f" {frame.select(pl.col(col).str.len_chars().max()).item()} characters)"
        for n, what, limit, col in ((names, "name", NAME_MAX, "name"), (phases, "phase", PHASE_MAX, "phase"))
        if n
    ]
    frame = frame.with_columns(
        pl.when(long_name)
        .then(pl.col("name").str.slice(0, NAME_MAX - 1) + "…")
        .otherwise(pl.col("name"))
        .alias("name"),
        pl.when(long_phase)
        .then(pl.col("phase").str.slice(0, PHASE_MAX - 1) + "…")
        .otherwise(pl.col("phase"))
        .alias("phase"),
        pl.when(long_module)
        .then(pl.col("module").str.slice(0, NAME_MAX - 1) + "…")
        .otherwise(pl.col("module"))
        .alias("module"),
    )
    return frame, notes


def _cut_identity(lanes: list[Lane]) -> list[str]:
    """A process's role, service, host and start method cut to PHASE_MAX characters, its command
    to COMMAND_MAX (they label lanes, panels and /metrics); how many were, named."""
    n = 0
    for lane in lanes:
        for attr, limit in _IDENTITY_LIMITS:
            value = getattr(lane, attr)
            if isinstance(value, str) and len(value) > limit:
                setattr(lane, attr, value[: limit - 1] + "…")
                n += 1
    if not n:
        return []
    return [f"{n} process identity value{'s' if n > 1 else ''} (role, service, host, command) too long: cut"]


def _bad_times(frame: pl.DataFrame) -> list[str]:
    """Spans that end before they start: drawn as instants at their start, and named."""
    back = frame.filter(pl.col("end").is_not_null() & (pl.col("end") < pl.col("start")))
    if not back.height:
        return []
    name, start, end = back.row(0, named=True)["name"], back["start"][0], back["end"][0]
    several = back.height > 1
    return [
        f"{back.height} span{'s' if several else ''} ending before {'they start' if several else 'it starts'}"
        f" (e.g. {name[:80]!r}, ending {(start - end) / 1e9:.6g} s before its start): drawn as instants at their start"
    ]


def _order_lanes(
    frame: pl.DataFrame, lanes_by_id: dict[str, Lane], t_first: int | None
) -> tuple[list[Lane], pl.DataFrame, pl.DataFrame]:
    """Lanes by node, role, rank and start; the table sorted by lane, start and arrival, with each
    span's idx, its parents' idx and its depth."""
    proc = (
        frame.select("lane", "phase", "name", "depth", "start")
        .filter((pl.col("phase") == "process") | (pl.col("name") == "process"))
        .sort("depth", "start", maintain_order=True)
        .group_by("lane", maintain_order=True)
        .first()
    )
    proc_start = dict(zip(proc["lane"].to_list(), proc["start"].to_list(), strict=True))
    first_start: dict[str, int] = {}
    if any(lane_id not in proc_start for lane_id in lanes_by_id):
        first_start = dict(frame.select("lane", "start").group_by("lane").agg(pl.col("start").min()).iter_rows())
    for lane in lanes_by_id.values():
        lane.start = proc_start.get(lane.id, first_start.get(lane.id, t_first or 0))
    hosts = node_order(list(lanes_by_id.values()))  # several hosts: lanes by node, then role and rank
    if len(hosts) > 1:
        names = node_names(hosts)
        for lane in lanes_by_id.values():
            lane.node = names[node_key(lane)]
    ordered = sorted(
        lanes_by_id.values(),
        key=lambda ln: (
            hosts[node_key(ln)],
            ROLE_ORDER.get(ln.role or "", 99),
            ln.rank is None,
            ln.rank or 0,
            ln.start,
            ln.id,
        ),
    )
    for i, lane in enumerate(ordered):
        lane.index = i
    index = {ln.id: i for i, ln in enumerate(ordered)}
    runs = frame["lane"].rle().struct.unnest()  # the source's spans come in runs of one lane
    lane_index = np.repeat(np.array([index[v] for v in runs["value"].to_list()], dtype=np.int32), runs["len"])
    # by lane, start and arrival: stable sorts, the last key first (a radix sort for the lanes)
    by_start = np.argsort(frame["start"].to_numpy(), kind="stable")
    old_rows = by_start[
        np.argsort(lane_index.astype(np.int16 if len(ordered) < 2**15 else np.int32)[by_start], kind="stable")
    ]
    new_of_old = np.empty(len(old_rows), dtype=np.int64)
    new_of_old[old_rows] = np.arange(len(old_rows), dtype=np.int64)

    def moved(column: str) -> pl.Series:
        """A column of rows (old numbering, -1: none) in the new order and numbering (null: none)."""
        values = frame[column].to_numpy()[old_rows]
        return pl.Series(column, np.where(values >= 0, new_of_old[np.maximum(values, 0)], -1)).replace(-1, None)

    # the wide columns (every span's attributes) stay where they are: the model reaches them by
    # `src` (`RunModel.side`); only the narrow ones are put in order
    side = frame.select("attrs", "attrs_pb")
    frame = (
        frame.drop("attrs", "attrs_pb", "parent_id", "lane", "_up", "_same")[old_rows]
        .with_columns(
            pl.int_range(pl.len(), dtype=pl.Int64).alias("idx"),
            pl.Series("lane", lane_index[old_rows]),
            moved("_same").alias("parent"),
            moved("_up").alias("up"),
            pl.Series("src", old_rows, dtype=pl.Int64),
        )
        .select(list(MODEL_SCHEMA))
    )
    counts = np.bincount(lane_index, minlength=len(ordered))
    offset = 0
    for lane in ordered:
        lane.offset, lane.count = offset, int(counts[lane.index])
        offset += lane.count
    return ordered, frame, side


def _command(value: Any) -> str | None:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, str):
        return value
    return None


def _lane_facts(model: RunModel, run_ready: int | None) -> None:
    """Each lane's process span, ready, window, phase seconds, coverage, gaps, top imports and open
    spans."""
    frame = model.core
    proc_rows = (
        model.matching(("process",), ("process",))
        .sort("depth", "idx")
        .group_by("lane", maintain_order=True)
        .agg(pl.col("idx").first())
    )
    proc_of = dict(proc_rows.iter_rows())
    work = ~model.array("structural")
    work[list(proc_of.values())] = False
    is_work = pl.lit(pl.Series(work))
    # until the first token: each lane ends with its last span before it, the lane that sent it there
    ends = ((), ("first_token",)) if model.until == "first_token" else (("ready",), ("ready",))
    own_ready = dict(
        model.matching(*ends)
        .filter(~pl.col("phase").is_in(STRUCTURAL_PHASES) & ~pl.col("idx").is_in(list(proc_of.values())))
        .group_by("lane")
        .agg(pl.col("start").min())
        .iter_rows()
    )
    before_ready: dict[int, int] = {}
    if run_ready is not None:
        before_ready = dict(
            frame.lazy()
            .filter(is_work & ~pl.col("in_progress") & ~pl.col("instant") & (pl.col("eff_end") <= run_ready))
            .group_by("lane")
            .agg(pl.col("eff_end").max())
            .collect()
            .iter_rows()
        )
    extent = {
        lane: (lo, hi)
        for lane, lo, hi in frame.select("lane", "start", "eff_end")
        .group_by("lane")
        .agg(pl.col("start").min(), pl.col("eff_end").max())
        .iter_rows()
    }
    for lane in model.lanes:
        i = lane.index
        proc = model.node(proc_of[i]) if i in proc_of else None
        lane.process_span = proc
        if i in own_ready:
            lane.ready_ns = own_ready[i]
        elif run_ready is not None:
            lane.ready_ns = before_ready.get(i)
        if proc is not None:
            start, end = proc.start, proc.eff_end
        else:
            start, end = extent.get(i, (0, 0))
        if lane.ready_ns is not None and lane.ready_ns >= start:
            end = min(end, lane.ready_ns) if proc is not None and not proc.in_progress else lane.ready_ns
            if model.until == "first_token" and i in own_ready:
                end = lane.ready_ns  # the root's process span ends at ready: its window goes on to the token
        lane.start, lane.end = start, max(start, end)
        if proc is not None and proc.up is not None:
            launcher = model.node(proc.up)
            if launcher.lane != i:
                lane.launched_by = launcher
    timed = work & ~model.array("instant")
    # a span inside its parent's interval changes no union its parent is in: most imports
    contained, same_phase = _contained(model, timed)
    phases: dict[int, dict[str, int]] = {}
    intervals = frame.select("lane", "phase", "start", "eff_end")
    unions = union_by(intervals.filter(timed & ~same_phase), ["lane", "phase"], "start", "eff_end")
    for lane_i, phase, ns in unions.iter_rows():
        phases.setdefault(lane_i, {})[phase] = ns
    windows = pl.DataFrame(
        [(ln.index, ln.start, ln.end) for ln in model.lanes],
        schema={"lane": pl.Int32, "w_start": pl.Int64, "w_end": pl.Int64},
        orient="row",
    )
    clipped = (
        intervals.lazy()
        .filter(pl.lit(pl.Series(timed & ~contained)))
        .join(windows.lazy(), on="lane", how="left")
        .filter(pl.col("eff_end") > pl.col("w_start"))
        .select(
            "lane",
            pl.max_horizontal("start", "w_start").alias("s"),
            pl.min_horizontal("eff_end", "w_end").alias("e"),
        )
        .filter(pl.col("e") > pl.col("s"))
        .collect()
    )
    segments = merged_by(clipped, ["lane"], "s", "e")
    covered = dict(segments.group_by("lane").agg((pl.col("e") - pl.col("s")).sum()).iter_rows())
    gaps = _gaps(segments, windows)
    top_import = work & model.array("is_import") & ~model.array("same_phase")  # an import's parent is no import
    tops = (
        frame.select("idx", "lane", "module", "name", "duration")
        .filter(top_import)
        .sort("lane", "duration", "idx", descending=[False, True, False])
        .group_by("lane", maintain_order=True)
        .head(5)
    )
    top_of: dict[int, list[tuple[str, int]]] = {}
    for lane_i, mod, name, dur in tops.select("lane", "module", "name", "duration").iter_rows():
        top_of.setdefault(lane_i, []).append((mod or name, dur))
    open_rows = frame.filter(pl.col("in_progress"))
    for lane in model.lanes:
        i = lane.index
        lane.phases = phases.get(i, {})
        lane.import_ns = lane.phases.get("import", 0)
        window = lane.end - lane.start
        covered_ns = covered.get(i, 0)
        lane.coverage = (covered_ns / window) if window > 0 else None
        lane.unexplained_ns = max(0, window - covered_ns)
        lane.gaps = gaps.get(i, [])
        lane.top_imports = top_of.get(i, [])
        lane.in_progress = model.nodes(open_rows.filter(pl.col("lane") == i)) if open_rows.height else []


def _contained(model: RunModel, timed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, for the rows `timed` marks (work spans that are not instants): whether it lies
    within its parent's interval, its parent being one of them; and whether that parent also has
    its phase."""
    parent = model.array("parent")
    p = np.maximum(parent, 0)
    start, end = model.array("start"), model.array("eff_end")
    inside = timed & (parent >= 0) & timed[p] & (start >= start[p]) & (end <= end[p])
    return inside, inside & model.array("same_phase")


def _gaps(segments: pl.DataFrame, windows: pl.DataFrame) -> dict[int, list[tuple[int, int]]]:
    """Per lane: the MAX_GAPS longest stretches of at least GAP_MIN_NS its window has no span in,
    in order."""
    bounds = segments.join(windows, on="lane", how="right").with_columns(
        pl.col("e").cum_max().shift(1).over("lane").alias("prev")
    )
    inner = bounds.filter(pl.col("s").is_not_null()).select(
        "lane", pl.coalesce(pl.max_horizontal("prev", "w_start"), "w_start").alias("a"), pl.col("s").alias("b")
    )
    last = bounds.group_by("lane").agg(
        pl.coalesce(pl.max_horizontal(pl.col("e").max(), pl.col("w_start").first()), pl.col("w_start").first()).alias(
            "a"
        ),
        pl.col("w_end").first().alias("b"),
    )
    found = (
        pl.concat([inner, last.select("lane", "a", "b")], how="vertical")
        .filter((pl.col("b") - pl.col("a")) >= GAP_MIN_NS)
        .sort("lane", pl.col("a") - pl.col("b"), "a")
        .group_by("lane", maintain_order=True)
        .head(MAX_GAPS)
        .sort("lane", "a")
    )
    out: dict[int, list[tuple[int, int]]] = {}
    for lane_i, a, b in found.iter_rows():
        out.setdefault(lane_i, []).append((a, b))
    return out


def children_ns(model: RunModel) -> np.ndarray:
    """Per row: the summed duration of its children in its lane."""
    parent = model.array("parent")
    has = parent >= 0
    out = np.zeros(model.spans.height, dtype=np.int64)
    np.add.at(out, parent[has], model.array("duration")[has])
    return out


def import_hotspots(model: RunModel, limit: int = TOP_HOTSPOTS) -> list[dict[str, Any]]:
    """Per imported module, over every lane: cumulative and self seconds, the processes and ranks
    that paid it, how often; the `limit` longest (cumulative), then by name."""
    if limit <= 0:
        return []
    imports = (
        model.spans.select("lane", "phase", "module", "name", "duration", "self_us")
        .with_columns(pl.Series("kids", children_ns(model)))
        .filter(model.array("is_import"))
        .with_columns(
            pl.when(pl.col("module").is_null())
            .then(pl.col("name").hash())
            .otherwise(pl.col("module").hash())
            .alias("key")
        )
    )
    # summed per module's 64-bit hash (a string group-by costs ~5x more), the top `limit` taken, and
    # only their rows counted by name: a hash two modules share is never one module's
    sums = imports.group_by("key").agg(pl.col("duration").sum().alias("cum"))
    if not sums.height:
        return []
    if sums.height > limit:  # the limit-th longest, then every module as long: ties stay in
        sums = sums.filter(pl.col("cum") >= sums["cum"].top_k(limit).min())
    slots = [rank_slot(lane) for lane in model.lanes]
    slot_ids = {slot: i for i, slot in enumerate(dict.fromkeys(slots))}
    slot = pl.col("lane").replace_strict({i: slot_ids[s] for i, s in enumerate(slots)}, return_dtype=pl.Int64)
    top = (
        imports.filter(pl.col("key").is_in(sums["key"].implode()))
        .with_columns(
            pl.coalesce("module", "name").alias("mod"),
            pl.when(pl.col("self_us").is_not_null())
            .then((pl.col("self_us") * 1000).cast(pl.Int64))
            .otherwise((pl.col("duration") - pl.col("kids")).clip(lower_bound=0))
            .alias("self"),
        )
        .group_by("mod")
        .agg(
            pl.col("duration").sum().alias("cum"),
            pl.col("self").sum(),
            pl.col("lane").n_unique().alias("processes"),
            slot.n_unique().alias("ranks_paid"),
            pl.len().alias("imports"),
        )
        .sort(["cum", "mod"], descending=[True, False])
        .head(limit)
        .select("mod", "cum", "self", "processes", "ranks_paid", "imports")
    )
    return [
        {"module": m, "cumulative_s": c / 1e9, "self_s": s / 1e9, "processes": p, "ranks_paid": r, "imports": n}
        for m, c, s, p, r, n in top.iter_rows()
    ]
