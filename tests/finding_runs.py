"""Hand-built runs (the run type, as every source produces it) for the findings and terminal tests:
a forkserver tree (api -> EngineCore -> its forkserver -> 2 ranks), a spawn tree with an unused
forkserver, and a live run with a stuck rank."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from starttrace.run import Process, Run, Span, spans_table

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
XSS = "<img src=x onerror=alert(1)>"


@dataclass
class P:
    pid: int
    resource: dict[str, Any]
    spans: list[Span] = field(default_factory=list)
    proc_id: str = ""


class Builder:
    """A run from spans given in milliseconds since T0; parents by span id."""

    def __init__(self, argv: list[str] | None = None) -> None:
        self.ids = itertools.count(1)
        self.procs: list[P] = []
        self.root = self.new_id()
        self.startup = Span(self.root, None, "startup", T0, None, {"starttrace.phase": "startup"})
        self.argv = argv or ["python", "-m", "myapp"]

    def new_id(self) -> str:
        return f"{next(self.ids):016x}"

    def proc(
        self,
        pid: int,
        ppid: int,
        role: str,
        method: str,
        parent: str | None,
        start: float,
        end: float | None,
        **res: Any,
    ) -> P:
        resource = {"process.pid": pid, "process.parent_pid": ppid, "starttrace.role": role}
        resource["starttrace.start_method"] = method
        resource.update({f"starttrace.{k}": v for k, v in res.items()})
        p = P(pid, resource)
        p.proc_id = self.span(p, "process", start, end, parent or self.root, phase="process")
        self.procs.append(p)
        return p

    def span(self, p: P, name: str, start: float, end: float | None, parent: str | None = None, **attrs: Any) -> str:
        sid = self.new_id()
        a = {f"starttrace.{k}": v for k, v in attrs.items()}
        if name.startswith("import "):
            a.setdefault("starttrace.phase", "import")
            a.setdefault("starttrace.import.module", name[7:])
        p.spans.append(
            Span(sid, parent or p.proc_id, name, T0 + int(start * MS), None if end is None else T0 + int(end * MS), a)
        )
        return sid

    def build(self, ready_at: float | None, run_id: str = "find1") -> Run:
        if ready_at is not None:
            self.startup.end_ns = T0 + int(ready_at * MS)
            self.span(self.procs[0], "ready", ready_at, ready_at, phase="ready")
            self.procs[0].spans[-1].instant = True
        else:
            self.startup.in_progress = True
        procs = []
        rows: list[tuple[str, Span]] = []
        for p in self.procs:
            for s in p.spans:
                if s.end_ns is None:
                    s.in_progress = True
                rows.append((f"{p.pid:08x}", s))
            procs.append(Process(f"{p.pid:08x}", p.pid, p.resource["process.parent_pid"], None, p.resource, p.proc_id))
        meta = {"argv": self.argv}
        return Run(run_id, "ab" * 16, self.root, meta, procs, [], [self.startup], spans_table(rows))


def forkserver_run() -> Run:
    """api -> EngineCore (spawn) -> its forkserver (default preload) -> 2 ranks (forked)."""
    b = Builder()
    api = b.proc(100, 1, "api_server", "root", None, 0, 6000)
    launch = b.span(api, "process.launch", 100, 150, phase="launch", child_pid=101, start_method="spawn")
    eng = b.proc(101, 100, "engine_core", "spawn", launch, 120, 6000, process_name="EngineCore")
    b.span(eng, "import pkg", 200, 500)  # the EngineCore imports what the ranks do: it is not a rank
    start = b.span(eng, "forkserver.start", 600, 620, phase="forkserver", child_pid=102, preload=["__main__"])
    fs = b.proc(102, 101, "forkserver", "spawn", start, 610, 6000)
    pre = b.span(fs, "forkserver.preload", 650, 660, phase="forkserver_preload", preload=["__main__"])
    b.span(fs, "preload __main__", 651, 659, pre, phase="forkserver_preload")
    for r in range(2):
        fork = b.span(fs, "process.fork", 700 + r, 701 + r, phase="fork", child_pid=110 + r)
        w = b.proc(110 + r, 102, "worker", "forkserver", fork, 701 + r, 6000, rank=r, world_size=2)
        t = 710.0
        if r == 0:
            outer = b.span(w, "import pkg", t, t + 300)
            b.span(w, "import pkg.sub", t + 50, t + 250, outer)
        else:  # importing the submodule first loads the package inside it
            outer = b.span(w, "import pkg.sub", t, t + 300)
            b.span(w, "import pkg", t + 10, t + 100, outer)
        t += 310
        b.span(w, "import myapp", t, t + 20)  # the program's __main__ module (python -m myapp)
        t += 30
        cuda = b.span(w, "import torchish", t, t + 100)
        b.span(w, "cuda.init", t + 10, t + 90, cuda, phase="cuda_init")
        t += 110
        b.span(w, f"import only{r}", t, t + 40)
        t += 50
        b.span(w, f"import {XSS}", t, t + 30)
        t += 40
        slow = 100 + 500 * r  # rank 1's import of slowmod takes 0.5 s longer
        b.span(w, "import slowmod", t, t + slow)
        t += slow + 10
        b.span(w, "dist.init", t, 2400, phase="dist_init")
        b.span(w, "vllm.model_load", 2400, 3000 + 50 * r, phase="model_load")
        b.span(w, "process.ready", 3100, 3100, phase="ready")
        w.spans[-1].instant = True
    return b.build(ready_at=5000)


def spawn_run() -> Run:
    """api starts a forkserver it never forks from; EngineCore spawns 2 ranks."""
    b = Builder(["/venv/bin/vllm", "serve", "m"])
    api = b.proc(100, 1, "api_server", "root", None, 0, 8000)
    start = b.span(api, "forkserver.start", 50, 60, phase="forkserver", child_pid=103)
    fs = b.proc(103, 100, "forkserver", "spawn", start, 55, 8000)
    pre = b.span(fs, "forkserver.preload", 100, 2100, phase="forkserver_preload", preload=["vllm.v1.engine.async_llm"])
    b.span(fs, "preload vllm.v1.engine.async_llm", 100, 2100, pre, phase="forkserver_preload")
    b.span(api, "import vllm.entrypoints.openai.api_server", 70, 1500)
    launch = b.span(api, "process.launch", 1600, 1650, phase="launch", child_pid=101, start_method="spawn")
    eng = b.proc(101, 100, "engine_core", "spawn", launch, 1610, 8000)
    for r in range(2):
        wl = b.span(eng, "process.launch", 2000 + r, 2040 + r, phase="launch", child_pid=110 + r, start_method="spawn")
        w = b.proc(110 + r, 101, "worker", "spawn", wl, 2010 + r, 8000, rank=r, world_size=2)
        b.span(w, "python.init", 2010 + r, 2060 + r, phase="interpreter")
        b.span(w, "import vllm.v1.worker.gpu_worker", 2100, 4000 + 20 * r)
        b.span(w, "dist.init", 4100, 4200, phase="dist_init")
    wait = b.span(eng, "vllm.executor.wait_for_workers", 2100, 4300, phase="executor_init")
    del wait
    b.span(api, "vllm.wait_for_engine_core", 1700, 4400, phase="engine_init")
    return b.build(ready_at=4500)


def stuck_run() -> Run:
    """Live: rank 0 waits in dist.init; rank 1 is stuck importing stuckmod."""
    b = Builder()
    main = b.proc(100, 1, "main", "root", None, 0, None)
    for r in range(2):
        launch = b.span(main, "process.launch", 10 + r, 20 + r, phase="launch", child_pid=110 + r, start_method="spawn")
        if r == 0:
            w = b.proc(110, 100, "worker", "spawn", launch, 15, None, rank=0, world_size=2)
            b.span(w, "dist.init", 1000, None, phase="dist_init")
        else:
            w = b.proc(111, 100, "child", "spawn", launch, 16, None, process_name="rank-1", process_target="rank_main")
            b.span(w, "import stuckmod", 1000, None)
    return b.build(ready_at=None, run_id="stuck")
