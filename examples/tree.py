"""A real process tree for starttrace: the shapes a GPU server's startup takes, on any machine.

root -> a spawn child, a fork child, a forkserver (started with a preload list) that forks two
children, a `subprocess` Python child, and a spawn child that imports torch (when installed).

    STARTTRACE=1 python examples/tree.py
    python examples/tree.py --split-stderr DIR   # each process's stderr in DIR/<pid>.err

`--split-stderr` exists for the ground-truth test: with PYTHONPROFILEIMPORTTIME=1 every process
prints its import times on stderr, and one file per process keeps them apart.
"""

# No `from __future__ import annotations` here: a forkserver child would import `__future__`
# before own_stderr() below, and print its import time into the forkserver's stderr file.
import os

SPLIT_ENV = "TREE_SPLIT_STDERR"


def own_stderr() -> None:
    """In a fork or forkserver child: from here on, stderr goes to this process's own file."""
    folder = os.environ.get(SPLIT_ENV)
    if folder:
        try:
            current = os.path.basename(os.readlink("/proc/self/fd/2"))
        except OSError:
            current = ""
        if current == f"{os.getpid()}.err" or current.startswith(f"launch-{os.getppid()}-"):
            return  # already this process's own file (set up by the parent that launched it)
        fd = os.open(os.path.join(folder, f"{os.getpid()}.err"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)


if __name__ == "__mp_main__":
    own_stderr()  # a forkserver child imports this module before its target: before any import

import argparse  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402


class launched_stderr:
    """Around a launch by exec: the child inherits a file of its own as its stderr."""

    def __init__(self) -> None:
        self.folder = os.environ.get(SPLIT_ENV)
        self.path = ""
        self.saved = -1

    def __enter__(self) -> "launched_stderr":
        if self.folder:
            self.path = os.path.join(self.folder, f"launch-{os.getpid()}-{os.urandom(3).hex()}.err")
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self.saved = os.dup(2)
            os.dup2(fd, 2)
            os.close(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.saved >= 0:
            os.dup2(self.saved, 2)
            os.close(self.saved)

    def name_after(self, pid: int | None) -> None:
        if self.path and pid:
            os.replace(self.path, os.path.join(self.folder or "", f"{pid}.err"))


def spawn_child() -> None:
    import decimal  # noqa: F401
    import fractions  # noqa: F401


def fork_child() -> None:
    own_stderr()
    import statistics  # noqa: F401


def forkserver_child(index: int) -> None:
    own_stderr()
    import difflib  # noqa: F401
    import tomllib  # noqa: F401

    if index == 1:
        import pprint  # noqa: F401


def torch_child() -> None:
    try:
        import torch
    except ImportError:
        return
    torch.zeros(2).sum()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split-stderr", metavar="DIR", help="one stderr file per process in DIR")
    parser.add_argument("--no-torch", action="store_true", help="skip the child that imports torch")
    args = parser.parse_args()
    if args.split_stderr:
        os.makedirs(args.split_stderr, exist_ok=True)
        os.environ[SPLIT_ENV] = os.path.abspath(args.split_stderr)

    import json  # the root's own imports, after activation

    # What Process.start() would import in this process, imported now: during a launch, this
    # process's stderr is the child's file, and its import-time lines must not land there.
    import multiprocessing.forkserver
    import multiprocessing.popen_fork
    import multiprocessing.popen_forkserver
    import multiprocessing.popen_spawn_posix
    import textwrap  # noqa: F401
    from multiprocessing import resource_tracker

    with launched_stderr() as redirect:
        resource_tracker.ensure_running()
    redirect.name_after(resource_tracker._resource_tracker._pid)

    spawn = multiprocessing.get_context("spawn")
    fork = multiprocessing.get_context("fork")
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(["colorsys", "email.utils", "runpy", "pkgutil"])

    pids: dict[str, int] = {}
    with launched_stderr() as redirect:
        child = spawn.Process(target=spawn_child, name="spawn-child")
        child.start()
    redirect.name_after(child.pid)
    child.join()
    pids["spawn"] = child.pid or 0

    child = fork.Process(target=fork_child, name="fork-child")
    child.start()
    child.join()
    pids["fork"] = child.pid or 0

    with launched_stderr() as redirect:
        first = forkserver.Process(target=forkserver_child, args=(0,), name="forkserver-child-0")
        first.start()
    from multiprocessing import forkserver as forkserver_module

    redirect.name_after(forkserver_module._forkserver._forkserver_pid)
    second = forkserver.Process(target=forkserver_child, args=(1,), name="forkserver-child-1")
    second.start()
    first.join()
    second.join()
    pids["forkserver-children"] = (first.pid or 0) + (second.pid or 0)

    folder = os.environ.get(SPLIT_ENV)
    with launched_stderr() as redirect:
        proc = subprocess.Popen([sys.executable, "-c", "import calendar, zipfile"])
    redirect.name_after(proc.pid)
    proc.wait()
    pids["subprocess"] = proc.pid

    if not args.no_torch:
        with launched_stderr() as redirect:
            child = spawn.Process(target=torch_child, name="torch-child")
            child.start()
        redirect.name_after(child.pid)
        child.join()
        pids["torch"] = child.pid or 0

    codes = [first.exitcode, second.exitcode, proc.returncode]
    print(json.dumps({"pids": pids, "root": os.getpid(), "split": folder}))
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
