"""A GPU-server-shaped process tree built from forkservers, for tracing with starttrace.

    STARTTRACE=1 python examples/forkserver_ranks.py [--ranks 4] [--cuda-in-preload]
                                                     [--backend gloo|nccl] [--device cpu|cuda]

The tree (the same shape as vLLM on GPUs with VLLM_WORKER_MULTIPROC_METHOD=forkserver):

    api (this process)
     |-- forkserver "api"  preloads: forkserver_ranks, json          (forkserver.preload)
     |    `-- engine  (forked by the api forkserver: the EngineCore of this toy)
     |         |-- forkserver "workers"  preloads: forkserver_ranks, socket
     |         |                         [+ cuda_preload with --cuda-in-preload]
     |         |    |-- rank 0 .. N-1  (forked: process.fork per rank)
     |         |    |     each: sets RANK/LOCAL_RANK/WORLD_SIZE, imports torch after its fork,
     |         |    |     calls torch.cuda.init() (fails on a CPU-only torch: recorded with its
     |         |    |     error), runs init_process_group over tcp://127.0.0.1:<free port>, one
     |         |    |     all_reduce, and exits.

With `--cuda-in-preload` the worker forkserver preloads `cuda_preload`, which initialises CUDA
(or tries to, on a CPU-only torch): the forks after it are not CUDA-clean, and starttrace's audit
flags them (`starttrace.cuda_before_fork`). The program itself knows nothing of starttrace.
Exit status: 0 when every rank joined the process group and the all_reduce summed correctly.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
API_PRELOAD = ["forkserver_ranks", "json"]
WORKER_PRELOAD = ["forkserver_ranks", "socket"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_main(rank: int, world_size: int, port: int, backend: str, device: str, results: object) -> None:
    """One rank: forked by the worker forkserver. torch is imported here, after the fork."""
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    import torch
    import torch.distributed as dist

    cuda_error = ""
    try:
        torch.cuda.init()
    except Exception as exc:  # a CPU-only torch: "Torch not compiled with CUDA enabled"
        cuda_error = f"{type(exc).__name__}: {exc}"
    tensor_device = torch.device("cpu")
    init_kwargs: dict[str, Any] = {}
    if device == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise SystemExit(f"rank {rank}: --device cuda but no CUDA device ({cuda_error})")
        local = rank % count
        torch.cuda.set_device(local)
        tensor_device = torch.device("cuda", local)
        if backend == "nccl":
            init_kwargs["device_id"] = tensor_device
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, **init_kwargs
    )
    value = torch.ones(1, device=tensor_device) * (rank + 1)
    dist.all_reduce(value)
    total = int(value.item())
    dist.barrier()
    dist.destroy_process_group()
    results.put((rank, total, cuda_error))  # type: ignore[attr-defined]


def engine_main(ranks: int, backend: str, device: str, cuda_in_preload: bool, results: object) -> None:
    """The EngineCore of this toy: forked by the api forkserver, starts its own worker forkserver."""
    # A fresh forkserver for the workers, owned by this process: the forkserver state this process
    # inherited from the api forkserver has no server running (a forkserver process never starts
    # one of its own), so the first Process.start() below starts one with this preload list.
    ctx = multiprocessing.get_context("forkserver")
    preload = list(WORKER_PRELOAD) + (["cuda_preload"] if cuda_in_preload else [])
    ctx.set_forkserver_preload(preload)
    port = free_port()
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=rank_main, args=(rank, ranks, port, backend, device, queue), name=f"rank-{rank}")
        for rank in range(ranks)
    ]
    for proc in procs:
        proc.start()
    collected: list[tuple[int, int, str]] = []
    deadline = time.monotonic() + 120
    while len(collected) < ranks and time.monotonic() < deadline:
        if all(p.exitcode is not None for p in procs) and queue.empty():
            break
        try:
            collected.append(queue.get(timeout=1))
        except Exception:
            continue
    for proc in procs:
        proc.join(timeout=30)
    codes = [p.exitcode for p in procs]
    results.put(("engine", sorted(collected), codes))  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--cuda-in-preload", action="store_true", help="preload a module that initialises CUDA")
    args = parser.parse_args(argv)

    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import forkserver_ranks as lib  # the targets must be importable by the forkserver children

    start = time.monotonic()
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(API_PRELOAD)
    results = ctx.Queue()
    engine = ctx.Process(
        target=lib.engine_main,
        args=(args.ranks, args.backend, args.device, args.cuda_in_preload, results),
        name="engine",
    )
    engine.start()
    try:
        kind, collected, codes = results.get(timeout=180)
    except Exception as exc:
        print(f"forkserver_ranks: no result from the engine: {type(exc).__name__}: {exc}", file=sys.stderr)
        engine.kill()
        return 2
    engine.join(timeout=30)
    expected = args.ranks * (args.ranks + 1) // 2
    ok = (
        kind == "engine"
        and engine.exitcode == 0
        and codes == [0] * args.ranks
        and [rank for rank, _, _ in collected] == list(range(args.ranks))
        and all(total == expected for _, total, _ in collected)
    )
    for rank, total, cuda_error in collected:
        cuda = "cuda ok" if not cuda_error else f"cuda init failed ({cuda_error})"
        print(f"rank {rank}: all_reduce={total} (expected {expected}); {cuda}")
    print(f"forkserver_ranks: {'ok' if ok else 'FAILED'} in {time.monotonic() - start:.1f} s; rank exit codes {codes}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
