"""Simulated hosts on one machine (tests/integration/test_multinode.py, tests/e2e/test_vllm_multinode.py).

A "node" is a process tree in its own UTS namespace (hostname), PID namespace (its pids repeat
the other nodes'), time namespace (its own CLOCK_MONOTONIC, `--monotonic`) and, with a skew, its
own wall clock (libfaketime preloaded: `FAKETIME=+0.06` is 60 ms ahead; monotonic time is faked
too, consistently, as libfaketime does by default). Needs root, util-linux `unshare`, Debian
`faketime`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

# pid 1 of a node: names the host, runs the command, then reaps every orphan (the detached OTLP
# exporter) before the namespace ends with it; SIGTERM goes to the command. Not traced: its own
# environment has no switch (the command gets it through `env`).
NODE_INIT = r"""
import os, signal, socket, subprocess, sys
socket.sethostname(sys.argv[1])
child = subprocess.Popen(sys.argv[2:])
signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
code = child.wait()
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
    except InterruptedError:
        continue
sys.exit(code)
"""


@dataclass
class Node:
    name: str
    skew_s: float  # wall clock ahead of the real one (0: the real clock, no libfaketime)
    monotonic_s: int  # time-namespace offset of CLOCK_MONOTONIC
    local_addr: str  # a loopback address of its own (127.0.0.x)


def why_not() -> str | None:
    """Why hosts cannot be simulated here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (pid, uts and time namespaces)"
    if not shutil.which("unshare"):
        return "needs util-linux unshare"
    if not os.path.exists(LIBFAKETIME):
        return "needs Debian faketime (scripts/setup.sh)"
    probe = subprocess.run(
        ["unshare", "--uts", "--time", "--monotonic", "5", "--pid", "--mount-proc", "--fork", "true"],
        capture_output=True,
        text=True,
    )
    return None if probe.returncode == 0 else f"namespaces unavailable: {probe.stderr.strip()}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def node_command(node: Node, command: Sequence[str], env: dict[str, str]) -> list[str]:
    """`command` run on `node`, with `env` added to its environment (and the skewed clock)."""
    extra = [f"{k}={v}" for k, v in env.items()]
    if node.skew_s:
        extra += [f"LD_PRELOAD={LIBFAKETIME}", f"FAKETIME=+{node.skew_s}"]
    return [
        "unshare", "--uts", "--time", "--monotonic", str(node.monotonic_s), "--pid", "--mount-proc", "--fork",
        sys.executable, "-c", NODE_INIT, node.name,
        "env", *extra, *command,
    ]  # fmt: skip
