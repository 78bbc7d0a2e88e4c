"""Clock alignment across hosts (analysis/clocks.py), node grouping (analysis/nodes.py) and the
multi-node findings, on synthetic runs whose nodes' clocks are off by known amounts."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl
from run_spans import spans_of
from synth_multinode import make_multinode_run
from synth_runs import MS, make_run, to_run

from starttrace.analysis.clocks import correct_clocks, estimate
from starttrace.analysis.findings.common import short_name
from starttrace.analysis.lanes import build_model
from starttrace.analysis.nodes import node_rows
from starttrace.run import Run
from starttrace.views.json import to_json


def _barrier_exits(run: Run) -> dict[int, int]:
    out = {}
    for p in run.processes:
        for s in spans_of(run, p):
            if s.name == "dist.barrier":
                out[p.rank] = s.end_ns
    return out


def test_one_clock_domain_is_left_alone() -> None:
    run = to_run(make_run(ranks=4))
    assert correct_clocks(run) is run


def test_offsets_come_from_the_barrier_and_align_the_ranks() -> None:
    skews = [0, 48 * MS, -31 * MS]
    run = to_run(make_multinode_run(nodes=3, ranks_per_node=4, skews_ns=skews))
    raw = _barrier_exits(run)
    assert max(raw.values()) - min(raw.values()) > 70 * MS  # as the hosts' clocks recorded them
    fixed = correct_clocks(run)
    assert fixed is not run and run.processes[0].resource.get("starttrace.clock.method") is None, "input unchanged"
    exits = _barrier_exits(fixed)
    assert max(exits.values()) - min(exits.values()) <= 3 * MS
    clocks = {c["hosts"][0]: c for c in fixed.meta["clocks"]}
    assert clocks["node0"]["method"] == "reference" and clocks["node0"]["offset_ns"] == 0
    for n, skew in enumerate(skews[1:], 1):
        clock = clocks[f"node{n}"]
        assert clock["method"] == "collective" and clock["sync_points"] == 1
        assert abs(clock["offset_ns"] - skew) <= 2 * MS, clock
        assert 0 < clock["error_ns"] <= 3 * MS
        lo, hi = clock["bounds_ns"]
        assert lo <= clock["offset_ns"] <= hi
        assert abs(clock["offset_ns"] - skew) <= clock["error_ns"] + MS, "the error bound covers the truth"
    for p in fixed.processes:  # every process records what was done to its times
        assert p.resource["starttrace.clock.method"] in ("reference", "collective")
        assert isinstance(p.resource["starttrace.clock.offset_ns"], int)
    assert correct_clocks(fixed) is fixed, "a corrected run is not corrected twice"


def test_causal_bounds_clamp_an_offset_the_exits_alone_would_get_wrong() -> None:
    """Two of node 1's three ranks leave the barrier 30 ms late (descheduled): their median says node
    1 is 30 ms ahead. But its third rank left on time, and node 0's ranks entered only 5 ms before
    they left: no rank leaves before the last one entered, so node 1 is at most ~5 ms ahead."""
    run = to_run(make_multinode_run(nodes=2, ranks_per_node=3, skews_ns=[0, 0], exit_spread_ns=0))
    node0 = [p.instance_id for p in run.processes if p.host == "node0"]
    late = [p.instance_id for p in run.processes if p.host != "node0" and p.resource.get("starttrace.local_rank", 0)]
    barrier = pl.col("name") == "dist.barrier"
    run.spans = run.spans.with_columns(
        pl.when(barrier & pl.col("lane").is_in(node0)).then(pl.col("end") - 5 * MS).otherwise("start").alias("start"),
        pl.when(barrier & pl.col("lane").is_in(late)).then(pl.col("end") + 30 * MS).otherwise("end").alias("end"),
    )
    _, other = estimate(run)
    lo, hi = other.bounds_ns
    assert lo is not None and hi is not None and lo <= other.offset_ns <= hi
    assert hi <= 5 * MS and other.offset_ns == hi, other


def test_a_node_without_collectives_is_aligned_by_the_clock_exchange() -> None:
    run = to_run(make_multinode_run(nodes=2, ranks_per_node=2, skews_ns=[0, 40 * MS], barrier=False))
    exchange = {"node0": (3 * MS, 2 * MS), "node1": (43 * MS, 4 * MS)}  # (offset to the service, rtt)
    for p in run.processes:
        off, rtt = exchange[p.host]
        p.resource["starttrace.clock.exchange_offset_ns"] = off
        p.resource["starttrace.clock.exchange_rtt_ns"] = rtt
    fixed = correct_clocks(run)
    other = fixed.meta["clocks"][1]
    assert (other["method"], other["offset_ns"], other["error_ns"]) == ("exchange", 40 * MS, 3 * MS)


def test_a_node_nothing_links_is_a_problem_and_a_finding() -> None:
    run = to_run(make_multinode_run(nodes=2, ranks_per_node=2, barrier=False))
    fixed = correct_clocks(run)
    assert fixed.meta["clocks"][1]["method"] == "none"
    assert any("no sync point" in p for p in fixed.problems)
    model = build_model(fixed)
    clock = [f for f in model.findings if f["kind"] == "clock_unsynced"]
    assert len(clock) == 1 and "node1" in clock[0]["text"]


def test_lanes_are_grouped_by_node_then_role_then_rank() -> None:
    run = to_run(make_multinode_run(nodes=3, ranks_per_node=2, skews_ns=[0, 20 * MS, -20 * MS]))
    run = dataclasses.replace(run, processes=list(reversed(run.processes)))  # order of arrival must not matter
    model = build_model(correct_clocks(run))
    order = [(lane.node, lane.role, lane.rank) for lane in model.lanes]
    assert order == [
        ("node0", "worker", 0), ("node0", "worker", 1), ("node0", "main", None),
        ("node1", "worker", 2), ("node1", "worker", 3), ("node1", "main", None),
        ("node2", "worker", 4), ("node2", "worker", 5), ("node2", "main", None),
    ]  # fmt: skip
    rows = node_rows(model)
    assert [r["node"] for r in rows] == ["node0", "node1", "node2"]
    assert [r["ranks"] for r in rows] == [[0, 1], [2, 3], [4, 5]]
    assert abs(rows[1]["offset_ns"] - 20 * MS) <= 2 * MS and rows[1]["method"] == "collective"
    page = to_json(model, include_spans=False)
    assert page["nodes"] == rows and {ln["node"] for ln in page["lanes"]} == {"node0", "node1", "node2"}


def test_one_node_has_no_node_rows() -> None:
    model = build_model(to_run(make_run(ranks=2)))
    assert node_rows(model) == [] and all(lane.node is None for lane in model.lanes)
    assert not [f for f in model.findings if f["kind"] in ("rendezvous_mismatch", "node_missing", "clock_unsynced")]


def test_nodes_that_disagree_on_the_rendezvous_are_an_error_finding() -> None:
    run = to_run(make_multinode_run(nodes=2, rendezvous=["10.0.0.1:5000", "10.0.0.2:5000"]))
    model = build_model(correct_clocks(run))
    (found,) = [f for f in model.findings if f["kind"] == "rendezvous_mismatch"]
    assert found["severity"] == "error"
    assert "10.0.0.1:5000" in found["text"] and "10.0.0.2:5000" in found["text"]
    assert "node0" in found["text"] and "node1" in found["text"]
    assert found["values"] == {"10.0.0.1:5000": ["node0"], "10.0.0.2:5000": ["node1"]}
    assert sorted(found["pids"]) == [100, 101] or len(found["lanes"]) == 2


def test_a_node_that_never_came_is_named() -> None:
    run = to_run(make_multinode_run(nodes=2, nnodes_claimed=3))
    model = build_model(correct_clocks(run))
    (found,) = [f for f in model.findings if f["kind"] == "node_missing"]
    assert found["expected_nodes"] == 3 and found["nodes"] == ["node0", "node1"]


def test_an_unsynced_kernel_clock_is_a_warning_and_a_straggler_names_its_node() -> None:
    unsynced = {"starttrace.clock.ntp_synced": False, "starttrace.clock.esterror_us": 16_000_000}
    run = to_run(make_multinode_run(nodes=2, ntp=unsynced))
    model = build_model(correct_clocks(run))
    clock = [f for f in model.findings if f["kind"] == "clock_unsynced"]
    assert len(clock) == 2 and all("not synchronized" in f["text"] for f in clock)
    rows = node_rows(model)
    assert rows[0]["ntp"]["ntp_synced"] is False and rows[0]["ntp"]["esterror_us"] == 16_000_000
    rank2 = next(lane for lane in model.lanes if lane.rank == 2)
    assert short_name(rank2) == f"rank 2 (pid {rank2.pid}) on node1", "findings name the node"
