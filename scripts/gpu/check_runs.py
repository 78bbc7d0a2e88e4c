"""Checks for scripts/gpu_check.sh: read the traced forkserver_ranks runs and verify, on a machine
with CUDA GPUs, real `cuda.init` (no error), `dist.init` (NCCL) and the CUDA-clean audit.

    python scripts/gpu/check_runs.py --clean DIR --clean-ranks N [--clean-backend nccl]
                                     [--gloo4 DIR] [--dirty DIR] [--report FILE]

Each DIR is a STARTTRACE_DIR holding one run. Prints one line per check; exit status 1 when any
failed.
"""

# ruff: noqa: B023  (Checker.check evaluates each closure at once, inside the loop iteration)
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starttrace.sources.journal_reader import Process, Run, Span, list_run_dirs, read_run

WORKER_PRELOAD = ["forkserver_ranks", "socket"]


class Checker:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failed = 0

    def check(self, label: str, condition: Callable[[], Any]) -> None:
        """Evaluate `condition` now (closures over loop variables are safe here)."""
        try:
            ok = bool(condition())
            detail = ""
        except Exception as exc:  # a check that cannot even be evaluated failed
            ok = False
            detail = f" ({type(exc).__name__}: {exc})"
        self.failed += 0 if ok else 1
        line = f"{'PASS' if ok else 'FAIL'}  {label}{detail}"
        self.lines.append(line)
        print(line, flush=True)


def load(directory: Path) -> Run:
    runs = list_run_dirs(directory)
    if len(runs) != 1:
        raise SystemExit(f"check_runs: expected one run in {directory}, found {len(runs)}")
    return read_run(runs[0])


def named(process: Process, name: str) -> list[Span]:
    return [s for s in process.spans if s.name == name]


def ranks(run: Run) -> dict[int, Process]:
    return {p.rank: p for p in run.processes if p.role == "worker" and p.rank is not None}


def worker_forkserver(run: Run) -> Process:
    for process in run.processes:
        if process.role != "forkserver":
            continue
        for span in named(process, "forkserver.preload"):
            if span.attrs.get("starttrace.preload", [])[: len(WORKER_PRELOAD)] == WORKER_PRELOAD:
                return process
    raise LookupError("no worker forkserver in the run")


def chain(process: Process, span: Span) -> list[str]:
    by_id = {s.span_id: s for s in process.spans}
    names: list[str] = []
    current: Span | None = span
    while current is not None:
        names.append(current.name)
        current = by_id.get(current.parent_id or "")
    return names


def check_cuda_ranks(c: Checker, tag: str, run: Run, expected: int, backend: str) -> None:
    lanes = ranks(run)
    c.check(f"{tag}: ranks 0..{expected - 1} each on a lane", lambda: sorted(lanes) == list(range(expected)))
    for rank, lane in sorted(lanes.items()):
        inits = named(lane, "cuda.init")
        c.check(f"{tag}: rank {rank}: one cuda.init", lambda: len(inits) == 1)
        c.check(
            f"{tag}: rank {rank}: cuda.init succeeded ({inits[0].error if inits else 'missing'})",
            lambda: inits and inits[0].error is None and inits[0].end_ns is not None,
        )
        c.check(
            f"{tag}: rank {rank}: device count recorded",
            lambda: inits[0].attrs.get("starttrace.cuda.device_count", 0) >= 1,
        )
        c.check(
            f"{tag}: rank {rank}: process attr starttrace.cuda_initialized",
            lambda: lane.resource.get("starttrace.cuda_initialized") is True,
        )
        sets = named(lane, "cuda.set_device")
        c.check(f"{tag}: rank {rank}: cuda.set_device without error", lambda: sets and sets[0].error is None)
        dists = named(lane, "dist.init")
        c.check(
            f"{tag}: rank {rank}: dist.init {backend} ok",
            lambda: (
                len(dists) == 1
                and dists[0].error is None
                and dists[0].attrs.get("starttrace.dist.backend") == backend
                and dists[0].attrs.get("starttrace.dist.rank") == rank
                and dists[0].attrs.get("starttrace.dist.world_size") == expected
            ),
        )
    c.check(
        f"{tag}: CUDA-clean tree (no process flagged cuda_before_fork)",
        lambda: (
            not any(
                p.resource.get("starttrace.cuda_before_fork")
                or any(s.attrs.get("starttrace.cuda_before_fork") for s in p.spans)
                for p in run.processes
            )
        ),
    )
    c.check(
        f"{tag}: no cuda.init in any forkserver",
        lambda: not any(named(p, "cuda.init") for p in run.processes if p.role == "forkserver"),
    )


def check_dirty(c: Checker, run: Run) -> None:
    server = worker_forkserver(run)
    inits = named(server, "cuda.init")
    c.check("dirty: the worker forkserver initialised CUDA while preloading", lambda: len(inits) == 1)
    c.check(
        f"dirty: ... for real (no error: {inits[0].error if inits else 'missing'})",
        lambda: inits[0].error is None and inits[0].attrs.get("starttrace.cuda.device_count", 0) >= 1,
    )
    c.check(
        "dirty: ... triggered by the preload of cuda_preload",
        lambda: "preload cuda_preload" in chain(server, inits[0]) and "forkserver.preload" in chain(server, inits[0]),
    )
    c.check(
        "dirty: audit flags the forkserver (starttrace.cuda_before_fork)",
        lambda: server.resource.get("starttrace.cuda_before_fork") is True,
    )
    forks = named(server, "process.fork")
    c.check(
        "dirty: every process.fork after it is flagged",
        lambda: len(forks) == 4 and all(s.attrs.get("starttrace.cuda_before_fork") is True for s in forks),
    )
    for rank, lane in sorted(ranks(run).items()):
        rank_inits = named(lane, "cuda.init")
        c.check(
            f"dirty: rank {rank}: its own cuda.init fails in the forked child",
            lambda: len(rank_inits) == 1 and "forked subprocess" in (rank_inits[0].error or ""),
        )
        c.check(
            f"dirty: rank {rank}: dist.init gloo ok",
            lambda: [s.error for s in named(lane, "dist.init")] == [None],
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clean", type=Path, required=True)
    parser.add_argument("--clean-ranks", type=int, required=True)
    parser.add_argument("--clean-backend", default="nccl")
    parser.add_argument("--gloo4", type=Path)
    parser.add_argument("--dirty", type=Path)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)

    c = Checker()
    check_cuda_ranks(c, "clean", load(args.clean), args.clean_ranks, args.clean_backend)
    if args.gloo4:
        check_cuda_ranks(c, "gloo4", load(args.gloo4), 4, "gloo")
    if args.dirty:
        check_dirty(c, load(args.dirty))
    summary = f"check_runs: {len(c.lines) - c.failed} passed, {c.failed} failed"
    print(summary)
    if args.report:
        args.report.write_text("\n".join([*c.lines, summary]) + "\n")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
