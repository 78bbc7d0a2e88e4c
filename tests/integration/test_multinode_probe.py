"""The collective probe (probes/torch.py): the first blocking barrier / all_reduce / all_gather of
each process group is a span (a clock sync point); later calls, async calls and other groups' later
calls are not, and every call still does what torch does. A real gloo group in one traced process."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from run_spans import spans_of

from starttrace.sources.journal_reader import read_run

PROGRAM = r"""
import socket, sys
import torch
import torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
dist.barrier()
dist.barrier()                      # the group's second call: not a span
t = torch.ones(3)
dist.all_reduce(t)                  # the same (default) group: not a span
sub = dist.new_group([0])
work = dist.all_reduce(t, group=sub, async_op=True)   # async: not a sync point, not recorded
work.wait()
out = [torch.zeros(3)]
dist.all_gather(out, t, group=sub)  # the first blocking call on `sub`: a span
assert float(out[0][0]) == 1.0, out
dist.destroy_process_group()
print("ok")
"""


def test_first_collective_per_group_is_a_sync_span(
    venv_python: str, traced_env: dict[str, str], journal_root: Path, only_run_dir: Callable[[Path], Path]
) -> None:
    proc = subprocess.run([venv_python, "-c", PROGRAM], env=traced_env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    run = read_run(only_run_dir(journal_root))
    (process,) = run.processes
    collectives = [s for s in spans_of(run, process) if s.name.startswith("dist.") and s.name != "dist.init"]
    assert [s.name for s in collectives] == ["dist.barrier", "dist.all_gather"], [s.name for s in collectives]
    barrier, gather = collectives
    assert barrier.attrs["starttrace.dist.group"] == "world/1" and barrier.attrs["starttrace.dist.sync"] is True
    assert gather.attrs["starttrace.dist.group"] == "ranks/0-0"
    assert gather.attrs["starttrace.dist.device"] == "cpu" and gather.attrs["starttrace.dist.sync"] is True
    assert all(s.attrs["starttrace.phase"] == "dist_init" and s.end_ns is not None for s in collectives)
    probes = process.resource["starttrace.probes"]
    assert {"torch.distributed.barrier", "torch.distributed.all_reduce", "torch.distributed.all_gather"} <= set(probes)


COMPILED = r"""
import socket
import torch
import torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
sub = dist.new_group([0])

@torch.compile(fullgraph=True, backend="eager")
def forward(x):
    y = x * 2
    dist.all_reduce(y, group=sub)   # the group's first collective, while Dynamo traces (vLLM's TP forward)
    return y

assert float(forward(torch.ones(3))[0]) == 2.0
dist.destroy_process_group()
print("ok")
"""


def test_a_groups_first_collective_inside_a_compiled_forward_passes_through(
    venv_python: str, traced_env: dict[str, str], journal_root: Path, only_run_dir: Callable[[Path], Path]
) -> None:
    """Dynamo cannot trace the span's bookkeeping (`hasattr(dist.group, "WORLD")`): while it
    traces, the wrapper calls only the original, so a fullgraph compile of a TP forward works."""
    proc = subprocess.run([venv_python, "-c", COMPILED], env=traced_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    run = read_run(only_run_dir(journal_root))
    (process,) = run.processes
    assert not [s for s in spans_of(run, process) if s.name == "dist.all_reduce"]  # traced: no span of its own
