"""Export detail levels: which spans of a run a trace backend gets.

A real vLLM TP=2 start records 21-26k spans (about 9 MB of OTLP protobuf): past Tempo's default
per-trace limit and past what the Jaeger UI draws. `summary` is the part of a run a backend can
hold:

- every span that is not an import (`process`, `ready`, `vllm.*`, `cuda.init`, `dist.init`, ...);
- imports still in progress (where a process hangs);
- of the other imports, per process, the longest `import_budget` (default 300). Not a fixed duration
  threshold: how many imports last 1 ms differs by machine, a budget does not;
- the ancestors of every kept span, so nothing kept is orphaned. A child is never longer than its
  parent, so the longest-N set holds its ancestors anyway; candidates are ranked by
  (-duration, depth, start, id), so a parent wins a tie with its child, and each candidate is taken
  together with its missing ancestors, or not at all, when they do not fit the budget. Imports
  kept whatever the budget (open ones, and the ancestors of kept non-import spans, e.g. the import
  that ran `cuda.init`) count against it first.
- Dropped imports stay accounted for on the nearest kept ancestor: `DROPPED_COUNT_ATTR` (how many
  import spans were dropped below it, nested ones included) and `DROPPED_SECONDS_ATTR` (the
  seconds of the dropped subtrees that hang directly under it).

`full` keeps every span and marks the summary set with `SUMMARY_ATTR = true` (the kept parents
carry the same accounting attributes), so a Collector can send full detail to the starttrace
service and only the marked spans to Jaeger and Tempo (deploy/otel-collector.yaml).

Pure functions over the run type: no I/O, no environment (views/export.py reads the settings).
Table operations over the run's span table first: what is kept whatever the budget, the depths and
the ranked candidates are filters, sorts and joins; the nearest kept ancestor of every dropped span
is a climb of joins. Plain Python walks only the few rows a budget takes (each process's longest
imports, with a missing ancestor only in bad input: a child longer than its parent).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from starttrace.analysis.model import NAME_PHASES
from starttrace.analysis.phases import phase_of
from starttrace.analysis.trees import cut_cycles, depths, nearest_marked
from starttrace.run import Run, Span, decode_attrs, empty_spans, spans_table

SUMMARY_ATTR = "starttrace.summary"
DROPPED_COUNT_ATTR = "starttrace.summary.dropped_imports"
DROPPED_SECONDS_ATTR = "starttrace.summary.dropped_import_s"
DETAILS = ("full", "summary")
DEFAULT_DETAIL = "full"
DEFAULT_IMPORT_BUDGET = 300


@dataclass(frozen=True)
class Selection:
    """The summary set of a run: span ids kept, and the attributes added to the kept spans."""

    kept: frozenset[str]
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)  # span id -> accounting attributes
    dropped: int = 0  # import spans left out of the summary set


def is_import(span: Span) -> bool:
    return phase_of(span.name, span.attrs) == "import"


def import_expr() -> pl.Expr:
    """`is_import` over a span table: its `phase` column, else the phase its name gives."""
    by_name = ~pl.col("name").is_in(list(NAME_PHASES)) & pl.col("name").str.starts_with("import ")
    return pl.when(pl.col("phase").is_not_null()).then(pl.col("phase") == "import").otherwise(by_name)


def _rows(run: Run) -> pl.DataFrame:
    """Every span of the run (root spans first, lane null), with what the selection reads of it."""
    roots = spans_table(("", s) for s in run.root_spans).with_columns(pl.lit(None, pl.String).alias("lane"))
    table = pl.concat([roots, run.spans]) if run.root_spans else run.spans
    return table.select(
        "lane",
        "span_id",
        "parent_id",
        "start",
        import_expr().fill_null(False).alias("imp"),
        (pl.col("in_progress").fill_null(False) | pl.col("end").is_null()).alias("open"),
        (pl.coalesce("end", "start") - pl.col("start")).clip(lower_bound=0).alias("dur"),
    )


def _tree(rows: pl.DataFrame) -> pl.DataFrame:
    """span_id -> parent (the first span of an id; no parent where it names none, itself, or a span
    not in the run; a parent cycle in bad input cut once, `trees.cut_cycles`), its row `up` in this
    table (-1: none) and depth (ancestors in the run, 0: a root). Linear in the rows, logarithmic in
    the depth (a 20k-deep chain is ~16 vectorised rounds, not 20k passes)."""
    tree = rows.select("span_id", "parent_id").unique("span_id", keep="first", maintain_order=True)
    up = (
        tree.select("parent_id")
        .join(tree.select("span_id").with_row_index("up"), left_on="parent_id", right_on="span_id", how="left")
        .get_column("up")
        .cast(pl.Int64)
        .fill_null(-1)
        .to_numpy(writable=True)
    )
    up[up == np.arange(len(up))] = -1  # its own parent
    up, _ = cut_cycles(up)
    has_parent = pl.Series(up >= 0)
    return tree.with_columns(
        pl.when(has_parent).then(tree["span_id"].gather(np.maximum(up, 0))).alias("parent_id"),
        pl.Series("up", up, dtype=pl.Int64),
        pl.Series("depth", depths(up), dtype=pl.Int64),
    )


def summary_selection(run: Run, import_budget: int = DEFAULT_IMPORT_BUDGET) -> Selection:
    """The summary set of `run` (see the module text)."""
    if import_budget < 0:
        raise ValueError(f"the import budget must be >= 0, not {import_budget}")
    rows = _rows(run)
    tree = _tree(rows)
    lanes = [p.instance_id for p in run.processes]
    # what is kept whatever the budget: every non-import span and every open import
    forced = rows.filter(~pl.col("imp") | pl.col("open"))
    kept: set[str] = set(forced["span_id"].to_list())
    used = dict.fromkeys(lanes, 0)  # imports kept per process whatever the budget
    for lane, n in forced.filter(pl.col("imp") & pl.col("lane").is_not_null()).group_by("lane").len().iter_rows():
        if lane in used:
            used[lane] += n
    # the walks below climb only through spans not kept: closed imports (the rest is kept)
    closed = rows.filter(pl.col("imp") & ~pl.col("open")).unique("span_id", keep="first", maintain_order=True)
    closed = closed.join(tree.select("span_id", pl.col("parent_id").alias("up"), "depth"), on="span_id", how="left")
    up: dict[str, str | None] = dict(zip(closed["span_id"].to_list(), closed["up"].to_list(), strict=True))
    owner: dict[str, str | None] = dict(zip(closed["span_id"].to_list(), closed["lane"].to_list(), strict=True))

    def missing(parent: str | None, seen: str) -> list[str]:
        """The ancestors not kept above a span whose parent is `parent`, up to the first kept one."""
        out: list[str] = []
        node = parent
        while node is not None and node not in kept and node in up and node != seen and node not in out:
            out.append(node)
            node = up[node]
        return out

    forced_parents = forced.join(tree.select("span_id", pl.col("parent_id").alias("up")), on="span_id", how="left")
    for span_id, parent in forced_parents.select("span_id", "up").iter_rows():  # their ancestors, whatever the budget
        for ancestor in missing(parent, span_id):
            kept.add(ancestor)
            lane = owner.get(ancestor)
            if lane in used:
                used[lane] += 1
    # per process, its longest imports while they fit, each with its missing ancestors
    budgets = pl.DataFrame(
        {"lane": lanes, "budget": [import_budget - used[lane] for lane in lanes]},
        schema={"lane": pl.String, "budget": pl.Int64},
    ).unique("lane", keep="first")
    candidates = (
        closed.filter(~pl.col("span_id").is_in(list(kept)))
        .join(budgets.filter(pl.col("budget") > 0), on="lane")
        .sort(["lane", "dur", "depth", "start", "span_id"], descending=[False, True, False, False, False])
        .with_columns(pl.int_range(pl.len()).over("lane").alias("k"))
    )
    head = candidates.filter(pl.col("k") < pl.col("budget"))  # all a budget takes, unless a chain does not fit
    for (lane,), part in head.partition_by("lane", as_dict=True, maintain_order=True).items():
        budget = int(part["budget"][0])

        def ranked(lane: Any = lane, part: pl.DataFrame = part) -> Iterator[tuple[str, str | None]]:
            yield from part.select("span_id", "up").iter_rows()
            rest = candidates.filter((pl.col("lane") == lane) & (pl.col("k") >= pl.col("budget")))
            yield from rest.select("span_id", "up").iter_rows()

        for span_id, parent in ranked():
            if span_id in kept:
                continue  # taken already as the ancestor of a shorter one (bad input: child longer)
            chain = missing(parent, span_id)
            if 1 + len(chain) > budget:
                continue
            kept.add(span_id)
            kept.update(chain)
            budget -= 1 + len(chain)
            if budget == 0:
                break
    extra, dropped = _accounting(run, rows, tree, kept)
    return Selection(frozenset(kept), extra, dropped)


def _accounting(
    run: Run, rows: pl.DataFrame, tree: pl.DataFrame, kept: set[str]
) -> tuple[dict[str, dict[str, Any]], int]:
    """Per kept span: how many imports below it were dropped, and the seconds of the dropped
    subtrees directly under it (they are siblings, so their seconds do not overlap on one thread).
    A dropped span without a kept ancestor (its parent is not in the run) is accounted on its
    process's `process` span, else on the run's root span. The nearest kept ancestor of every
    dropped span is found by climbing the tree one join per level."""
    kept_list = list(kept)
    dropped_rows = rows.filter(~pl.col("span_id").is_in(kept_list))
    if not dropped_rows.height:
        return {}, 0
    root = run.root_spans[0].span_id if run.root_spans else None
    own = {p.instance_id: p.process_span_id for p in run.processes if p.process_span_id in kept}
    # each dropped span's nearest kept ancestor, over the tree's rows (trees.nearest_marked: log(depth) rounds)
    is_kept = tree["span_id"].is_in(kept_list).to_numpy()
    nearest = nearest_marked(tree["up"].to_numpy(), is_kept)
    at = (
        dropped_rows.select("span_id")
        .join(tree.select("span_id").with_row_index("t"), on="span_id", how="left", maintain_order="left")
        .get_column("t")
        .to_numpy()
    )
    up = tree["up"].to_numpy()[at]
    target = nearest[at]
    targets = dropped_rows.select(
        "dur",
        # a head: the top of a dropped subtree (its parent kept, or none in the run)
        pl.Series("head", (up < 0) | is_kept[np.maximum(up, 0)]),
        pl.when(pl.Series(target >= 0))
        .then(tree["span_id"].gather(np.maximum(target, 0)))
        .otherwise(pl.col("lane").replace_strict(own, default=root, return_dtype=pl.String))
        .alias("target"),
    ).filter(pl.col("target").is_not_null())
    sums = targets.group_by("target", maintain_order=True).agg(
        pl.len().alias("n"), pl.col("dur").filter(pl.col("head")).sum().alias("ns")
    )
    extra = {
        sid: {DROPPED_COUNT_ATTR: n, DROPPED_SECONDS_ATTR: round((ns or 0) / 1e9, 6)} for sid, n, ns in sums.iter_rows()
    }
    return extra, dropped_rows.height


def _marked(table: pl.DataFrame, selection: Selection) -> pl.DataFrame:
    """The table with the summary mark and the accounting attributes in the kept rows' attributes
    (JSON text: the keys appended, so they win as `{**attrs, ...}` would; a kept row with OTLP bytes
    has its attributes decoded first, alone, into JSON text)."""
    kept = pl.col("span_id").is_in(list(selection.kept))
    table = table.with_row_index("_i")
    pb = table.filter(kept & pl.col("attrs_pb").is_not_null()).select("_i", "attrs_pb")
    if pb.height:
        texts = [json.dumps(decode_attrs(None, raw), default=str) for raw in pb["attrs_pb"].to_list()]
        table = (
            table.join(
                pb.select("_i", pl.Series("_text", texts, pl.String)), on="_i", how="left", maintain_order="left"
            )
            .with_columns(
                pl.coalesce("_text", "attrs").alias("attrs"),
                pl.when(pl.col("_text").is_null()).then(pl.col("attrs_pb")).alias("attrs_pb"),
            )
            .drop("_text")
        )
    extra = pl.DataFrame(
        {
            "span_id": list(selection.extra),
            "_extra": [
                "".join(f",{json.dumps(k)}:{json.dumps(v)}" for k, v in e.items()) for e in selection.extra.values()
            ],
        },
        schema={"span_id": pl.String, "_extra": pl.String},
    )
    body = pl.col("attrs").str.strip_chars().str.strip_suffix("}")
    suffix = pl.lit(f",{json.dumps(SUMMARY_ATTR)}:true") + pl.col("_extra").fill_null("")
    marked = (
        pl.when(body.is_null() | (body.str.strip_chars() == "{"))
        .then(pl.lit("{") + suffix.str.slice(1) + pl.lit("}"))
        .otherwise(body + suffix + pl.lit("}"))
    )
    return (
        table.join(extra, on="span_id", how="left", maintain_order="left")
        .with_columns(pl.when(kept).then(marked).otherwise(pl.col("attrs")).alias("attrs"))
        .drop("_i", "_extra")
    )


def apply_detail(run: Run, detail: str = DEFAULT_DETAIL, import_budget: int = DEFAULT_IMPORT_BUDGET) -> Run:
    """The run as exported at `detail`: `full` (every span, the summary set marked) or `summary`
    (the summary set only). The run passed in is not changed."""
    if detail not in DETAILS:
        raise ValueError(f"unknown detail {detail!r}; one of {', '.join(DETAILS)}")
    selection = summary_selection(run, import_budget)
    table = run.spans if detail == "full" else run.spans.filter(pl.col("span_id").is_in(list(selection.kept)))
    root_spans = []
    for span in run.root_spans:
        if span.span_id in selection.kept:
            attrs = {**span.attrs, SUMMARY_ATTR: True, **selection.extra.get(span.span_id, {})}
            root_spans.append(dataclasses.replace(span, attrs=attrs))
        elif detail == "full":
            root_spans.append(span)
    spans = _marked(table, selection) if table.height else empty_spans()
    return dataclasses.replace(run, spans=spans, root_spans=root_spans)
