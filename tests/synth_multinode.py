"""Synthetic multi-node torchrun-like runs (tests, benchmarks): per node a launcher agent and its
ranks, each node with its own host, clock domain and wall-clock skew.

Every node's times are its true times plus its skew, as a host whose clock is off records them;
the ranks leave their first barrier at nearly the same true moment (within `exit_spread_ns`).
Pids repeat on every node, as on real hosts. The result is a `synth_runs.SRun`, so its encoders
(`protobuf_batches`, `to_run`) apply.
"""

from __future__ import annotations

import random
from typing import Any

from synth_runs import MS, SRun, _imports, _Lane


def default_skews(nodes: int) -> list[int]:
    """Node 0 on time, the others off by -50 ... +50 ms."""
    return [0] + [((n * 37) % 101 - 50) * MS for n in range(1, nodes)]


def make_multinode_run(
    nodes: int = 2,
    ranks_per_node: int = 2,
    imports_per_rank: int = 40,
    skews_ns: list[int] | None = None,
    run_id: str | None = None,
    seed: int = 1,
    t0: int = 1_800_000_000_000_000_000,
    exit_spread_ns: int = 2 * MS,
    rendezvous: list[str] | None = None,
    nnodes_claimed: int | None = None,
    barrier: bool = True,
    ntp: dict[str, Any] | None = None,
    shared_modules: bool = False,
) -> SRun:
    """`rendezvous[n]`: the endpoint node n names (default: the same for all); `nnodes_claimed`:
    the node count the agents name (default: `nodes`); `barrier=False`: no collective at all;
    `shared_modules`: every rank imports the same tree of modules (`pkg...`, the same shape and
    times), as real ranks do, instead of a tree of its own (`r<rank>...`)."""
    rng = random.Random(seed)
    trace_id = "%032x" % rng.getrandbits(128)
    run = SRun(run_id or f"synth-mn-{seed}", trace_id, [])
    skews = skews_ns if skews_ns is not None else default_skews(nodes)
    world = nodes * ranks_per_node
    # true time every rank leaves the barrier (+ up to exit_spread_ns): after every rank's imports
    barrier_exit = t0 + 2_000 * MS + imports_per_rank * 400_000
    for n in range(nodes):
        skew = skews[n]
        host = f"node{n}"
        common: dict[str, Any] = {
            "service.name": "torchrun",
            "host.name": host,
            "host.id": f"machine-{n}",
            "starttrace.clock.domain": f"boot-{n:04d}/4026531834",
            "starttrace.run_id": run.run_id,
        }
        if ntp:
            common.update(ntp)
        agent_res = dict(
            common,
            **{
                "service.instance.id": f"a{n:07x}",
                "process.pid": 100,
                "process.parent_pid": 1,
                "starttrace.role": "main",
                "starttrace.start_method": "root",
                "starttrace.job.kind": "torchrun",
                "starttrace.job.rendezvous": (rendezvous or ["head:29400"] * nodes)[n],
                "starttrace.job.nnodes": nnodes_claimed or nodes,
            },
        )
        agent = _Lane(run, rng, agent_res)
        a0 = t0 + n * 7 * MS + skew
        startup = agent.span("startup", None, a0, a0, **{"starttrace.phase": "startup"})
        proc = agent.span("process", startup, a0, a0, **{"starttrace.phase": "process"})
        agent.span("python.init", proc, a0, a0 + 30 * MS, **{"starttrace.phase": "interpreter"})
        t = _imports(agent, proc, a0 + 31 * MS, 20, f"torch{n}", rng)
        launch_at = max(t, a0 + 600 * MS)
        ends = []
        for local in range(ranks_per_node):
            rank = n * ranks_per_node + local
            pid = 101 + local
            launch = agent.span(
                "process.launch",
                proc,
                launch_at + local * MS,
                launch_at + local * MS + 2 * MS,
                **{"starttrace.phase": "launch", "starttrace.child_pid": pid, "starttrace.start_method": "spawn"},
            )
            wres = dict(
                common,
                **{
                    "service.instance.id": f"w{n:03x}{local:04x}",
                    "process.pid": pid,
                    "process.parent_pid": 100,
                    "starttrace.role": "worker",
                    "starttrace.start_method": "spawn",
                    "starttrace.rank": rank,
                    "starttrace.local_rank": local,
                    "starttrace.world_size": world,
                },
            )
            w = _Lane(run, rng, wres)
            w0 = launch_at + local * MS + MS
            wproc = w.span("process", launch, w0, w0, **{"starttrace.phase": "process"})
            w.span("python.init", wproc, w0, w0 + 40 * MS, **{"starttrace.phase": "interpreter"})
            if shared_modules:
                wt = _imports(w, wproc, w0 + 41 * MS, imports_per_rank, "pkg", random.Random(seed))
            else:
                wt = _imports(w, wproc, w0 + 41 * MS, imports_per_rank, f"r{rank}", rng)
            init_end = min(wt + 50 * MS, barrier_exit + skew - 20 * MS)
            w.span("dist.init", wproc, wt, max(wt + MS, init_end), **{"starttrace.phase": "dist_init"})
            wt = max(wt + MS, init_end)
            if barrier:
                leave = barrier_exit + skew + rng.randint(0, exit_spread_ns)
                w.span(
                    "dist.barrier",
                    wproc,
                    min(wt, barrier_exit + skew - exit_spread_ns - MS),
                    leave,
                    **{
                        "starttrace.phase": "dist_init",
                        "starttrace.dist.collective": "barrier",
                        "starttrace.dist.group": f"world/{world}",
                        "starttrace.dist.group_size": world,
                        "starttrace.dist.rank": rank,
                        "starttrace.dist.sync": True,
                    },
                )
                wt = leave
            w.span("train.step", wproc, wt + MS, wt + 100 * MS, **{"starttrace.phase": "other"})
            wt += 101 * MS
            w.span("process.ready", wproc, wt, wt, **{"starttrace.phase": "ready"})
            for sp in w.proc.spans:
                if sp.span_id == wproc:
                    sp.end = wt
            ends.append(wt)
        end = max(ends) + 5 * MS
        for sp in agent.proc.spans:
            if sp.span_id in (startup, proc):
                sp.end = end
    return run
