"""The run's spans as one table (Perfetto's slice table: ts, dur, depth, parent, track).

One row per span: `lane` (the track), `idx` (the span's index in the run, sorted by start),
`parent` (the parent's `idx` in the same lane, else null), `depth`, `name`, `phase`, `start`,
`end` (the effective end: now or the run's last moment while in progress) and `instant`. Times
are epoch nanoseconds. The analysis passes that need every span at once (the exclusive
breakdown, the findings' sums) are table operations over it.
"""

from __future__ import annotations

import polars as pl

from starttrace.analysis.model import RunModel

_I64_MAX = 2**63 - 1
_I64_MIN = -(2**63)

SPAN_SCHEMA: dict[str, pl.DataType] = {
    "lane": pl.Int32(),
    "idx": pl.Int64(),
    "parent": pl.Int64(),
    "depth": pl.Int32(),
    "name": pl.String(),
    "phase": pl.String(),
    "start": pl.Int64(),
    "end": pl.Int64(),
    "instant": pl.Boolean(),
}


def as_int64(t: int) -> int:
    """A time as int64 (a journal can hold any integer; polars cannot)."""
    return _I64_MAX if t > _I64_MAX else _I64_MIN if t < _I64_MIN else t


def span_table(model: RunModel) -> pl.DataFrame:
    """The table of the model's spans, built once per model (cached on it). Imports nested in an
    import of the same lane are left out: they never change which phase an instant belongs to
    (their parent is an import too) and no pass over the table asks for them (the import passes
    walk the span tree); in a big run they are nine spans in ten."""
    if model.span_frame is not None:
        return model.span_frame  # type: ignore[no-any-return]
    spans = [
        n
        for n in model.spans
        if n.phase != "import" or (p := n.parent_node) is None or p.phase != "import" or p.lane != n.lane
    ]
    parents: list[int | None] = []
    for n in spans:
        p = n.parent_node
        parents.append(p.idx if p is not None and p.lane == n.lane else None)
    frame = pl.DataFrame(
        {
            "lane": [n.lane for n in spans],
            "idx": [n.idx for n in spans],
            "parent": parents,
            "depth": [n.depth for n in spans],
            "name": [n.name for n in spans],
            "phase": [n.phase for n in spans],
            "start": [as_int64(n.start) for n in spans],
            "end": [as_int64(n.eff_end) for n in spans],
            "instant": [n.instant for n in spans],
        },
        schema=SPAN_SCHEMA,
    )
    model.span_frame = frame
    return frame


def spans_named(model: RunModel, names: tuple[str, ...], attrs: dict[str, pl.DataType]) -> pl.DataFrame:
    """The rows of spans with one of `names`, with the attributes `attrs` (key -> column type) as
    columns (null where a span has none or one of another type). A few spans per process: their
    attributes are read from the spans themselves."""
    rows = span_table(model).filter(pl.col("name").is_in(list(names)))
    spans = model.spans
    columns = {}
    for key, dtype in attrs.items():
        values = []
        for idx in rows["idx"].to_list():
            value = spans[idx].attrs.get(key)
            values.append(value if _fits(value, dtype) else None)
        columns[key] = pl.Series(key, values, dtype=dtype)
    return rows.with_columns(**columns) if columns else rows


def _fits(value: object, dtype: pl.DataType) -> bool:
    if value is None or isinstance(value, bool):
        return False
    if dtype == pl.String():
        return isinstance(value, str)
    if dtype == pl.Int64():
        return isinstance(value, int) and _I64_MIN <= value <= _I64_MAX
    if dtype == pl.Float64():
        return isinstance(value, (int, float))
    return True
