"""Per-node runs of one job that found no shared key, joined when the service reads them.

Where every node of a job derives the same run id (`starttrace.launchers`), its processes are one
run already. Where they do not (a launcher starttrace does not know, ranks started one by one with
torch's env:// variables, one node given another `STARTTRACE_RUN_ID`), each node becomes a run of
its own. This joins them: runs whose processes name the same rendezvous endpoint with the same
node count (`starttrace.job.rendezvous` + `starttrace.job.nnodes`, set by the launchers) or the same
torch master with the same world size (`starttrace.dist.master` + `starttrace.world_size`), and
whose times overlap, are one job. The page of any of them shows all of them (`load_joined`), with
`meta["joined_runs"]` naming them and a version that changes with any of them (`joined_version`).

What a run names is read from its processes' resources once per version of the run.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

from starttrace.run import Run
from starttrace.sources.store import Store

Signature = tuple[str, str, int]  # (kind, endpoint, size)
MAX_GROUP = 64
MAX_CANDIDATES = 200


def signatures(resources: list[dict[str, Any]]) -> set[Signature]:
    """What the processes of one run name as their job's rendezvous."""
    out: set[Signature] = set()
    for res in resources:
        endpoint, nodes = res.get("starttrace.job.rendezvous"), res.get("starttrace.job.nnodes")
        if isinstance(endpoint, str) and endpoint and isinstance(nodes, int) and nodes > 1:
            out.add(("job", endpoint, nodes))
        master, world = res.get("starttrace.dist.master"), res.get("starttrace.world_size")
        if isinstance(master, str) and master and isinstance(world, int) and world > 1:
            out.add(("dist", master, world))
    return out


class RunGroups:
    """Which stored runs belong together (cached per run version; thread-safe)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._sigs: dict[str, tuple[int, set[Signature]]] = {}

    def _signatures(self, run_id: str, version: int) -> set[Signature]:
        with self._lock:
            cached = self._sigs.get(run_id)
        if cached is not None and cached[0] == version:
            return cached[1]
        rows = self.store._reader().execute("SELECT resource FROM processes WHERE run_id = ?", (run_id,))
        sigs = signatures([json.loads(r[0]) for r in rows if r[0]])
        with self._lock:
            self._sigs[run_id] = (version, sigs)
        return sigs

    def _runs(self, run_ids: list[str] | None = None) -> dict[str, tuple[int, int | None, int | None]]:
        sql = "SELECT run_id, version, first_ns, last_ns FROM runs"
        params: list[Any] = []
        if run_ids is not None:
            sql += " WHERE run_id IN (%s)" % ",".join("?" * len(run_ids))
            params = list(run_ids)
        return {str(r[0]): (int(r[1]), r[2], r[3]) for r in self.store._reader().execute(sql, params)}

    def group(self, run_id: str) -> list[str]:
        """`run_id` and the runs joined with it (run_id first; just [run_id] when none)."""
        info = self._runs([run_id]).get(run_id)
        if info is None:
            return [run_id]
        if not self._signatures(run_id, info[0]):
            return [run_id]
        members = [run_id]
        todo = [run_id]
        known = {run_id: info}
        while todo and len(members) < MAX_GROUP:
            current = todo.pop()
            version, first, last = known[current]
            if first is None or last is None:
                continue
            mine = self._signatures(current, version)
            rows = self.store._reader().execute(
                "SELECT run_id, version, first_ns, last_ns FROM runs WHERE first_ns <= ? AND last_ns >= ?"
                " AND run_id != ? ORDER BY first_ns LIMIT ?",
                (last, first, current, MAX_CANDIDATES),
            )
            for rid, v, f, la in rows:
                rid = str(rid)
                if rid in members:
                    continue
                if mine & self._signatures(rid, int(v)):
                    members.append(rid)
                    known[rid] = (int(v), f, la)
                    todo.append(rid)
        return members

    def version(self, run_id: str) -> int | None:
        """A version of the joined run that changes whenever any of its runs does."""
        own = self.store.run_version(run_id)
        if own is None:
            return None
        members = self.group(run_id)
        if len(members) == 1:
            return own
        versions = self._runs(members)
        return own + sum(v for rid, (v, _, _) in versions.items() if rid != run_id) * 1_000_003

    def load(self, run_id: str) -> Run | None:
        """The run, joined with the per-node runs of the same job (see the module docstring)."""
        members = self.group(run_id)
        run = self.store.load_run(run_id)
        if run is None or len(members) == 1:
            return run
        others = [r for r in (self.store.load_run(rid) for rid in members[1:]) if r is not None]
        version = self.version(run_id)
        return join_runs(run, others, version if version is not None else run.version)


def join_runs(run: Run, others: list[Run], version: int) -> Run:
    """`run` with the processes and root spans of `others` (their ids in meta["joined_runs"])."""
    meta = dict(run.meta)
    meta["joined_runs"] = [run.run_id, *(o.run_id for o in others)]
    processes = list(run.processes)
    root_spans = list(run.root_spans)
    problems = list(run.problems)
    for other in others:
        processes.extend(other.processes)
        root_spans.extend(other.root_spans)
        problems.extend(p for p in other.problems if p not in problems)
    problems.append(
        f"joined with run(s) {', '.join(o.run_id for o in others)}: their nodes name the same rendezvous and ran"
        " at the same time, but shared no run id (set STARTTRACE_RUN_ID the same on every node to make them one run)"
    )
    processes.sort(key=lambda p: (p.created_ns, p.instance_id))
    root_spans.sort(key=lambda s: s.start_ns)
    return dataclasses.replace(
        run, processes=processes, root_spans=root_spans, meta=meta, problems=problems, version=version
    )
