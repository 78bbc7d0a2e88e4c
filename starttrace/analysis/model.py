"""The waterfall model: one analysis of a run that every view (JSON, HTML, terminal, metrics,
compare) renders.

Input is the run type (`starttrace.run.Run`), from any source; `analysis.lanes.build_model` builds
the model, `analysis.critical_path`, `analysis.breakdown` and `analysis.findings` derive from it.
Times are absolute epoch nanoseconds inside the model; the JSON view uses microseconds relative to
the run start (`t0`).

The model's spans are one table (`RunModel.spans`, MODEL_SCHEMA; Perfetto's slice table): a row
per span, sorted by lane, then start, then arrival, so each lane's spans are one slice of it
(`Lane.offset`, `Lane.count`), and a span's `idx` is its row. `parent` is the row of its parent in
the same lane (the tree Perfetto keeps per track), `up` the row of its parent anywhere (a child
process's `process` span hangs under the launch span of another lane). Passes over every span are
table operations; a pass that walks a few spans (a critical path, a CUDA chain, a finding's
evidence) asks for them as `SpanNode`s, made from their rows on demand (`RunModel.node`).

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
from typing import Any

import numpy as np
import polars as pl

from starttrace.run import decode_attrs

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
    "first_token": "first_request",
    "server.first_request": "first_request",
    "tokenizer.load": "tokenizer",
}
# where a breakdown and a critical path end: the run's `ready` (default) or its first token
UNTIL = ("ready", "first_token")

# phases whose time is not "work" inside a lane
STRUCTURAL_PHASES = ("process", "startup")  # a tuple: `select` takes it as it is

GAP_MIN_NS = 1_000_000  # gaps shorter than 1 ms are not listed
MAX_GAPS = 20
TOP_HOTSPOTS = 200


MODEL_SCHEMA: dict[str, pl.DataType] = {
    "idx": pl.Int64(),
    "lane": pl.Int32(),  # the lane's index in `RunModel.lanes`
    "span_id": pl.String(),
    "parent": pl.Int64(),  # the parent's idx in the same lane, else null
    "up": pl.Int64(),  # the parent's idx in any lane, else null
    "depth": pl.Int32(),  # ancestors in the same lane
    "name": pl.String(),
    "phase": pl.String(),  # the `starttrace.phase` attribute, else by name (analysis.phases.phase_by_name)
    "module": pl.String(),  # imports: `starttrace.import.module`, else the name after `import `
    "self_us": pl.Float64(),
    "start": pl.Int64(),
    "end": pl.Int64(),  # null while in progress
    "eff_end": pl.Int64(),  # the end, or now / the run's last moment while in progress (>= start)
    "duration": pl.Int64(),  # eff_end - start
    "in_progress": pl.Boolean(),
    "instant": pl.Boolean(),
    "error": pl.String(),
    "thread": pl.Int64(),
    "launched_by": pl.String(),
    "src": pl.Int64(),  # its row in `RunModel.side` (its attributes)
}


# the columns the passes filter, sort and group by: narrow, so that those operations never move
# the wide ones (attributes, ids) of every span
CORE_COLUMNS = (
    "idx", "lane", "parent", "up", "depth", "name", "phase", "module", "self_us", "start", "end", "eff_end",
    "duration", "in_progress", "instant", "error",
)  # fmt: skip


class SpanNode:
    """One span of the model, made from its row on demand (`RunModel.node`): for the passes that
    walk a few spans. Its parent, children and attributes are looked up when asked."""

    __slots__ = (
        "_attrs",
        "_model",
        "depth",
        "duration",
        "eff_end",
        "end",
        "error",
        "id",
        "idx",
        "in_progress",
        "instant",
        "lane",
        "module",
        "name",
        "parent",
        "phase",
        "pos",
        "self_us",
        "start",
        "thread",
        "up",
    )

    def __init__(self, model: RunModel, row: dict[str, Any]) -> None:
        self._model = model
        self._attrs: dict[str, Any] | None = None
        self.idx = row["idx"]
        self.lane = row["lane"]
        self.id = row["span_id"]
        self.parent = row["parent"]
        self.up = row["up"]
        self.depth = row["depth"]
        self.name = row["name"]
        self.phase = row["phase"]
        self.module = row["module"]
        self.self_us = row["self_us"]
        self.start = row["start"]
        self.end = row["end"]
        self.eff_end = row["eff_end"]
        self.duration = row["duration"]
        self.in_progress = row["in_progress"]
        self.instant = row["instant"]
        self.error = row["error"]
        self.thread = row["thread"]
        self.pos = self.idx - model.lanes[self.lane].offset if 0 <= self.lane < len(model.lanes) else 0

    @property
    def attrs(self) -> dict[str, Any]:
        if self._attrs is None:
            self._attrs = self._model.attrs_of(self.idx)
        return self._attrs

    @property
    def parent_node(self) -> SpanNode | None:
        """Its parent in any lane (a `process` span's parent is the span that launched it)."""
        return None if self.up is None else self._model.node(self.up)

    @property
    def children(self) -> list[SpanNode]:
        """Its children in its own lane, by start."""
        return self._model.nodes_at(self._model.child_rows(self.idx))

    def __repr__(self) -> str:
        return f"SpanNode({self.idx}, {self.name!r}, lane {self.lane})"


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
    offset: int = 0  # its spans are rows offset .. offset + count of `RunModel.spans`
    count: int = 0
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
    spans: pl.DataFrame  # MODEL_SCHEMA, one row per span (see the module)
    side: pl.DataFrame  # every span's `attrs` and `attrs_pb` (run.SPAN_SCHEMA), in the run's order: row `src`
    phases: list[str]
    hotspots: list[dict[str, Any]]
    preload_advice: list[dict[str, Any]]
    cuda_audit: dict[str, Any]
    critical_path: list[PathStep]
    version: int = 0
    updated_at: float | None = None
    source: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)  # analysis.findings (docs/findings.md)
    # the first response byte of the first served request (`first_token`, probes/first_request.py)
    first_token_ns: int | None = None
    until: str = "ready"  # UNTIL: where the lanes' windows, breakdowns and the critical path end
    _nodes: dict[int, SpanNode] = field(default_factory=dict, repr=False)
    _children: tuple[Any, Any] | None = field(default=None, repr=False)
    _arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _marks: pl.DataFrame | None = field(default=None, repr=False)
    _core: pl.DataFrame | None = field(default=None, repr=False)

    @property
    def live(self) -> bool:
        return self.status == "running"

    @property
    def startup_s(self) -> float:
        end = self.ready_ns if self.ready_ns is not None else self.t_end
        return max(0, end - self.t0) / 1e9

    @property
    def end_ns(self) -> int | None:
        """Where the breakdown and the critical path end: ready, or the first token (`until`)."""
        return self.first_token_ns if self.until == "first_token" else self.ready_ns

    @property
    def time_to_first_token_s(self) -> float | None:
        return None if self.first_token_ns is None else round(max(0, self.first_token_ns - self.t0) / 1e9, 6)

    def seconds(self, t: int | None) -> float | None:
        return None if t is None else round((t - self.t0) / 1e9, 6)

    @property
    def core(self) -> pl.DataFrame:
        """The span table's CORE_COLUMNS (no copy): what a pass over every span filters."""
        if self._core is None:
            self._core = self.spans.select(CORE_COLUMNS)
        return self._core

    def lane_rows(self, lane: Lane | int) -> pl.DataFrame:
        """The lane's rows of the span table's CORE_COLUMNS (a slice: no copy)."""
        ln = self.lanes[lane] if isinstance(lane, int) else lane
        return self.core.slice(ln.offset, ln.count)

    def node(self, idx: int) -> SpanNode:
        got = self._nodes.get(idx)
        if got is None:
            got = self._nodes[idx] = SpanNode(self, self.spans.row(idx, named=True))
        return got

    def nodes(self, rows: pl.DataFrame) -> list[SpanNode]:
        """The rows' spans as nodes, in their order (rows of this model's table, or of its core)."""
        if "span_id" not in rows.columns:
            return self.nodes_at(rows["idx"].to_numpy())
        out = []
        for row in rows.iter_rows(named=True):
            got = self._nodes.get(row["idx"])
            if got is None:
                got = self._nodes[row["idx"]] = SpanNode(self, row)
            out.append(got)
        return out

    def nodes_at(self, idxs: Any) -> list[SpanNode]:
        idxs = [int(i) for i in idxs]
        missing = [i for i in idxs if i not in self._nodes]
        if len(missing) > 8:
            self.nodes(self.spans[missing])
        return [self.node(i) for i in idxs]

    def matching(
        self, phases: tuple[str, ...] = (), names: tuple[str, ...] = (), lane: Lane | int | None = None
    ) -> pl.DataFrame:
        """The CORE_COLUMNS rows whose phase is in `phases` or whose name is in `names`, of one lane
        or all, in table order. Unless imports are asked for, among `marks` only."""
        imports = "import" in phases or any(name.startswith("import ") for name in names)
        if imports:
            rows = self.core if lane is None else self.lane_rows(lane)
        else:
            index = lane if isinstance(lane, int) else None if lane is None else lane.index
            rows = self.marks if index is None else self.marks.filter(pl.col("lane") == index)
        return rows.filter(pl.col("phase").is_in(list(phases)) | pl.col("name").is_in(list(names)))

    @property
    def marks(self) -> pl.DataFrame:
        """The CORE_COLUMNS rows of every span but the imports named `import ...` (a few hundred per
        process; made once): where a pass looking for spans of another kind searches."""
        if self._marks is None:
            plain = (pl.col("phase") == "import") & pl.col("name").str.starts_with("import ")
            self._marks = self.core.filter(~plain.fill_null(False))
        return self._marks

    def select(
        self, phases: tuple[str, ...] = (), names: tuple[str, ...] = (), lane: Lane | int | None = None
    ) -> list[SpanNode]:
        """The spans (as nodes) `matching` those phases or names: for the few spans of a kind a pass walks."""
        return self.nodes_at(self.matching(phases, names, lane)["idx"].to_numpy())

    def child_rows(self, idx: int) -> Any:
        """The rows of the span's children in its lane, by start (an index built once per model)."""
        if self._children is None:
            parent = self.array("parent")
            rows = np.flatnonzero(parent >= 0)
            rows = rows[np.argsort(parent[rows], kind="stable")]
            offsets = np.concatenate(([0], np.cumsum(np.bincount(parent[rows], minlength=len(parent)))))
            self._children = (rows, offsets)
        rows, offsets = self._children
        return rows[offsets[idx] : offsets[idx + 1]]

    def array(self, name: str) -> np.ndarray:
        """A column of the span table as a numpy array, made once per model (read only): `parent`
        (-1: none), `same_phase` (its phase is its parent's), `is_import`, `structural` (a phase of
        STRUCTURAL_PHASES), or a column without nulls."""
        got = self._arrays.get(name)
        if got is None:
            if name == "parent":
                column = self.spans["parent"].fill_null(-1)
            elif name == "same_phase":
                parent = pl.col("parent")
                same = parent.is_not_null() & (pl.col("phase") == pl.col("phase").gather(parent.fill_null(0)))
                column = self.spans.select(same).to_series()
            elif name == "is_import":
                column = self.spans["phase"] == "import"
            elif name == "structural":
                column = self.spans["phase"].is_in(STRUCTURAL_PHASES)
            else:
                column = self.spans[name]
            got = self._arrays[name] = column.to_numpy()
            got.flags.writeable = False  # shared by every pass
        return got

    def attrs_of(self, idx: int) -> dict[str, Any]:
        text, raw = self.side.row(int(self.spans["src"][idx]))
        return decode_attrs(text, raw)

    def attrs_columns(self, idx: pl.Series) -> pl.DataFrame:
        """The `attrs` and `attrs_pb` cells of the rows `idx` (as stored: nothing decoded)."""
        return self.side[self.spans["src"].gather(idx).to_numpy()]


def rank_slot(lane: Lane) -> tuple[Any, ...]:
    return (lane.role, lane.rank) if lane.rank is not None else ("lane", lane.id)
