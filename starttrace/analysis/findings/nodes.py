"""Multi-node findings (`{kind, severity, pids, lanes, seconds, text, action}`), over the node
rows of `analysis.nodes`; a run of one node has none.

- `rendezvous_mismatch` (error): nodes name different rendezvous endpoints, node counts or world
  sizes (SGLang #3467: two nodes given different `--dist-init-addr` hang in init);
- `node_missing` (error while live, else warning): the job names more nodes than the run has;
- `clock_unsynced` (warning): a node's kernel says its clock is not NTP-synchronized, or its
  estimated error is large, or nothing could align its clock with the others.
"""

from __future__ import annotations

from typing import Any

from starttrace.analysis.findings.common import finding
from starttrace.analysis.model import Lane, RunModel
from starttrace.analysis.nodes import node_rows

LARGE_CLOCK_ERROR_NS = 50_000_000  # an alignment error above this blurs the ordering of phases
LARGE_NTP_ERROR_US = 100_000


def node_findings(model: RunModel) -> list[dict[str, Any]]:
    rows = node_rows(model)
    if not rows:
        return []
    by_node: dict[str, list[Lane]] = {}
    for lane in model.lanes:
        if lane.node is not None:
            by_node.setdefault(lane.node, []).append(lane)
    return [
        *_rendezvous_findings(model, by_node),
        *_missing_node_findings(model, by_node),
        *_clock_findings(rows, by_node),
    ]


def _claims(lanes: list[Lane]) -> dict[str, Any]:
    """What a node's processes say about the job: rendezvous endpoint, node count, world size."""
    out: dict[str, Any] = {}
    for lane in lanes:
        res = lane.resource
        for key, name in (("starttrace.job.rendezvous", "rendezvous"), ("starttrace.job.nnodes", "nodes")):
            if res.get(key) is not None and name not in out:
                out[name] = res[key]
        if lane.world_size is not None and lane.role == "worker":
            out.setdefault("world size", lane.world_size)
    return out


def _rendezvous_findings(model: RunModel, by_node: dict[str, list[Lane]]) -> list[dict[str, Any]]:
    claims = {node: _claims(lanes) for node, lanes in by_node.items()}
    out = []
    for what in ("rendezvous", "nodes", "world size"):
        values: dict[str, list[str]] = {}
        for node, claim in claims.items():
            if what in claim:
                values.setdefault(str(claim[what]), []).append(node)
        if len(values) < 2:
            continue
        told = "; ".join(f"{', '.join(nodes)}: {value}" for value, nodes in sorted(values.items()))
        lanes = [ln for nodes in values.values() for node in nodes for ln in by_node[node][:1]]
        label = {"rendezvous": "rendezvous endpoint", "nodes": "node count", "world size": "world size"}[what]
        out.append(
            finding(
                "rendezvous_mismatch",
                "error",
                lanes,
                None,
                f"the nodes disagree on the {label} ({told}): they cannot form one job and wait for each"
                " other until the rendezvous times out",
                f"start every node with the same {label} (e.g. the same --master-addr/--master-port,"
                " --rdzv-endpoint or --dist-init-addr, and --nnodes)",
                field=what,
                values={value: nodes for value, nodes in values.items()},
            )
        )
    return out


def _missing_node_findings(model: RunModel, by_node: dict[str, list[Lane]]) -> list[dict[str, Any]]:
    expected = [c["nodes"] for c in (_claims(lanes) for lanes in by_node.values()) if isinstance(c.get("nodes"), int)]
    if not expected or max(expected) <= len(by_node):
        return []
    want = max(expected)
    roots = [lanes[0] for lanes in by_node.values()]
    return [
        finding(
            "node_missing",
            "error" if model.live else "warning",
            roots,
            None,
            f"the job names {want} nodes but only {len(by_node)} took part in this run"
            f" ({', '.join(by_node)}): the others never started, or were not traced",
            "check that every node started (and with STARTTRACE=1 in its environment); a node that"
            " is missing keeps the others waiting in their rendezvous",
            expected_nodes=want,
            nodes=list(by_node),
        )
    ]


def _clock_findings(rows: list[dict[str, Any]], by_node: dict[str, list[Lane]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        ntp = row["ntp"] or {}
        reasons = []
        if ntp.get("ntp_synced") is False:
            reasons.append("its kernel reports the clock as not synchronized (adjtimex: STA_UNSYNC)")
        est = ntp.get("esterror_us")
        if isinstance(est, (int, float)) and est > LARGE_NTP_ERROR_US:
            reasons.append(f"the kernel's estimated clock error is {est / 1000:.0f} ms")
        if row["method"] == "none":
            reasons.append("no collective and no clock exchange links its clock to the other nodes")
        elif isinstance(row["error_ns"], int) and row["error_ns"] > LARGE_CLOCK_ERROR_NS:
            reasons.append(f"its clock is aligned to within ±{row['error_ns'] / 1e6:.0f} ms only")
        if not reasons:
            continue
        out.append(
            finding(
                "clock_unsynced",
                "warning",
                by_node[row["node"]][:1],
                None if row["error_ns"] is None else row["error_ns"] / 1e9,
                f"node {row['node']}: {'; '.join(reasons)}; its lanes may be shifted against the other nodes'",
                "synchronize the node's clock (chrony or ntpd; `chronyc tracking` shows the state), or"
                " trace a collective (a barrier) on every node so that starttrace can align the clocks",
                node=row["node"],
            )
        )
    return out
