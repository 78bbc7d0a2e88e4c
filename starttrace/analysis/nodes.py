"""Nodes of a multi-node run: lane order (node, then role, then rank) and the node rows the views
show (host, clock offset and error, NTP state); the multi-node findings are in `findings.nodes`.
A node is a host name plus a clock domain, ordered by the lowest global rank it runs, then host.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from starttrace.analysis.model import Lane, RunModel

NodeKey = tuple[str, str]  # (host name, clock domain)


def node_key(lane: Lane) -> NodeKey:
    return (lane.host or "", str(lane.resource.get("starttrace.clock.domain") or ""))


def node_order(lanes: list[Lane]) -> dict[NodeKey, int]:
    """Position of each node: by the lowest global rank it runs (rank 0's node first), then host."""
    lowest: dict[NodeKey, float] = {}
    for lane in lanes:
        key = node_key(lane)
        rank = lane.rank if lane.rank is not None and lane.role == "worker" else None
        current = lowest.get(key, float("inf"))
        lowest[key] = min(current, rank) if rank is not None else current
    ordered = sorted(lowest, key=lambda k: (lowest[k], k))
    return {key: i for i, key in enumerate(ordered)}


def node_names(order: dict[NodeKey, int]) -> dict[NodeKey, str]:
    """How the views name each node: its host name (with the domain's start when two nodes share
    a host name)."""
    hosts = Counter(host for host, _ in order)
    names = {}
    for host, domain in order:
        names[(host, domain)] = f"{host or '?'} [{domain[:8]}]" if hosts[host] > 1 else host or "?"
    return names


def node_rows(model: RunModel) -> list[dict[str, Any]]:
    """One row per node, in lane order: host, clock domain, lanes, ranks, clock offset/error/method
    (from `analysis.clocks`, in `model.meta["clocks"]`) and the kernel's NTP state. Empty for a run
    of one node."""
    nodes: dict[str, dict[str, Any]] = {}
    for lane in model.lanes:
        if lane.node is None:
            continue
        row = nodes.get(lane.node)
        if row is None:
            host, domain = node_key(lane)
            row = nodes[lane.node] = {
                "node": lane.node,
                "host": host,
                "domain": domain,
                "host_id": lane.resource.get("host.id"),
                "lanes": [],
                "ranks": [],
                "offset_ns": None,
                "error_ns": None,
                "method": None,
                "ntp": {},
            }
        row["lanes"].append(lane.index)
        if lane.rank is not None and lane.role == "worker":
            row["ranks"].append(lane.rank)
    clocks = {c.get("domain"): c for c in model.meta.get("clocks") or [] if isinstance(c, dict)}
    for row in nodes.values():
        clock = clocks.get(row["domain"])
        if clock is not None:
            row.update(offset_ns=clock.get("offset_ns"), error_ns=clock.get("error_ns"), method=clock.get("method"))
            row["ntp"] = dict(clock.get("ntp") or {})
        row["ranks"].sort()
    return list(nodes.values())


def node_positions(model: RunModel) -> dict[str, int]:
    """Each node's position in lane order (node 0: rank 0's); how two runs' nodes are matched."""
    nodes = dict.fromkeys(lane.node for lane in model.lanes if lane.node is not None)
    return {node: i for i, node in enumerate(nodes)}


def compare_nodes(a: RunModel, b: RunModel) -> list[dict[str, Any]]:
    """Run A vs run B per node, nodes matched by position (hosts differ between runs): host, ranks,
    time to ready (the node's last lane), clock offset. Empty unless either run has several nodes."""
    rows_a, rows_b = node_rows(a), node_rows(b)
    if not rows_a and not rows_b:
        return []
    out = []
    for i in range(max(len(rows_a), len(rows_b))):
        ra = rows_a[i] if i < len(rows_a) else None
        rb = rows_b[i] if i < len(rows_b) else None
        ready = {"a": _node_ready(a, ra), "b": _node_ready(b, rb)}
        ready["delta"] = None if ready["a"] is None or ready["b"] is None else round(ready["b"] - ready["a"], 6)
        out.append(
            {
                "node": i,
                "host_a": ra["node"] if ra else None,
                "host_b": rb["node"] if rb else None,
                "ranks_a": ra["ranks"] if ra else [],
                "ranks_b": rb["ranks"] if rb else [],
                "time_to_ready_s": ready,
                "offset_ns": {"a": ra["offset_ns"] if ra else None, "b": rb["offset_ns"] if rb else None},
            }
        )
    return out


def _node_ready(model: RunModel, row: dict[str, Any] | None) -> float | None:
    if row is None:
        return None
    ends = [model.lanes[i].ready_ns for i in row["lanes"] if model.lanes[i].ready_ns is not None]
    return model.seconds(max(ends)) if ends else None


def lane_keys(model: RunModel) -> dict[str, Any]:
    """Lanes matched across runs (compare, causes) by role + rank; lanes without a rank by role + order of start."""
    out: dict[str, Any] = {}
    counters: dict[str, int] = defaultdict(int)
    nodes = node_positions(model)  # several hosts: a lane without a rank is matched on its node's position
    for lane in sorted(model.lanes, key=lambda ln: (ln.start, ln.index)):
        role = lane.role or "process"
        if lane.rank is None and lane.node is not None:
            role = f"node{nodes[lane.node]} {role}"
        name = lane.resource.get("starttrace.process_name")
        if lane.rank is not None:
            key = f"{role} rank {lane.rank}"
        elif role == "child" and isinstance(name, str) and name and f"{role} {name}" not in out:
            key = f"{role} {name}"  # a generic child by its Process name (`rank-0`)
        else:
            key = f"{role} #{counters[role]}"
            counters[role] += 1
        out[key] = lane
    return out
