"""compile probe: torch.compile as spans, per compiled graph, from PyTorch's own compile events
(docs/probes.md).

PyTorch's `dynamo_timed` reports each compile step's start and end to `ChromiumEventLogger.log_event_start`
/ `log_event_end`; this probe wraps those two methods right after `torch._dynamo.utils` is imported.
The first event on a thread with no graph open becomes the span `compile.graph` (phase `compile`),
every event inside it a child span `compile.<event>`; the graph's cache verdict (`verdict`) comes
from what ran in it and from counter differences over it. No log is parsed. Standard library only.
"""

import os
import sys
from _thread import get_ident
from time import monotonic_ns

from starttrace.tracer import recorder
from starttrace.tracer.probes._wrap import _mark, note_attached, note_missing, publish_probe_list

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Attrs = dict[str, Any]

active = False  # the chromium event hooks are attached (vllm.py then skips its "Dynamo bytecode transform")

# (counter group, counter name, attribute suffix)
_TORCH_COUNTERS = (
    ("inductor", "fxgraph_cache_hit", "fxgraph_cache_hit"),
    ("inductor", "fxgraph_cache_miss", "fxgraph_cache_miss"),
    ("inductor", "fxgraph_cache_bypass", "fxgraph_cache_bypass"),
    ("aot_autograd", "autograd_cache_hit", "aotautograd_cache_hit"),
    ("aot_autograd", "autograd_cache_miss", "aotautograd_cache_miss"),
)
_VLLM_COUNTERS = (
    ("num_compiled_artifacts_loaded", "vllm_artifacts_loaded"),
    ("num_compiled_artifacts_saved", "vllm_artifacts_saved"),
)
_STEP_ATTRS: "Attrs" = {"starttrace.phase": "compile"}
MAX_EVENT_DEPTH = 64  # a graph's open events deeper than this are not recorded (never seen: ~12)


# Events that code generation (Inductor compiled the graph itself) or a cache load ran in a graph
CODEGEN_EVENTS = frozenset(("fx_codegen_and_compile",))
LOAD_EVENTS = frozenset(("AOTAutogradCache.inductor_load",))
# Events that never start a graph without a compile id: a compile worker thread's file compile
# while the graph is open on another thread, the kernel cache's own steps
HELPER_EVENTS = frozenset(("compile_file", "async_compile.wait", "PyCodeCache.load_by_key_path"))


class _Graph:
    """One compile.graph span being recorded on a thread, and its open child events."""

    __slots__ = ("attrs", "codegen", "compile_id", "counts", "events", "loaded", "span_id")

    def __init__(self, span_id: str, compile_id: "str | None", counts: "dict[str, int]") -> None:
        self.span_id = span_id
        self.compile_id = compile_id
        self.counts = counts
        self.events: list[tuple[str, str]] = []  # (event name, span id), innermost last
        self.attrs: Attrs = {}  # added by others while it is open (vLLM's cache dir)
        self.codegen = 0  # graphs whose code Inductor generated (fx_codegen_and_compile ran)
        self.loaded = 0  # compiled graphs loaded from a cache (AOTAutogradCache.inductor_load)


class _Stats:
    graphs = 0  # compile.graph spans begun in this process (probes/vllm.py asks)


stats = _Stats()


_graphs: "dict[int, _Graph]" = {}  # per thread


def install() -> None:
    """Register the post-import hook (probes/__init__.py LAZY_PROBES)."""
    recorder.when_imported("torch._dynamo.utils", _patch_utils)
    os.register_at_fork(after_in_child=_graphs.clear)


def _patch_utils(utils: "Any") -> None:
    global active
    logger = getattr(utils, "ChromiumEventLogger", None)
    start = getattr(logger, "log_event_start", None)
    end = getattr(logger, "log_event_end", None)
    if logger is None or not callable(start) or not callable(end):
        note_missing("torch._dynamo.utils.ChromiumEventLogger.log_event_start")
        publish_probe_list()
        return
    if getattr(start, "__starttrace__", False):
        return
    logger.log_event_start = _start_wrapper(utils, start)
    logger.log_event_end = _end_wrapper(utils, end)
    active = True
    note_attached("torch._dynamo.utils.ChromiumEventLogger.log_event_start")
    note_attached("torch._dynamo.utils.ChromiumEventLogger.log_event_end")
    publish_probe_list()


