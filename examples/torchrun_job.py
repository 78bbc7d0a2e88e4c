"""A tiny multi-node torchrun job (gloo, CPU): rendezvous, barrier, all_reduce, then exit.

On each node (here: two on one machine, see docs/multinode.md and tests/integration/test_multinode.py):

    STARTTRACE=1 torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint HEAD:29400 --rdzv-id JOB examples/torchrun_job.py

Each rank prints one JSON line: its rank, host and the wall-clock time (time.time_ns(), this
host's clock) at which it left the barrier, so that a test can compare that with the traced view.
`--sleep-rank R --sleep S` makes rank R arrive S seconds late at the barrier (a straggler).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleep-rank", type=int, default=-1)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == args.sleep_rank:
        time.sleep(args.sleep)
    dist.barrier()
    left_barrier_ns = time.time_ns()
    value = torch.ones(4) * (rank + 1)
    dist.all_reduce(value)
    world = dist.get_world_size()
    assert int(value[0]) == world * (world + 1) // 2, value
    record = {
        "rank": rank,
        "world_size": world,
        "host": socket.gethostname(),
        "left_barrier_ns": left_barrier_ns,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
    }
    print(json.dumps(record), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
