"""The waterfall model: one analysis of a run that every view (JSON, HTML, terminal, metrics,
compare) renders.

Input is the run type (`starttrace.run.Run`), from any source; `analysis.lanes.build_model` builds
the model, `analysis.critical_path` and `analysis.advice` derive from it. Times are absolute epoch
nanoseconds inside the model; the JSON view uses microseconds relative to the run start (`t0`).

Definitions (also in docs/service.md):
- lane: one process (resource `service.instance.id`, else pid), grouped by role in ROLE_ORDER,
  sorted by rank, then start.
- a span still open is "in progress"; while the run is live its effective end is now, otherwise the
  newest timestamp of the run. `open_s` is how long it has been open.
- phase seconds of a lane: the union of the intervals of its spans with that phase (nested spans of
  one phase are not counted twice; different phases may overlap, e.g. imports inside model_load).
- lane ready: its `ready` span; else, once the run is ready, the end of its last span that ended
  before the run's ready time. Time to ready is measured from the run start (`t0`).
- coverage: share of the lane's window (its `process` span, up to the lane's ready time when
  known) covered by the union of the lane's other spans; what is not covered is listed as gaps.
- critical path: see `critical_path`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

ROLE_ORDER = {"api_server": 0, "engine_core": 1, "forkserver": 2, "worker": 3, "child": 4, "helper": 5, "main": 6}

NAME_PHASES = {
    "startup": "startup",
    "process": "process",
    "python.init": "interpreter",
    "forkserver.start": "forkserver",
    "forkserver.preload": "forkserver_preload",
    "process.launch": "launch",
    "process.fork": "fork",
    "process.bootstrap": "bootstrap",
    "process.wait": "wait",
    "cuda.init": "cuda_init",
    "dist.init": "dist_init",
    "ready": "ready",
}

# phases whose time is not "work" inside a lane
STRUCTURAL_PHASES = ("process", "startup")  # a tuple: `select` takes it as it is

GAP_MIN_NS = 1_000_000  # gaps shorter than 1 ms are not listed
MAX_GAPS = 20
TOP_HOTSPOTS = 200


class SpanNode:
    __slots__ = (
        "attrs",
        "children",
        "depth",
        "duration",
        "eff_end",
        "end",
        "error",
        "id",
        "idx",
        "imports",
        "in_progress",
        "instant",
        "lane",
        "module",
        "name",
        "parent",
        "parent_node",
        "phase",
        "pos",
        "self_us",
        "start",
        "thread",
    )

    duration: int  # eff_end - start (>= 0), set with eff_end by `analysis.lanes.build_model`
    # the imported module: `starttrace.import.module`, else the name after `import `, else None
    # (set once by build_model: the analysis asks for it ~6 times per import span)
    module: str | None
    # `starttrace.import.self_us` when it is a number, else None (set once by build_model)
    self_us: int | float | None

    # the one empty list every leaf shares (a list each was 72 bytes of fresh memory per span); never
    # appended to: whoever links a first child gives the parent a list of its own (analysis.lanes)
    NO_CHILDREN: ClassVar[list[SpanNode]] = []

    def __init__(self) -> None:
        self.children: list[SpanNode] = SpanNode.NO_CHILDREN
        self.parent_node: SpanNode | None = None
        self.imports: list[SpanNode] | None = None  # findings.common.import_children, once asked
        self.depth = 0
        self.pos = 0
        self.self_us = None


@dataclass
class Lane:
    index: int
    id: str
    pid: int | None
    ppid: int | None
    role: str | None
    rank: int | None
    local_rank: int | None
    world_size: int | None
    start_method: str | None
    service: str | None
    host: str | None
    command: str | None
    resource: dict[str, Any]
    exited: bool | None
    exit_code: int | None
    warnings: list[str]
    preloaded: list[str]
    spans: list[SpanNode] = field(default_factory=list)
    process_span: SpanNode | None = None
    start: int = 0
    end: int = 0
    ready_ns: int | None = None
    phases: dict[str, int] = field(default_factory=dict)
    coverage: float | None = None
    gaps: list[tuple[int, int]] = field(default_factory=list)
    unexplained_ns: int = 0
    import_ns: int = 0
    top_imports: list[tuple[str, int]] = field(default_factory=list)
    in_progress: list[SpanNode] = field(default_factory=list)
    # the exclusive breakdown of [start, end] (analysis.breakdown): label -> ns, adding up to end - start
    breakdown: dict[str, int] = field(default_factory=dict)
    timeline: list[tuple[int, int, str]] = field(default_factory=list)  # its segments (start, end, label)
    after_ready: bool = False  # started after the run was ready: no part of its time to ready
    launched_by: SpanNode | None = None  # the launch/fork span (in another lane) that made it
    node: str | None = None  # its host, in a run of several nodes (analysis/nodes.py)

    @property
    def label(self) -> str:
        """`role rank R pid P`; a generic multiprocessing child (`child`) by its Process name and
        target: `Worker-0 (rank_main) pid P`."""
        text = self.role or "process"
        name = self.resource.get("starttrace.process_name")
        if self.role == "child" and self.rank is None and isinstance(name, str) and name:
            target = self.resource.get("starttrace.process_target")
            text = f"{name} ({target})" if isinstance(target, str) and target and target != name else name
        if self.rank is not None:
            text += f" rank {self.rank}"
        if self.pid is not None:
            text += f" pid {self.pid}"
        return text


@dataclass
class PathStep:
    lane: int
    name: str
    phase: str
    start: int
    end: int
    kind: str = "span"  # span | launch | wait | self (a span's own time after its last child span)


@dataclass
class RunModel:
    run_id: str
    trace_id: str | None
    service: str | None
    meta: dict[str, Any]
    problems: list[str]
    t0: int
    t_end: int
    now_ns: int
    status: str  # ready | finished | exited | killed | running (analysis/liveness.py)
    ready_ns: int | None
    lanes: list[Lane]
    spans: list[SpanNode]
    phases: list[str]
    hotspots: list[dict[str, Any]]
    preload_advice: list[dict[str, Any]]
    cuda_audit: dict[str, Any]
    critical_path: list[PathStep]
    version: int = 0
    updated_at: float | None = None
    source: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)  # analysis.findings (docs/findings.md)
    span_frame: Any = field(default=None, repr=False)  # analysis.table.span_table, built once

    @property
    def live(self) -> bool:
        return self.status == "running"

    @property
    def startup_s(self) -> float:
        end = self.ready_ns if self.ready_ns is not None else self.t_end
        return max(0, end - self.t0) / 1e9

    def seconds(self, t: int | None) -> float | None:
        return None if t is None else round((t - self.t0) / 1e9, 6)


def self_ns(n: SpanNode) -> int:
    us = n.self_us
    if us is not None:
        return int(us * 1000)
    children = n.children
    if not children:
        return n.duration
    return max(0, n.duration - sum([c.duration for c in children]))


try:  # starttrace/_modelcore.c, built at install where a C compiler is there
    from starttrace._modelcore import select as c_select  # type: ignore[import-not-found]
    from starttrace._modelcore import split_imports as c_split_imports  # type: ignore[import-not-found]
except ImportError:
    c_select = c_split_imports = None


def select(
    spans: list[SpanNode], phases: tuple[str, ...], names: tuple[str, ...] = (), keep: bool = True
) -> list[SpanNode]:
    """The spans whose phase is in `phases` or whose name is in `names`; with `keep=False` the
    others. In order; in C where the extension is built (the model build and the findings filter
    every lane this way, several times)."""
    if c_select is not None:
        return c_select(spans, SpanNode, phases, names, keep)  # type: ignore[no-any-return]
    if keep:
        return [n for n in spans if n.phase in phases or n.name in names]
    return [n for n in spans if not (n.phase in phases or n.name in names)]


def split_imports(spans: list[SpanNode], min_ns: int) -> tuple[list[SpanNode], list[SpanNode]]:
    """The spans a first answer always sends (not an import, or still in progress), and the
    imports at least `min_ns` long, each in order (`views.startup_json` asks it of every lane)."""
    if c_split_imports is not None:
        return c_split_imports(spans, SpanNode, min_ns, "import")  # type: ignore[no-any-return]
    always: list[SpanNode] = []
    longer: list[SpanNode] = []
    for n in spans:
        if n.phase != "import" or n.in_progress:
            always.append(n)
        elif n.duration >= min_ns:
            longer.append(n)
    return always, longer


def rank_slot(lane: Lane) -> tuple[Any, ...]:
    return (lane.role, lane.rank) if lane.rank is not None else ("lane", lane.id)