def _start_wrapper(utils: "Any", original: "Callable[..., Any]") -> "Callable[..., Any]":
    def log_event_start(
        self: "Any", event_name: str, time_ns: int, metadata: "Any", *args: "Any", **kwargs: "Any"
    ) -> "Any":
        now = monotonic_ns()
        result = original(self, event_name, time_ns, metadata, *args, **kwargs)
        if recorder._writer is not None:
            try:
                _on_start(utils, event_name, metadata, now)
            except Exception as exc:
                recorder.report(f"compile probe failed: {type(exc).__name__}: {exc}", key="compile:start")
        return result

    return _mark(log_event_start, original)


def _end_wrapper(utils: "Any", original: "Callable[..., Any]") -> "Callable[..., Any]":
    def log_event_end(self: "Any", event_name: str, *args: "Any", **kwargs: "Any") -> "Any":
        try:
            return original(self, event_name, *args, **kwargs)
        finally:
            if recorder._writer is not None and _graphs:
                try:
                    _on_end(utils, event_name)
                except Exception as exc:
                    recorder.report(f"compile probe failed: {type(exc).__name__}: {exc}", key="compile:end")

    return _mark(log_event_end, original)


def _on_start(utils: "Any", event_name: str, metadata: "Any", now: int) -> None:
    ident = get_ident()
    graph = _graphs.get(ident)
    compile_id = metadata.get("compile_id") if isinstance(metadata, dict) else None
    if not isinstance(compile_id, str) or compile_id == "None":
        compile_id = None
    if graph is None:
        # A graph starts with the first event on a thread with none open. Without a compile id
        # (torch's AOT compile: `fullgraph_capture`, then Inductor outside the compile context; a
        # warm AOT load: `AOTAutogradCache.inductor_load`) only when no graph is open anywhere
        # and it is not a helper's step (a compile worker thread's compile_file).
        if compile_id is None and (_graphs or event_name in HELPER_EVENTS):
            return
        attrs: Attrs = {"starttrace.phase": "compile", "starttrace.compile.event": event_name}
        if compile_id is not None:
            attrs["starttrace.compile.id"] = compile_id
        span_id = recorder.begin("compile.graph", attrs, t=now)
        graph = _graphs[ident] = _Graph(span_id, compile_id, _counts(utils))
        stats.graphs += 1
        _note_event(graph, event_name)
        return
    if graph.compile_id is None and compile_id is not None:
        graph.compile_id = compile_id
    _note_event(graph, event_name)
    if len(graph.events) >= MAX_EVENT_DEPTH:
        return
    span_id = recorder.begin("compile." + event_name, _STEP_ATTRS, t=now)
    graph.events.append((event_name, span_id))


def _note_event(graph: _Graph, event_name: str) -> None:
    if event_name in CODEGEN_EVENTS:
        graph.codegen += 1
    elif event_name in LOAD_EVENTS:
        graph.loaded += 1


def _on_end(utils: "Any", event_name: str) -> None:
    ident = get_ident()
    graph = _graphs.get(ident)
    if graph is None:
        return
    events = graph.events
    for index in range(len(events) - 1, -1, -1):
        if events[index][0] == event_name:
            # torch ends overlapping events by popping to the one that ends: so do we
            while len(events) > index:
                recorder.end(events.pop()[1])
            return
    if events:
        return  # not an event we opened (deeper than MAX_EVENT_DEPTH)
    # the graph's own event ended: the compile of this frame is done
    del _graphs[ident]
    recorder.end(graph.span_id, _graph_end_attrs(utils, graph))


