"""The page's data: the first answer to `GET /startup/{run}` and the span detail fetched later.

A 16-rank run of 6000 spans each is 13.6 MB as JSON with every span; the page shows at first the
whole run on one screen, where most import spans are narrower than a pixel. The first answer is
the JSON view (`views.json.to_json`: lanes, phases, findings, ...) with, per lane, the spans that
level shows:

- every span that is not an import, every span in progress;
- the longest imports, over all lanes, while they last at least one pixel at the full-run zoom
  (`PAGE_PX` pixels for the whole run) and fit the row budget (`FIRST_ROWS`); longest first, ties
  by depth, so a kept span's ancestors are kept too;
- a run of at most `WHOLE_RUN_SPANS` spans is sent whole.

Each lane says whether it is `complete`, and if not, `detail_min_us`: no span of at least that
many microseconds was left out. Span rows carry their own position in the lane (`pos`, the last
field), since parents are given by position (`views.json.SPAN_FIELDS`). The rest comes from
`lane_detail`: a lane's spans in a time window and above a duration, as the page zooms or opens
a lane (`GET /startup/{run}/lanes/{lane}/spans?start_us=&end_us=&min_us=`).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from starttrace.analysis.model import RunModel
from starttrace.views.json import SPAN_FIELDS, span_rows, to_json

PAGE_FIELDS = [*SPAN_FIELDS, "pos"]
WHOLE_RUN_SPANS = 20_000
FIRST_ROWS = 8_000
PAGE_PX = 1600
DETAIL_LIMIT = 50_000

# longest first, ties by depth (a kept span's ancestors are kept too), then start, then table order
_LONGEST = (["duration", "depth", "start", "idx"], [True, False, False, False])


def first_payload(model: RunModel, rows: int = FIRST_ROWS, whole_run: int = WHOLE_RUN_SPANS) -> dict[str, Any]:
    """The first answer for the page (see the module text)."""
    doc = to_json(model, include_spans=False)
    doc["span_fields"] = PAGE_FIELDS
    table = model.core  # the narrow columns: the chosen rows' ids and attributes come after
    total = table.height
    pixel_us = max(1, (model.t_end - model.t0) // 1000 // PAGE_PX)
    if total <= whole_run:
        chosen, cut_us = table, 0
    else:
        chosen, cut_us = _longest(table, rows, pixel_us * 1000)
    chosen = chosen.sort("idx")  # by lane, then position in the lane
    counts = dict(chosen.group_by("lane").len().iter_rows())
    sent = span_rows(model, chosen, pos=True)
    at = 0
    for lane, entry in zip(model.lanes, doc["lanes"], strict=True):
        n = counts.get(lane.index, 0)
        entry["spans"] = sent[at : at + n]
        at += n
        entry["complete"] = n == lane.count
        # the innermost phase at each instant of its window (analysis.breakdown): what its bar paints
        entry["timeline"] = [[(a - model.t0) // 1000, (b - model.t0) // 1000, label] for a, b, label in lane.timeline]
        entry["detail_min_us"] = 0 if entry["complete"] else cut_us
    doc["first_answer"] = {
        "spans": len(sent),
        "of_spans": total,
        "pixel_us": pixel_us,
        "complete": all(entry["complete"] for entry in doc["lanes"]),
    }
    return doc


def _longest(table: pl.DataFrame, rows: int, min_ns: int) -> tuple[pl.DataFrame, int]:
    """The spans always sent (not an import, or still in progress) plus the longest imports over
    all lanes (>= min_ns, within `rows` in all); and the duration (µs, the same for every lane)
    from which on nothing was left out."""
    always = pl.col("in_progress") | (pl.col("phase") != "import").fill_null(True)
    sent = table.filter(always)
    candidates = table.filter(~always & (pl.col("duration") >= min_ns))
    room = max(0, rows - sent.height)
    left_out = 0
    if candidates.height > room:
        by, descending = _LONGEST
        ordered = candidates.top_k(room + 1, by=by, reverse=[not d for d in descending]).sort(by, descending=descending)
        left_out = int(ordered["duration"][room]) + 1  # the longest span left out
        candidates = ordered.head(room)
    # below this duration (µs, rounded up) spans may be missing
    longest_left = max(min_ns, left_out)
    return pl.concat([sent, candidates], how="vertical"), (longest_left + 999) // 1000


def lane_detail(
    model: RunModel,
    lane_index: int,
    start_us: int | None = None,
    end_us: int | None = None,
    min_us: int = 0,
    limit: int = DETAIL_LIMIT,
) -> dict[str, Any] | None:
    """A lane's spans that overlap [start_us, end_us] (relative to the run start) and last at least
    `min_us` (instants and spans in progress always), longest first within `limit`; None: no such
    lane. `complete`: nothing of the lane was left out."""
    if not 0 <= lane_index < len(model.lanes):
        return None
    lane = model.lanes[lane_index]
    t0 = model.t0
    keep = (pl.col("duration") >= max(0, min_us) * 1000) | pl.col("instant") | pl.col("in_progress")
    if start_us is not None:
        keep &= pl.col("eff_end") >= t0 + start_us * 1000
    if end_us is not None:
        keep &= pl.col("start") <= t0 + end_us * 1000
    found = model.lane_rows(lane).filter(keep)
    truncated = found.height > limit
    if truncated:
        by, descending = _LONGEST
        found = found.sort(by, descending=descending).head(limit)
    found = found.sort("idx")
    return {
        "run_id": model.run_id,
        "version": model.version,
        "lane": lane_index,
        "span_fields": PAGE_FIELDS,
        "start_us": start_us,
        "end_us": end_us,
        "min_us": max(0, min_us),
        "truncated": truncated,
        "complete": found.height == lane.count,
        "spans": span_rows(model, found, pos=True),
    }
