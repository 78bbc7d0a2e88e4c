"""JSON view of the waterfall model (`GET /startup`, `starttrace report --json`).

Times are seconds (or microseconds for span rows) relative to the run start `t0`."""

from __future__ import annotations

import json
import math
from typing import Any

import polars as pl

from starttrace.analysis.critical_path import path_by_lane, path_phases
from starttrace.analysis.first_request import first_request_summary
from starttrace.analysis.folding import fold_groups, untraced_programs
from starttrace.analysis.model import STRUCTURAL_PHASES, Lane, RunModel, SpanNode
from starttrace.analysis.nodes import node_rows
from starttrace.analysis.plan import plan
from starttrace.run import MODULE_KEY, decode_attrs

SPAN_FIELDS = ["id", "parent", "name", "phase", "start_us", "end_us", "depth", "flags", "attrs"]
FLAG_IN_PROGRESS, FLAG_INSTANT, FLAG_ERROR = 1, 2, 4
_HIDDEN_ATTRS = ("starttrace.phase", "starttrace.in_progress")
SHOWN_MAX = 4_096  # characters of an attribute's text value in a span row (the rest: counted in the text)


def dumps(obj: Any, indent: int | None = None) -> str:
    """Strict JSON text of `obj` (RFC 8259: no bare NaN or Infinity, which browsers refuse):
    non-finite numbers become null. Compact unless `indent`; what JSON has no type for, as text.
    The common case, no such number, costs one encoding."""
    separators = None if indent else (",", ":")
    try:
        return json.dumps(obj, allow_nan=False, default=str, indent=indent, separators=separators)
    except ValueError:  # a NaN or infinity somewhere (the deep copy is made only then)
        return json.dumps(finite(obj), allow_nan=False, default=str, indent=indent, separators=separators)


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float (in dicts, lists and tuples, at any depth) as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def attr_text(value: Any) -> Any:
    """An attribute value as shown: a non-finite float keeps its text ("NaN", "Infinity",
    "-Infinity"), in lists too; a text over SHOWN_MAX characters is cut, saying how much was;
    every other value as it is."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (list, tuple)):
        return [attr_text(v) for v in value]
    if isinstance(value, str) and len(value) > SHOWN_MAX:
        return f"{value[:SHOWN_MAX]}… ({len(value) - SHOWN_MAX} characters cut)"
    return value


def to_json(model: RunModel, include_spans: bool = True) -> dict[str, Any]:
    t0 = model.t0
    s = model.seconds
    lanes_out = [_lane_json(model, lane) for lane in model.lanes]
    if include_spans:
        rows = span_rows(model, model.spans)  # the table is sorted by lane: each lane's rows are one slice
        for lane, entry in zip(model.lanes, lanes_out, strict=True):
            entry["spans"] = rows[lane.offset : lane.offset + lane.count]
    in_progress = [
        dict(_open_span(n, model), lane=n.lane, label=model.lanes[n.lane].label)
        for lane in model.lanes
        for n in lane.in_progress
        if not _is_process_span(lane, n) and n.phase not in STRUCTURAL_PHASES
    ]
    in_progress.sort(key=lambda d: -d["open_s"])
    return {
        "run_id": model.run_id,
        "trace_id": model.trace_id,
        "service": model.service,
        "source": model.source,
        "status": model.status,
        "live": model.live,
        "version": model.version,
        "start_ns": t0,
        "now_ns": model.now_ns,
        "duration_s": round((model.t_end - t0) / 1e9, 6),
        "startup_s": round(model.startup_s, 6),
        "ready_s": s(model.ready_ns),
        # launch to the first response byte of the first served request (None: no request served)
        "time_to_first_token_s": model.time_to_first_token_s,
        "until": model.until,  # where the lanes' windows, breakdowns and the critical path end
        "first_request": first_request_summary(model),
        "phases": model.phases,
        "problems": model.problems,
        "meta": model.meta,
        "span_fields": SPAN_FIELDS,
        "lanes": lanes_out,
        "ranks": rank_table(model),
        "in_progress": in_progress[:200],
        "critical_path": _path_json(model),
        # the run's time to ready by phase: the critical path's steps, by their lanes' exclusive timelines
        "ready_by_phase": {label: round(ns / 1e9, 6) for label, ns in path_phases(model).items()},
        "critical_path_by_lane": [
            {"lane": lane, "label": model.lanes[lane].label, "seconds": round(ns / 1e9, 6)}
            for lane, ns in path_by_lane(model.critical_path)
        ],
        "import_hotspots": model.hotspots[:100],
        "preload_advice": model.preload_advice,
        "cuda_audit": model.cuda_audit,
        "nodes": node_rows(model),  # several hosts: host, clock offset and error per node (docs/multinode.md)
        "findings": model.findings,  # docs/findings.md; preload_advice and cuda_audit are their older forms
        "plan": plan(model),  # the time to ready with every finding's action applied (analysis.plan)
        "folded": fold_groups(model),  # short helpers the views fold (every lane stays in `lanes`)
        "untraced_programs": untraced_programs(model),  # launched children that are not Python: expected
    }


def _lane_json(model: RunModel, lane: Lane) -> dict[str, Any]:
    s = model.seconds
    return {
        "index": lane.index,
        "id": lane.id,
        "label": lane.label,
        "role": lane.role,
        "rank": lane.rank,
        "local_rank": lane.local_rank,
        "world_size": lane.world_size,
        "pid": lane.pid,
        "ppid": lane.ppid,
        "start_method": lane.start_method,
        "service": lane.service,
        "host": lane.host,
        "node": lane.node,
        "command": lane.command,
        "exited": lane.exited,
        "exit_code": lane.exit_code,
        "warnings": lane.warnings,
        "start_s": s(lane.start),
        "end_s": s(lane.end),
        "time_to_ready_s": s(lane.ready_ns),
        "ready_since_start_s": None if lane.ready_ns is None else round((lane.ready_ns - lane.start) / 1e9, 6),
        "phases": {ph: round(ns / 1e9, 6) for ph, ns in lane.phases.items()},
        # exclusive: each instant of [start_s, end_s] to the innermost span's phase; adds up to end_s - start_s
        "breakdown": {label: round(ns / 1e9, 6) for label, ns in lane.breakdown.items()},
        "after_ready": lane.after_ready,
        "import_s": round(lane.import_ns / 1e9, 6),
        "top_imports": [{"module": m, "seconds": round(d / 1e9, 6)} for m, d in lane.top_imports],
        "coverage": None if lane.coverage is None else round(lane.coverage, 4),
        "unexplained_s": round(lane.unexplained_ns / 1e9, 6),
        "gaps": [{"start_s": s(a), "end_s": s(b), "seconds": round((b - a) / 1e9, 6)} for a, b in lane.gaps],
        "in_progress": [_open_span(n, model) for n in lane.in_progress],
        "launched_by": None
        if lane.launched_by is None
        else {"lane": lane.launched_by.lane, "span": lane.launched_by.id, "name": lane.launched_by.name},
        "span_count": lane.count,
    }


def _path_json(model: RunModel) -> list[dict[str, Any]]:
    s = model.seconds
    return [
        {
            "lane": st.lane,
            "label": model.lanes[st.lane].label,
            "name": st.name,
            "phase": st.phase,
            "kind": st.kind,
            "start_s": s(st.start),
            "end_s": s(st.end),
            "seconds": round((st.end - st.start) / 1e9, 6),
        }
        for st in model.critical_path
    ]


def rank_table(model: RunModel) -> list[dict[str, Any]]:
    out = []
    for lane in model.lanes:
        out.append(
            {
                "lane": lane.index,
                "label": lane.label,
                "role": lane.role,
                "rank": lane.rank,
                "pid": lane.pid,
                "time_to_ready_s": model.seconds(lane.ready_ns),
                "phases": {ph: round(ns / 1e9, 6) for ph, ns in lane.phases.items()},
                "breakdown": {label: round(ns / 1e9, 6) for label, ns in lane.breakdown.items()},
                "coverage": None if lane.coverage is None else round(lane.coverage, 4),
            }
        )
    return out


def _open_span(n: SpanNode, model: RunModel) -> dict[str, Any]:
    return {
        "id": n.id,
        "name": n.name,
        "phase": n.phase,
        "start_s": model.seconds(n.start),
        "open_s": round((n.eff_end - n.start) / 1e9, 6),
    }


def _is_process_span(lane: Lane, n: SpanNode) -> bool:
    return lane.process_span is not None and n.idx == lane.process_span.idx


def span_rows(model: RunModel, rows: pl.DataFrame, pos: bool = False) -> list[list[Any]]:
    """Rows of the model's span table (the table, a slice of it or of its core columns, in any
    order) as the JSON view's span rows (SPAN_FIELDS; with `pos`, the span's position in its lane
    appended): columns computed by polars over all the rows at once, the attributes decoded only
    for these rows."""
    if not rows.height:
        return []
    if "span_id" not in rows.columns:  # core columns: the wide ones of just these rows
        rows = model.spans[rows["idx"]]
    t0 = model.t0
    offset = pl.col("lane").replace_strict(  # the lane's first row: positions count from it
        [lane.index for lane in model.lanes], [lane.offset for lane in model.lanes], return_dtype=pl.Int64
    )
    has_error = pl.col("error").is_not_null() & (pl.col("error") != "")
    cols = rows.select(
        pl.col("span_id"),
        pl.when(pl.col("parent").is_not_null()).then(pl.col("parent") - offset).otherwise(-1).alias("parent"),
        pl.col("name"),
        pl.col("phase"),
        ((pl.col("start") - t0) // 1000).alias("start_us"),
        pl.when(pl.col("in_progress")).then(None).otherwise((pl.col("eff_end") - t0) // 1000).alias("end_us"),
        pl.col("depth"),
        (
            pl.col("in_progress").cast(pl.Int32) * FLAG_IN_PROGRESS
            + pl.col("instant").cast(pl.Int32) * FLAG_INSTANT
            + has_error.cast(pl.Int32) * FLAG_ERROR
        ).alias("flags"),
        (pl.col("idx") - offset).alias("pos"),
        pl.col("error"),
    ).hstack(model.attrs_columns(rows["idx"]))
    names, phases = cols["name"].to_list(), cols["phase"].to_list()
    extras = [
        _extra(attrs, phase, name, error)
        for attrs, phase, name, error in zip(_attrs(cols), phases, names, cols["error"].to_list(), strict=True)
    ]
    fields = [
        cols["span_id"].to_list(),
        cols["parent"].to_list(),
        names,
        phases,
        cols["start_us"].to_list(),
        cols["end_us"].to_list(),
        cols["depth"].to_list(),
        cols["flags"].to_list(),
        extras,
    ]
    if pos:
        fields.append(cols["pos"].to_list())
    return [list(row) for row in zip(*fields, strict=True)]


def _attrs(cols: pl.DataFrame) -> list[dict[str, Any] | None]:
    """Each row's attributes (None: it has none): the JSON texts parsed at once as one array, the
    OTLP bytes row by row."""
    texts = cols["attrs"]
    parsed: list[Any] = []
    if texts.null_count() < len(texts):
        try:
            parsed = json.loads("[" + texts.fill_null("null").str.join(",").item() + "]")
        except ValueError:
            parsed = []
    if len(parsed) != len(texts):  # no text, or one that is not JSON: row by row
        parsed = [decode_attrs(text, None) if text else None for text in texts.to_list()]
    if cols["attrs_pb"].null_count() < cols.height:
        parsed = [
            decode_attrs(None, raw) if raw else got for got, raw in zip(parsed, cols["attrs_pb"].to_list(), strict=True)
        ]
    return [got if isinstance(got, dict) else None for got in parsed]


def _extra(attrs: dict[str, Any] | None, phase: str, name: str, error: str | None) -> dict[str, Any] | None:
    """A span row's `attrs`: its attributes (a dict of its own) but the ones the row says already
    (its phase, the module an import's name gives), its error."""
    if not attrs and not error:
        return None
    extra = {k: attr_text(v) for k, v in attrs.items()} if attrs else {}
    for key in _HIDDEN_ATTRS:
        extra.pop(key, None)
    if phase == "import" and extra.get(MODULE_KEY) == name[7:]:
        del extra[MODULE_KEY]
    if error:
        extra["error"] = error
    return extra or None
