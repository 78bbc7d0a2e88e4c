"""Which host and clock domain a traced process runs in (hot path: imports only the recorder).

A clock domain is a set of processes whose CLOCK_MONOTONIC is one clock: one kernel boot
(`/proc/sys/kernel/random/boot_id`) and one time namespace (`readlink /proc/self/ns/time`; a time
namespace offsets CLOCK_MONOTONIC, containers without one share the host's). The root process of a
run reads them once and passes them on in the environment (`STARTTRACE_CLOCK_DOMAIN`,
`STARTTRACE_HOST_ID`), so its children pay two dictionary lookups. Every process records them as
resource attributes `starttrace.clock.domain` and `host.id` (the machine id, else the boot id).
The kernel's NTP state is read off the hot path (`starttrace.clocksync`).
"""

import os
import sys

from starttrace.tracer import recorder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import MutableMapping
    from typing import Any
else:  # annotations are evaluated at run time (no __future__ import: it would load a module)
    Any = object
    MutableMapping = dict

ENV_CLOCK_DOMAIN = "STARTTRACE_CLOCK_DOMAIN"
ENV_HOST_ID = "STARTTRACE_HOST_ID"


def _read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read(200).decode("ascii", "replace").strip()
    except OSError:
        return ""


def time_namespace() -> str:
    """The inode of this process's time namespace ("" without /proc or time namespaces)."""
    try:
        link = os.readlink("/proc/self/ns/time")  # "time:[4026531834]"
    except OSError:
        return ""
    return link.partition("[")[2].rstrip("]")


def clock_domain() -> tuple[str, str]:
    """(clock domain, host id) of this process, read from /proc (the root does this once)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    if not boot:
        boot = "host:" + os.uname().nodename
    timens = time_namespace()
    domain = f"{boot}/{timens}" if timens else boot
    return domain, _read("/etc/machine-id") or boot


def process_attrs(environ: MutableMapping[str, str], is_root: bool = False, job: Any = None) -> dict[str, Any]:
    """Resource attributes of this process: clock domain and host id (inherited from the run's
    root through `environ`; a root reads them and puts them there for its children), the keys of
    the root's job of several nodes (`job`: launchers.identify's), plus what a rank started for
    torch's env:// rendezvous names as its endpoint."""
    domain = environ.get(ENV_CLOCK_DOMAIN)
    host_id = environ.get(ENV_HOST_ID)
    if is_root or not domain or not host_id:
        domain, host_id = clock_domain()
        environ[ENV_CLOCK_DOMAIN] = domain
        environ[ENV_HOST_ID] = host_id
    else:
        # the boot id is the kernel's and cannot change below the root; the time namespace can
        # (a child started with `unshare --time`): that is one readlink, read by every process
        timens = time_namespace()
        domain = domain.partition("/")[0] + (f"/{timens}" if timens else "")
    attrs: dict[str, Any] = {"starttrace.clock.domain": domain, "host.id": host_id}
    if is_root and job is not None:
        attrs.update(job.attrs())
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if addr and port:
        attrs["starttrace.dist.master"] = f"{addr}:{port}"
    return attrs


class _Clock:
    recorded = False


_HELPER_ENV = ("PATH", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH")


def record_clock_later(run_dir: str, root_span: str, reap: bool) -> None:
    """The kernel's NTP state for a run no exporter follows (journals only): a root process calls
    this at its `ready` or exit (once; `lifecycle.record_clock_state`). A detached helper (`python -m
    starttrace.clocksync`, not traced, its output to /dev/null: it holds none of the program's
    pipes) reads adjtimex, which needs ctypes, and writes `<run folder>/clock-<root span>.json`;
    readers put it on the processes of this host (docs/journal.md). `reap`: wait for the helper on
    a thread of ours (at ready; at exit, init reaps it)."""
    environ = os.environ
    if _Clock.recorded or not run_dir or not root_span:
        return
    _Clock.recorded = True
    env = {"STARTTRACE_INTERNAL": "1"}  # what the helper needs, not a copy of the program's environment
    for name in _HELPER_ENV:
        value = environ.get(name)
        if value is not None:
            env[name] = value
    domain = environ.get(ENV_CLOCK_DOMAIN) or clock_domain()[0]
    quiet = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    args = [sys.executable, "-m", "starttrace.clocksync", run_dir, root_span, domain]
    try:
        pid = os.posix_spawn(sys.executable, args, env, file_actions=quiet, setsid=True)
    except Exception as exc:
        recorder.report(f"cannot record the clock state: {type(exc).__name__}: {exc}", key="clock-state")
        return
    if not reap:
        return
    try:  # reaped by a thread of ours: no zombie stays behind for the program to find in os.wait()
        from _thread import start_new_thread  # a builtin module: no footprint

        start_new_thread(_reap, (pid,))
    except Exception:
        pass  # at interpreter shutdown: the process ends, and init reaps the helper


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except OSError:  # the program reaped it first (os.wait(), waitpid(-1))
        pass
