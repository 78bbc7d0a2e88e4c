"""Views of the model's span table (`RunModel.spans`, Perfetto's slice table: ts, dur, depth,
parent, track) for the passes that need every span at once (the exclusive breakdown, the
findings' sums).

`span_table` is the table as those passes read it: `lane` (the track), `idx`, `parent` (the
parent's `idx` in the same lane, else null), `depth`, `name`, `phase`, `start`, `end` (the
effective end: now or the run's last moment while in progress) and `instant`. Times are epoch
nanoseconds.
"""

from __future__ import annotations

import polars as pl

from starttrace.analysis.model import RunModel
from starttrace.run import as_int64

__all__ = ["as_int64", "span_table", "spans_named"]


def span_table(model: RunModel, names: tuple[str, ...]) -> pl.DataFrame:
    """The table's rows of spans with one of `names`."""
    return model.matching(names=names).select(
        "lane", "idx", "parent", "depth", "name", "phase", "start", pl.col("eff_end").alias("end"), "instant"
    )


def spans_named(model: RunModel, names: tuple[str, ...], attrs: dict[str, pl.DataType]) -> pl.DataFrame:
    """The rows (as `span_table`'s) of spans with one of `names`, with the attributes `attrs` (key ->
    column type) as columns (null where a span has none or one of another type). A few spans per
    process: their attributes are decoded row by row."""
    rows = span_table(model, names)
    columns = {}
    decoded = [model.attrs_of(i) for i in rows["idx"].to_list()] if attrs else []
    for key, dtype in attrs.items():
        values = []
        for got in decoded:
            value = got.get(key)
            values.append(value if _fits(value, dtype) else None)
        columns[key] = pl.Series(key, values, dtype=dtype)
    return rows.with_columns(**columns) if columns else rows


def _fits(value: object, dtype: pl.DataType) -> bool:
    if value is None or isinstance(value, bool):
        return False
    if dtype == pl.String():
        return isinstance(value, str)
    if dtype == pl.Int64():
        return isinstance(value, int) and as_int64(value) == value
    if dtype == pl.Float64():
        return isinstance(value, (int, float))
    return True
