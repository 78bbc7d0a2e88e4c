"""A collective inside a function torch.compile traces with fullgraph (vLLM's TP all_reduce inside
the compiled model) is the group's first: the torch probe's wrapper must let Dynamo see only the
original (it failed the real vLLM TP=2 start's profile run before)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from starttrace.sources.journal_reader import read_run

pytest.importorskip("torch")

PROGRAM = r"""
import os, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
assert getattr(dist.all_reduce, "__starttrace__", False)
dist.barrier()  # the default group's first collective: eager, recorded

def f(x):
    y = x * 2
    dist.all_reduce(y, group=dist.group.WORLD)  # WORLD by name: a group whose first collective is compiled
    return y + 1

print(torch.compile(f, fullgraph=True)(torch.ones(2)).tolist())
dist.destroy_process_group()
"""


def test_a_compiled_first_collective_passes_to_the_original(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARTTRACE") and k.lower() != "traceparent"}
    env.update(STARTTRACE="1", STARTTRACE_DIR=str(tmp_path / "runs"))
    proc = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[3.0, 3.0]"
    (run_dir,) = (tmp_path / "runs").iterdir()
    names = read_run(run_dir).spans["name"].to_list()
    assert names.count("dist.barrier") == 1  # the eager one is still recorded
