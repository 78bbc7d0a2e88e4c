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

import heapq
from typing import Any

from starttrace.analysis.model import Lane, RunModel, SpanNode, split_imports
from starttrace.views.json import SPAN_FIELDS, _span_row, to_json

PAGE_FIELDS = [*SPAN_FIELDS, "pos"]
WHOLE_RUN_SPANS = 20_000
FIRST_ROWS = 8_000
PAGE_PX = 1600
DETAIL_LIMIT = 50_000


def _row(n: SpanNode, t0: int) -> list[Any]:
    row = _span_row(n, t0)
    row.append(n.pos)
    return row


def _always(n: SpanNode) -> bool:
    return n.phase != "import" or n.in_progress


def first_payload(model: RunModel, rows: int = FIRST_ROWS, whole_run: int = WHOLE_RUN_SPANS) -> dict[str, Any]:
    """The first answer for the page (see the module text)."""
    doc = to_json(model, include_spans=False)
    doc["span_fields"] = PAGE_FIELDS
    total = sum(len(lane.spans) for lane in model.lanes)
    pixel_us = max(1, (model.t_end - model.t0) // 1000 // PAGE_PX)
    if total <= whole_run:
        chosen = {lane.index: list(lane.spans) for lane in model.lanes}
        cut = {lane.index: 0 for lane in model.lanes}
    else:
        chosen, cut = _longest(model.lanes, rows, pixel_us * 1000)
    for lane, entry in zip(model.lanes, doc["lanes"], strict=True):
        nodes = sorted(chosen[lane.index], key=lambda n: n.pos)
        entry["spans"] = [_row(n, model.t0) for n in nodes]
        entry["complete"] = len(nodes) == len(lane.spans)
        entry["detail_min_us"] = 0 if entry["complete"] else cut[lane.index]
    doc["first_answer"] = {
        "spans": sum(len(entry["spans"]) for entry in doc["lanes"]),
        "of_spans": total,
        "pixel_us": pixel_us,
        "complete": all(entry["complete"] for entry in doc["lanes"]),
    }
    return doc


def _longest(lanes: list[Lane], rows: int, min_ns: int) -> tuple[dict[int, list[SpanNode]], dict[int, int]]:
    """Per lane: the spans always sent plus the longest imports over all lanes (>= min_ns, within
    `rows` in all); and per lane the duration (µs) from which on nothing was left out."""
    chosen: dict[int, list[SpanNode]] = {}
    candidates: list[SpanNode] = []
    for lane in lanes:
        chosen[lane.index], longer = split_imports(lane.spans, min_ns)  # _always, and the candidates
        candidates += longer
    room = max(0, rows - sum(len(v) for v in chosen.values()))
    left_out: SpanNode | None = None
    if len(candidates) > room:
        # only the longest room + 1 are ordered (longest first, ties by depth, then start): every
        # span at least as long as the (room + 1)-th longest, sorted, has the same first room + 1
        cut = heapq.nlargest(room + 1, [n.duration for n in candidates])[-1]
        candidates = [n for n in candidates if n.duration >= cut]
        candidates.sort(key=lambda n: (-n.duration, n.depth, n.start))
        left_out = candidates[room]
        candidates = candidates[:room]
    for n in candidates:
        chosen[n.lane].append(n)
    # below this duration (µs, rounded up) spans may be missing: the longest one left out
    longest_left = max(min_ns, left_out.duration + 1 if left_out is not None else 0)
    cut = {lane.index: (longest_left + 999) // 1000 for lane in lanes}
    return chosen, cut


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
    lo = None if start_us is None else t0 + start_us * 1000
    hi = None if end_us is None else t0 + end_us * 1000
    min_ns = max(0, min_us) * 1000
    nodes = [
        n
        for n in lane.spans
        if (lo is None or n.eff_end >= lo)
        and (hi is None or n.start <= hi)
        and (n.duration >= min_ns or n.instant or n.in_progress)
    ]
    truncated = len(nodes) > limit
    if truncated:
        nodes.sort(key=lambda n: (-n.duration, n.depth, n.start))
        nodes = nodes[:limit]
    nodes.sort(key=lambda n: n.pos)
    return {
        "run_id": model.run_id,
        "version": model.version,
        "lane": lane_index,
        "span_fields": PAGE_FIELDS,
        "start_us": start_us,
        "end_us": end_us,
        "min_us": max(0, min_us),
        "truncated": truncated,
        "complete": len(nodes) == len(lane.spans),
        "spans": [_row(n, t0) for n in nodes],
    }
