"""An engine that forks its ranks from its own forkserver: the tree `starttrace advise` has advice for.

    STARTTRACE=1 python examples/preload_loop.py [--ranks 2]

The tree (the shape of vLLM on GPUs with VLLM_WORKER_MULTIPROC_METHOD=forkserver, stdlib only):

    main (this process)
     `-- EngineCore  (spawned)
          `-- forkserver  (started by the engine's first forkserver Process.start(); the default
               |            preload, ['__main__'], as vLLM upstream leaves it)
               |-- rank-0 .. rank-N-1  (forked): each imports RANK_MODULES after its fork, then exits

Every rank pays for the same imports again. The loop (docs/findings.md):

    starttrace run -- python examples/preload_loop.py                       # run A
    starttrace advise A --preload-list | tail -n 1                           # the modules
    STARTTRACE_FORKSERVER_PRELOAD=<that line> starttrace run -- python examples/preload_loop.py   # B
    starttrace compare A B                                                   # predicted vs realised

In run B the forkserver preloads the modules and the ranks import none of them. Exit status 0 when
every rank reported back.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time

# Packages each rank imports after its fork (none of them is imported by this module at its top,
# so the forkserver's default preload of __main__ does not load them).
RANK_MODULES = (
    "asyncio",
    "email.mime.multipart",
    "http.server",
    "xml.dom.minidom",
    "unittest",
    "decimal",
    "logging.handlers",
    "sqlite3",
    "tarfile",
    "zipfile",
    "csv",
    "json",
    "difflib",
    "pydoc",
)


def rank_main(rank: int, results: object) -> None:
    """One rank, forked by the engine's forkserver: the imports a rank would need for its work."""
    start = time.perf_counter()
    for name in RANK_MODULES:
        __import__(name)
    results.put((rank, time.perf_counter() - start))  # type: ignore[attr-defined]


def engine_main(ranks: int, results: object) -> None:
    """The engine: forks its ranks from a forkserver of its own (default preload)."""
    ctx = multiprocessing.get_context("forkserver")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, queue), name=f"rank-{r}") for r in range(ranks)]
    for proc in procs:
        proc.start()
    got = [queue.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    results.put(sorted(got))  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args(argv)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    engine = ctx.Process(target=engine_main, args=(args.ranks, results), name="EngineCore")
    engine.start()
    got = results.get(timeout=120)
    engine.join(timeout=30)
    for rank, seconds in got:
        print(f"rank {rank}: imported {len(RANK_MODULES)} packages in {seconds:.3f} s")
    ok = engine.exitcode == 0 and [r for r, _ in got] == list(range(args.ranks))
    print(f"preload_loop: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
