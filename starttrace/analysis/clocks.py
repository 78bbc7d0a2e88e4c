"""Clock alignment across hosts: a run whose processes ran in several clock domains, with the
times of every domain but one shifted onto that one's clock (`Run -> Run`, no I/O).

Every process records its clock domain (`starttrace.clock.domain`: kernel boot id + time namespace,
`starttrace.tracer.lifecycle`); within a domain all lanes already share one monotonic clock and one epoch
anchor. Between domains (hosts) the epoch clocks differ by their NTP error, often tens of ms. The
reference domain is the one of global rank 0 (else of the server that became ready, else of the
first root process); every other domain gets an offset (its clock minus the reference clock) and an
error bound, from, in order of preference:

- collective sync points: the first blocking barrier / all_reduce / all_gather of each process
  group (`dist.*` spans with `starttrace.dist.sync`, probes/torch.py). Its exit is nearly
  simultaneous on all ranks, so the offset is the difference of the domains' median exit times
  (the median over sync points). Causal bounds keep it honest: no rank leaves a collective before
  the last rank entered it, so an offset that would put an exit before an entry is impossible and
  clamped away. Error: half the exits' spread in both domains, at most the causal bound.
- an NTP-style exchange with the service made by the exporter off the traced processes' path
  (`starttrace.clock.exchange_offset_ns` / `..._rtt_ns`, `starttrace.clocksync`): the offset
  difference of the two domains against the service's clock, error half of each round trip.

`correct_clocks` applies the offsets (times minus offset: one column expression per lane over the
run's span table, never a rewrite of journals) and records them on every process's
resource (`starttrace.clock.offset_ns`, `...error_ns`, `...method`) and per domain in
`run.meta["clocks"]`. With one domain the run is returned unchanged; processes that already carry
`starttrace.clock.method` (a corrected export read back) are left as they are.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import polars as pl

from starttrace.run import Process, Run, Span, decode_attrs

ATTR_OFFSET = "starttrace.clock.offset_ns"
ATTR_ERROR = "starttrace.clock.error_ns"
ATTR_METHOD = "starttrace.clock.method"
ATTR_EXCHANGE_OFFSET = "starttrace.clock.exchange_offset_ns"
ATTR_EXCHANGE_RTT = "starttrace.clock.exchange_rtt_ns"
SYNC_SPANS = frozenset({"dist.barrier", "dist.all_reduce", "dist.all_gather"})  # probes/torch.py
NTP_ATTRS = ("starttrace.clock.ntp_synced", "starttrace.clock.esterror_us", "starttrace.clock.maxerror_us")


@dataclass
class DomainClock:
    """What is known about one clock domain of a run."""

    domain: str
    hosts: list[str]
    processes: int
    offset_ns: int = 0  # this domain's clock minus the reference clock (subtracted from its times)
    error_ns: int | None = None
    method: str = "none"  # reference | collective | exchange | none | recorded
    sync_points: int = 0
    bounds_ns: tuple[int | None, int | None] = (None, None)  # causal: the offset lies in [lo, hi]
    ntp: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "hosts": self.hosts,
            "processes": self.processes,
            "offset_ns": self.offset_ns,
            "error_ns": self.error_ns,
            "method": self.method,
            "sync_points": self.sync_points,
            "bounds_ns": list(self.bounds_ns),
            "ntp": self.ntp,
        }


@dataclass
class _Point:
    """One collective as the domains saw it: per domain the entry and exit times of its ranks."""

    enters: dict[str, list[int]] = field(default_factory=dict)
    exits: dict[str, list[int]] = field(default_factory=dict)


def domain_of(process: Process) -> str:
    return process.clock_domain


def correct_clocks(run: Run, owned: bool = False) -> Run:
    """`run` with every clock domain's times on the reference domain's clock (see the module
    docstring); the same object when there is nothing to correct. `run` is left as it was (the
    shift is one column expression per lane over the span table, a new table); `owned` (the caller
    loaded it for this view alone) lets the few root spans shift where they are."""
    todo = [p for p in run.processes if ATTR_METHOD not in p.resource]
    domains = {domain_of(p) for p in todo}
    if len(domains) < 2:
        return run
    clocks = estimate(run, todo)
    by_domain = {c.domain: c for c in clocks}
    owners = run.root_owners()
    pending = {id(p) for p in todo}
    processes = [_shifted_process(p, by_domain[domain_of(p)]) if id(p) in pending else p for p in run.processes]
    offsets = {p.instance_id: by_domain[domain_of(p)].offset_ns for p in todo if by_domain[domain_of(p)].offset_ns}
    spans = shifted(run.spans, offsets)
    root_spans = []
    for span in run.root_spans:
        owner = owners.get(span.span_id)
        clock = by_domain.get(domain_of(owner)) if owner is not None and id(owner) in pending else None
        root_spans.append(_shifted(span, clock.offset_ns, owned) if clock is not None and clock.offset_ns else span)
    meta = dict(run.meta)
    meta["clocks"] = [c.to_json() for c in clocks]
    problems = list(run.problems) + [
        f"clock domain {c.domain} ({', '.join(c.hosts)}): no sync point and no clock exchange; its times are"
        " not aligned with the others"
        for c in clocks
        if c.method == "none"
    ]
    return dataclasses.replace(
        run, processes=processes, spans=spans, root_spans=root_spans, meta=meta, problems=problems
    )


def shifted(spans: pl.DataFrame, offsets: dict[str, int]) -> pl.DataFrame:
    """The span table with each lane's times minus its offset (`offsets`: lane -> ns; others as
    they are)."""
    if not offsets or not spans.height:
        return spans
    offset = pl.col("lane").replace_strict(offsets, default=0, return_dtype=pl.Int64)
    return spans.with_columns(pl.col("start") - offset, pl.col("end") - offset)


def estimate(run: Run, processes: list[Process] | None = None) -> list[DomainClock]:
    """One DomainClock per clock domain of `processes` (default: all), the reference first."""
    processes = run.processes if processes is None else processes
    clocks: dict[str, DomainClock] = {}
    for p in processes:
        d = domain_of(p)
        clock = clocks.get(d)
        if clock is None:
            clock = clocks[d] = DomainClock(domain=d, hosts=[], processes=0)
        clock.processes += 1
        if p.host and p.host not in clock.hosts:
            clock.hosts.append(p.host)
        for key in NTP_ATTRS:
            if key in p.resource and key.rpartition(".")[2] not in clock.ntp:
                clock.ntp[key.rpartition(".")[2]] = p.resource[key]
    reference = reference_domain(run, processes)
    known = {reference: (0, 0)}
    clocks[reference].method = "reference"
    clocks[reference].error_ns = 0
    points = sync_points(run, processes)
    _from_collectives(points, known, clocks)
    _from_exchanges(processes, known, clocks)
    others = sorted((c for d, c in clocks.items() if d != reference), key=lambda c: c.hosts)
    return [clocks[reference], *others]


def reference_domain(run: Run, processes: list[Process]) -> str:
    """The domain of global rank 0, else of the server that became ready, else of the first root."""
    for p in processes:
        if p.rank == 0 and p.role in ("worker", ""):
            return domain_of(p)
    ready = set(run.spans.filter(pl.col("name") == "ready")["lane"].to_list())
    for p in processes:
        if p.instance_id in ready:
            return domain_of(p)
    roots = [p for p in processes if p.resource.get("starttrace.start_method") == "root"]
    first = min(roots or processes, key=lambda p: p.created_ns)
    return domain_of(first)


def sync_points(run: Run, processes: list[Process]) -> list[_Point]:
    """The collective sync points: per process group, the first synchronizing collective of each
    member process, grouped into one point per `group_size` members (a relaunch of the same group
    in the same run is a later point). The candidates are a filter of the span table (by name,
    closed, no error); only their attributes are decoded."""
    lanes = {p.instance_id: domain_of(p) for p in processes}
    candidates = run.spans.filter(
        pl.col("name").is_in(list(SYNC_SPANS))
        & pl.col("lane").is_in(list(lanes))
        & pl.col("end").is_not_null()
        & ~pl.col("in_progress").fill_null(False)
        & (pl.col("error").is_null() | (pl.col("error") == ""))
    ).sort("lane", "start", maintain_order=True)
    by_group: dict[str, list[tuple[int, int, str, int]]] = {}
    seen: set[tuple[str, str]] = set()  # (lane, group): each process's first collective of a group
    for row in candidates.iter_rows(named=True):
        a = decode_attrs(row["attrs"], row["attrs_pb"])
        if a.get("starttrace.dist.sync") is not True:
            continue
        group = str(a.get("starttrace.dist.group") or "")
        if not group or (row["lane"], group) in seen:
            continue
        seen.add((row["lane"], group))
        size = a.get("starttrace.dist.group_size")
        by_group.setdefault(group, []).append(
            (row["end"], row["start"], lanes[row["lane"]], size if isinstance(size, int) else 0)
        )
    points: list[_Point] = []
    for events in by_group.values():
        events.sort()
        size = max((e[3] for e in events), default=0) or len(events)
        for i in range(0, len(events), size):
            point = _Point()
            for end, start, d, _ in events[i : i + size]:
                point.enters.setdefault(d, []).append(start)
                point.exits.setdefault(d, []).append(end)
            if len(point.exits) > 1:
                points.append(point)
    return points


def _from_collectives(points: list[_Point], known: dict[str, tuple[int, int]], clocks: dict[str, DomainClock]) -> None:
    """Offsets of the domains linked to a known one by sync points (breadth first from the reference)."""
    queue = deque(known)
    while queue:
        base = queue.popleft()
        base_offset, base_error = known[base]
        linked: dict[str, list[_Point]] = {}
        for point in points:
            if base in point.exits:
                for d in point.exits:
                    if d not in known:
                        linked.setdefault(d, []).append(point)
        for d, shared in linked.items():
            offset, error, bounds = _pair_offset(shared, base, d)
            offset += base_offset
            known[d] = (offset, error + base_error)
            clock = clocks[d]
            clock.offset_ns, clock.error_ns = offset, error + base_error
            clock.method, clock.sync_points = "collective", len(shared)
            clock.bounds_ns = tuple(None if b is None else b + base_offset for b in bounds)  # type: ignore[assignment]
            queue.append(d)


def _pair_offset(points: list[_Point], a: str, b: str) -> tuple[int, int, tuple[int | None, int | None]]:
    """Offset of domain b relative to domain a from their shared sync points: (offset, error, bounds)."""
    estimates = []
    lo: int | None = None
    hi: int | None = None
    spread = 0
    for point in points:
        exits_a, exits_b = point.exits[a], point.exits[b]
        estimates.append(median(exits_b) - median(exits_a))
        # no exit before the last entry: min(exit_b) - off >= max(enter_a), min(exit_a) >= max(enter_b) - off
        hi_i = min(exits_b) - max(point.enters[a])
        lo_i = max(point.enters[b]) - min(exits_a)
        hi = hi_i if hi is None else min(hi, hi_i)
        lo = lo_i if lo is None else max(lo, lo_i)
        spread = max(spread, ((max(exits_a) - min(exits_a)) + (max(exits_b) - min(exits_b))) // 2)
    offset = int(median(estimates))
    if lo is not None and hi is not None and lo <= hi:
        offset = min(max(offset, lo), hi)
    if len(estimates) > 1:
        spread = max(spread, int(max(estimates) - min(estimates)) // 2)
    causal = max(hi - offset if hi is not None else 0, offset - lo if lo is not None else 0)
    error = min(spread, causal) if lo is not None and hi is not None and lo <= hi else spread
    return offset, int(error), (lo, hi)


def _from_exchanges(
    processes: list[Process], known: dict[str, tuple[int, int]], clocks: dict[str, DomainClock]
) -> None:
    """Domains still unknown: their exchange with the service, against a known domain's exchange."""
    exchanges: dict[str, tuple[int, int]] = {}
    for p in processes:
        offset, rtt = p.resource.get(ATTR_EXCHANGE_OFFSET), p.resource.get(ATTR_EXCHANGE_RTT)
        if isinstance(offset, int) and isinstance(rtt, int):
            d = domain_of(p)
            if d not in exchanges or rtt < exchanges[d][1]:
                exchanges[d] = (offset, rtt)
    anchors = [(d, known[d]) for d in known if d in exchanges]
    if not anchors:
        return
    anchor, (anchor_offset, anchor_error) = min(anchors, key=lambda item: exchanges[item[0]][1] + item[1][1])
    for d, (x, rtt) in exchanges.items():
        if d in known:
            continue
        offset = x - exchanges[anchor][0] + anchor_offset
        error = rtt // 2 + exchanges[anchor][1] // 2 + anchor_error
        known[d] = (offset, error)
        clock = clocks[d]
        clock.offset_ns, clock.error_ns, clock.method = offset, error, "exchange"


def _shifted(span: Span, offset: int, in_place: bool = False) -> Span:
    if in_place:
        span.start_ns -= offset
        if span.end_ns is not None:
            span.end_ns -= offset
        return span
    return Span(
        span.span_id,
        span.parent_id,
        span.name,
        span.start_ns - offset,
        None if span.end_ns is None else span.end_ns - offset,
        span.attrs,
        span.error,
        span.thread,
        span.instant,
        span.in_progress,
        span.links,
    )


def _shifted_process(process: Process, clock: DomainClock) -> Process:
    """The process with its clock's offset recorded on its resource and its own times shifted (its
    spans are shifted in the table: `shifted`)."""
    resource = dict(process.resource)
    resource[ATTR_METHOD] = clock.method
    resource[ATTR_OFFSET] = clock.offset_ns
    if clock.error_ns is not None:
        resource[ATTR_ERROR] = clock.error_ns
    offset = clock.offset_ns
    if not offset:
        return dataclasses.replace(process, resource=resource)
    return dataclasses.replace(
        process,
        resource=resource,
        created_ns=process.created_ns - offset if process.created_ns else 0,
        activated_ns=process.activated_ns - offset if process.activated_ns else 0,
    )