def _counts(utils: "Any") -> "dict[str, int]":
    counts: dict[str, int] = {}
    counters = getattr(utils, "counters", None)
    if counters is not None:
        for group, name, key in _TORCH_COUNTERS:
            counts[key] = int(counters[group][name]) if group in counters else 0
    counter = getattr(sys.modules.get("vllm.compilation.counter"), "compilation_counter", None)
    if counter is not None:
        for name, key in _VLLM_COUNTERS:
            value = getattr(counter, name, 0)
            counts[key] = value if isinstance(value, int) else 0
    return counts


def verdict(delta: "dict[str, int]", codegen: int = 0, loaded: int = 0) -> str:
    """`miss` when Inductor generated code (`codegen`: the AOT path never asks the FX graph cache),
    the FX graph cache missed or vLLM saved an artifact; else `hit` when a graph came from a cache
    (`loaded`, a cache hit, a vLLM artifact loaded); else `none`. An AOTAutograd miss alone is not a
    miss: it can stay 1 on a warm start whose graphs all come from the FX graph cache (vLLM #20451)."""
    if codegen or delta.get("fxgraph_cache_miss", 0) > 0 or delta.get("vllm_artifacts_saved", 0) > 0:
        return "miss"
    if (
        loaded
        or delta.get("fxgraph_cache_hit", 0) > 0
        or delta.get("aotautograd_cache_hit", 0) > 0
        or delta.get("vllm_artifacts_loaded", 0) > 0
    ):
        return "hit"
    return "none"


def inductor_cache_dir() -> "str | None":
    """TORCHINDUCTOR_CACHE_DIR, else Inductor's default (computed as torch does, without its side
    effects: torch's cache_dir() creates the folder and sets the variable)."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        return os.path.abspath(configured)
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    default = getattr(utils, "default_cache_dir", None)
    if default is None:
        return None
    try:
        return os.path.abspath(default())
    except Exception:
        return None


def note_cache_dir(path: str) -> None:
    """The compile cache a backend used for the graph now compiling on this thread (vLLM's
    torch_compile_cache/<hash>/rank_<i>_<j>/<prefix>, from probes/vllm.py)."""
    graph = _graphs.get(get_ident())
    if graph is not None:
        graph.attrs["starttrace.compile.cache_dir"] = path


def _graph_end_attrs(utils: "Any", graph: _Graph) -> "Attrs":
    after = _counts(utils)
    delta = {key: after.get(key, 0) - value for key, value in graph.counts.items()}
    attrs: Attrs = {"starttrace.compile.cache": verdict(delta, graph.codegen, graph.loaded)}
    for key, value in delta.items():
        if value:
            attrs[f"starttrace.compile.{key}"] = value
    if graph.codegen:
        attrs["starttrace.compile.codegen"] = graph.codegen
    if graph.loaded:
        attrs["starttrace.compile.cache_loads"] = graph.loaded
    fx_graphs = sum(delta.get(k, 0) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass"))
    vllm_graphs = delta.get("vllm_artifacts_loaded", 0) + delta.get("vllm_artifacts_saved", 0)
    attrs["starttrace.compile.graphs"] = max(fx_graphs, vllm_graphs, graph.codegen + graph.loaded)
    if graph.compile_id is not None:
        attrs["starttrace.compile.id"] = graph.compile_id
    inductor_dir = inductor_cache_dir()
    if inductor_dir:
        attrs["starttrace.compile.cache_dir"] = inductor_dir
        attrs["starttrace.compile.inductor_cache_dir"] = inductor_dir
    frame = _frame(utils, graph.compile_id) if graph.compile_id is not None else None
    if frame:
        attrs["starttrace.compile.frame"] = frame
    attrs.update(graph.attrs)
    return attrs


def _frame(utils: "Any", compile_id: str) -> "str | None":
    """`function (file:line)` of the compiled frame, from torch's CompilationMetrics record (added
    before the `dynamo` event ends)."""
    metrics = getattr(utils, "_compilation_metrics", None)
    if not metrics:
        return None
    last = metrics[-1]
    if str(getattr(last, "compile_id", None)) != compile_id:
        return None
    name = getattr(last, "co_name", None)
    filename = getattr(last, "co_filename", None)
    line = getattr(last, "co_firstlineno", None)
    if not name:
        return None
    return f"{name} ({filename}:{line})" if filename else str(name)
