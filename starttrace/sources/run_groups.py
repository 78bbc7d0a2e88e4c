"""Per-node runs of one job that found no shared key, joined when the service or the CLI reads them.

Where nodes do not derive the same run id (`tracer.launchers`), each node is a run of its own.
Runs whose processes name the same rendezvous with the same size (`starttrace.job.rendezvous` +
`nnodes`, or `starttrace.dist.master` + `world_size`) and whose times overlap are one job: the page
of any shows all (`meta["joined_runs"]`), with a version that changes with any of them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import polars as pl

from starttrace.run import Run
from starttrace.sources.journal_files import read_small
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


def closure(
    start: str, overlapping: Callable[[str], Iterable[str]], sigs: Callable[[str], set[Signature]]
) -> list[str]:
    """`start` and every run joined with it (start first): runs that overlap one of the group in
    time (`overlapping`) and name a rendezvous it names (`sigs`), transitively, up to MAX_GROUP."""
    if not sigs(start):
        return [start]
    members = [start]
    todo = [start]
    while todo and len(members) < MAX_GROUP:
        current = todo.pop()
        mine = sigs(current)
        for other in overlapping(current):
            if len(members) >= MAX_GROUP:
                break
            if other not in members and mine & sigs(other):
                members.append(other)
                todo.append(other)
    return members


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
        known = {run_id: info}

        def sigs(rid: str) -> set[Signature]:
            return self._signatures(rid, known[rid][0])

        def overlapping(rid: str) -> list[str]:
            _, first, last = known[rid]
            if first is None or last is None:
                return []
            rows = self.store._reader().execute(
                "SELECT run_id, version, first_ns, last_ns FROM runs WHERE first_ns <= ? AND last_ns >= ?"
                " AND run_id != ? ORDER BY first_ns LIMIT ?",
                (last, first, rid, MAX_CANDIDATES),
            )
            found = []
            for other, v, f, la in rows:
                known.setdefault(str(other), (int(v), f, la))
                found.append(str(other))
            return found

        return closure(run_id, overlapping, sigs)

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
    tables = [run.spans]
    for other in others:
        processes.extend(other.processes)
        root_spans.extend(other.root_spans)
        tables.append(other.spans)
        problems.extend(p for p in other.problems if p not in problems)
    problems.append(
        f"joined with run(s) {', '.join(o.run_id for o in others)}: their nodes name the same rendezvous and ran"
        " at the same time, but shared no run id (set STARTTRACE_RUN_ID the same on every node to make them one run)"
    )
    processes.sort(key=lambda p: (p.created_ns, p.instance_id))
    root_spans.sort(key=lambda s: s.start_ns)
    return dataclasses.replace(
        run,
        processes=processes,
        root_spans=root_spans,
        spans=pl.concat(tables),
        meta=meta,
        problems=problems,
        version=version,
    )


SLACK_NS = 600 * 10**9  # how far a folder's own times (run.json, file mtimes) may be off its spans'


def window(run: Run) -> tuple[int, int] | None:
    """(first, last) epoch ns of a run's spans, as the store keeps them (`runs.first_ns/last_ns`)."""
    first, last = run.spans.select(pl.col("start").min(), pl.coalesce("end", "start").max()).row(0)
    for span in run.root_spans:
        end = span.end_ns if span.end_ns is not None else span.start_ns
        first = span.start_ns if first is None else min(first, span.start_ns)
        last = end if last is None else max(last, end)
    return None if first is None or last is None else (first, last)


def _folder_window(run_dir: Path) -> tuple[int, int] | None:
    """A cheap, loose (first, last) of a run folder before reading it: run.json's creation time
    and the newest file time, widened by SLACK_NS."""
    try:
        stats = [entry.stat().st_mtime_ns for entry in os.scandir(run_dir) if entry.is_file()]
        meta = json.loads(read_small(run_dir / "run.json")) if (run_dir / "run.json").exists() else {}
    except (OSError, ValueError):
        return None
    created = meta.get("created_epoch_ns") if isinstance(meta, dict) else None
    if not stats:
        return None
    first = created if isinstance(created, int) else min(stats)
    return first - SLACK_NS, max(stats) + SLACK_NS


def join_journal_runs(run: Run, root: Path) -> Run:
    """`run` (read from a folder of the journal root `root`) joined with the per-node runs of the
    same job in that root, as the service joins stored runs (`RunGroups`): the CLI's reports and
    exports of a shared STARTTRACE_DIR show the whole job."""
    from starttrace.sources.journal_reader import ReaderError, list_run_dirs, read_run

    runs: dict[str, Run] = {run.run_id: run}
    windows: dict[str, tuple[int, int] | None] = {run.run_id: window(run)}
    own_dir = Path(run.path).resolve() if run.path else None
    folders = {p.name: p for p in list_run_dirs(Path(root)) if own_dir is None or p.resolve() != own_dir}

    def sigs(rid: str) -> set[Signature]:
        return signatures([p.resource for p in runs[rid].processes])

    loose_windows: dict[str, tuple[int, int] | None] = {}

    def overlapping(rid: str) -> list[str]:
        span = windows.get(rid)
        if span is None:
            return []
        found = []
        for name, folder in list(folders.items())[:MAX_CANDIDATES]:
            if name not in loose_windows:
                loose_windows[name] = _folder_window(folder)
            loose = loose_windows[name]
            if name not in runs and (loose is None or loose[0] > span[1] or loose[1] < span[0]):
                continue
            if name not in runs:
                try:
                    runs[name] = read_run(folder)
                except ReaderError:
                    folders.pop(name)
                    continue
                windows[name] = window(runs[name])
            other = windows[name]
            if other is not None and other[0] <= span[1] and other[1] >= span[0]:
                found.append(name)
        return found

    members = closure(run.run_id, overlapping, sigs)
    if len(members) == 1:
        return run
    return join_runs(run, [runs[rid] for rid in members[1:]], run.version)
