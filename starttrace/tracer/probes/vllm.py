"""vLLM probe: process roles and ranks, and vLLM's startup phases as spans (docs/probes.md).

Everything is wrapped by name after vLLM imported the module that defines it; what the installed
vLLM lacks is skipped and listed in `starttrace.probes_missing`. Standard library only.

Roles (process attribute `starttrace.role`):
- `api_server`: the process runs vLLM's API server entry (command line), or calls
  `launcher.setup_server` / `serve_http` / `build_async_engine_client`.
- `engine_core`: `EngineCoreProc.run_engine_core` (the EngineCore process target).
- `worker`: `WorkerProc.worker_main` (target) and `WorkerProc.__init__` (rank, local_rank and
  world size from their arguments: no RANK env var reaches a vLLM worker).
- `helper`: vLLM's model-inspection subprocess, the custom all-reduce P2P check, the
  multiprocessing resource tracker (recognised from the command line at activation).
"""

import os
import sys
from _thread import get_ident

from starttrace.tracer import lifecycle, recorder
from starttrace.tracer.probes import first_request
from starttrace.tracer.probes._wrap import (
    _CO_COROUTINE,
    _mark,
    _open_names,
    note_attached,
    note_missing,
    patch,
    publish_probe_list,
    raw_attr,
    replace,
    set_role_and_attrs,
    traced,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Attrs = dict[str, Any]
    Before = Callable[[tuple[Any, ...], dict[str, Any]], Attrs | None]
    After = Callable[[tuple[Any, ...], dict[str, Any], Any], Attrs | None]

API_SERVER_MODULES = (
    "vllm.entrypoints.launchers.api_server.entry",
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.api_server",
)
HELPER_MARKERS = (
    "vllm.model_executor.models.registry",  # model inspection subprocess (registry.py)
    "all_reduce_utils",  # custom all-reduce P2P access check
    "multiprocessing.resource_tracker",
)


def install() -> None:
    """Register post-import hooks (at activation when argv names vLLM, else when the program first
    imports a module they patch: probes/__init__.py; reads argv, patches nothing yet)."""
    _role_from_command_line()
    for module, hook in _HOOKS:
        recorder.when_imported(module, hook)


def _role_from_command_line() -> None:
    argv = list(getattr(sys, "orig_argv", None) or sys.argv)
    joined = " ".join(argv[1:])
    if any(marker in joined for marker in HELPER_MARKERS):
        set_role_and_attrs({"starttrace.role": "helper"})
        return
    if any(module in argv for module in API_SERVER_MODULES) or _is_vllm_serve(argv):
        set_role_and_attrs({"starttrace.role": "api_server"})


def _is_vllm_serve(argv: list[str]) -> bool:
    for index, arg in enumerate(argv[:3]):
        is_cli = arg.endswith("/vllm") or arg in ("vllm", "vllm.entrypoints.cli.main")
        if is_cli and "serve" in argv[index + 1 : index + 2]:
            return True
    return False


# --------------------------------------------------------------------------------------------
# argument helpers


def _arg(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", index: int, name: str) -> "Any":
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else None


def _role(role: str) -> "Before":
    def before(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
        if recorder.process_attrs.get("starttrace.role") != role:
            set_role_and_attrs({"starttrace.role": role})
        return None

    return before


def _worker_identity(rank: "Any", local_rank: "Any", vllm_config: "Any") -> "Attrs":
    attrs: Attrs = {"starttrace.role": "worker"}
    if isinstance(rank, int):
        attrs["starttrace.rank"] = rank
    if isinstance(local_rank, int):
        attrs["starttrace.local_rank"] = local_rank
    try:
        attrs["starttrace.world_size"] = int(vllm_config.parallel_config.world_size)
    except Exception:
        pass
    return attrs


def _worker_main_before(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
    # WorkerProc.worker_main(*args, **kwargs): the executor passes everything as keywords.
    set_role_and_attrs(_worker_identity(kwargs.get("rank"), kwargs.get("local_rank"), kwargs.get("vllm_config")))
    return None


def _worker_init_before(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
    # WorkerProc.__init__(self, vllm_config, local_rank, rank, distributed_init_method, ...)
    vllm_config = _arg(args, kwargs, 1, "vllm_config")
    local_rank = _arg(args, kwargs, 2, "local_rank")
    rank = _arg(args, kwargs, 3, "rank")
    set_role_and_attrs(_worker_identity(rank, local_rank, vllm_config))
    attrs: Attrs = {}
    if isinstance(rank, int):
        attrs["starttrace.rank"] = rank
    method = _arg(args, kwargs, 4, "distributed_init_method")
    if isinstance(method, str):
        attrs["starttrace.dist.init_method"] = method
    return attrs


def _engine_core_before(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
    attrs: Attrs = {"starttrace.role": "engine_core"}
    dp_rank = kwargs.get("dp_rank", 0)
    if isinstance(dp_rank, int):
        attrs["starttrace.dp_rank"] = dp_rank
    set_role_and_attrs(attrs)
    return None


def _dist_env_before(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
    # init_distributed_environment(world_size, rank, distributed_init_method, local_rank, backend, timeout)
    attrs: Attrs = {}
    for index, name in enumerate(("world_size", "rank", "distributed_init_method", "local_rank", "backend")):
        value = _arg(args, kwargs, index, name)
        if isinstance(value, (int, str)) and not isinstance(value, bool):
            key = "init_method" if name == "distributed_init_method" else name
            attrs[f"starttrace.dist.{key}"] = value
    return attrs


def _model_parallel_before(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
    # initialize_model_parallel(tensor_model_parallel_size, pipeline_model_parallel_size, ...)
    attrs: Attrs = {}
    for index, name in enumerate(("tensor_model_parallel_size", "pipeline_model_parallel_size")):
        value = _arg(args, kwargs, index, name)
        if isinstance(value, int):
            attrs[f"vllm.{name}"] = value
    backend = kwargs.get("backend")
    if isinstance(backend, str):
        attrs["starttrace.dist.backend"] = backend
    return attrs


def _kv_bytes_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    if isinstance(result, int):
        return {"vllm.kv_cache.available_bytes": result}
    if isinstance(result, list) and result and all(isinstance(v, int) for v in result):
        return {"vllm.kv_cache.available_bytes": list(result)}
    return None


def _load_model_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    worker = args[0] if args else None
    attrs: Attrs = {}
    try:
        config = worker.model_config  # type: ignore[union-attr]
        attrs["vllm.model"] = str(config.model)
        attrs["vllm.dtype"] = str(config.dtype)
    except Exception:
        pass
    try:
        attrs["vllm.load_format"] = str(worker.load_config.load_format)  # type: ignore[union-attr]
    except Exception:
        pass
    return attrs or None


def _config_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    attrs: Attrs = {}
    try:
        attrs["vllm.model"] = str(result.model_config.model)
        parallel = result.parallel_config
        attrs["vllm.tensor_parallel_size"] = int(parallel.tensor_parallel_size)
        attrs["vllm.pipeline_parallel_size"] = int(parallel.pipeline_parallel_size)
        attrs["vllm.data_parallel_size"] = int(parallel.data_parallel_size)
        backend = parallel.distributed_executor_backend
        if not isinstance(backend, str):
            backend = getattr(backend, "__name__", str(backend))
        attrs["vllm.executor_backend"] = backend
        attrs["vllm.enforce_eager"] = bool(result.model_config.enforce_eager)
        attrs["vllm.device"] = str(result.device_config.device_type)
    except Exception:
        pass
    attrs.update(_fingerprint_attrs(result))
    return attrs or None


def _fingerprint_attrs(config: "Any") -> "Attrs":
    """What the start's fingerprint needs beside the above (analysis/start_kind.py): configuration,
    software versions, the CPU. Each read on its own: a version without one attribute keeps the rest."""
    attrs: Attrs = {}
    reads = (
        ("vllm.dtype", lambda: str(config.model_config.dtype)),
        ("vllm.max_model_len", lambda: int(config.model_config.max_model_len)),
        ("vllm.compile_mode", lambda: _enum_name(config.compilation_config.mode)),
        (
            "vllm.cudagraph_sizes",
            lambda: ",".join(str(int(n)) for n in config.compilation_config.cudagraph_capture_sizes or ()),
        ),
        ("starttrace.vllm.version", lambda: str(sys.modules["vllm"].__version__)),
        ("starttrace.torch.version", lambda: str(sys.modules["torch"].__version__)),
        ("starttrace.python.version", lambda: "%d.%d.%d" % sys.version_info[:3]),
        ("starttrace.host.cpu_count", lambda: os.cpu_count()),
        ("starttrace.host.cpu_model", _cpu_model),
    )
    for key, read in reads:
        try:
            value = read()
        except Exception:
            continue
        if value not in (None, ""):
            attrs[key] = value
    return attrs


def _enum_name(value: "Any") -> str:
    """`VLLM_COMPILE` for vLLM's CompilationMode (an IntEnum: str() gives its number)."""
    return "" if value is None else str(getattr(value, "name", None) or value)


def _cpu_model() -> "str | None":
    """The first `model name` of /proc/cpuinfo (read line by line, up to it); else the platform's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "Model", "cpu model")):
                    return line.partition(":")[2].strip() or None
    except OSError:
        pass
    import platform

    return platform.processor() or None


def _startup_plan_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    # _load_plan(fingerprint) -> the persisted plan, or None (absent, unreadable, another schema)
    return {"vllm.startup_plan": "hit" if isinstance(result, dict) else "miss"}


# --------------------------------------------------------------------------------------------
# wrapping

# Table rows: (attribute path in the module, span name, phase, before, after). A row with no span
# name only runs its callbacks: targets that run for the process's whole life (a span would hide its gaps).
Row = tuple  # (str, str | None, str, Before | None, After | None)


def _identity_only(
    original: "Callable[..., Any]", before: "Before | None", after: "After | None" = None
) -> "Callable[..., Any]":
    """A wrapper that only runs the row's callbacks, no span: for process targets (a span there
    would cover the process) and for functions vLLM marks itself (its mark is the span)."""

    def _call(callback: "Any", what: str, key: str, *args: "Any") -> None:
        if callback is not None and recorder._writer is not None:
            try:
                callback(*args)
            except Exception as exc:
                recorder.report(f"vllm probe {what} failed: {type(exc).__name__}: {exc}", key=f"vllm:{key}")

    def wrapper(*args: "Any", **kwargs: "Any") -> "Any":
        _call(before, "identity", "identity", args, kwargs)
        result = original(*args, **kwargs)
        _call(after, "hook", "after", args, kwargs, result)
        return result

    code = getattr(original, "__code__", None)
    if code is not None and code.co_flags & _CO_COROUTINE:

        async def async_wrapper(*args: "Any", **kwargs: "Any") -> "Any":
            _call(before, "identity", "identity", args, kwargs)
            result = await original(*args, **kwargs)
            _call(after, "hook", "after", args, kwargs, result)
            return result

        marked = _mark(async_wrapper, original)
    else:
        marked = _mark(wrapper, original)
    marked.__starttrace_hooks__ = True
    return marked


def _wrap(
    module: "Any", path: str, name: str | None, phase: str, before: "Before | None", after: "After | None"
) -> None:
    """Wrap `module.<path>` (path = "func" or "Class.method")."""
    owner: Any = module
    *parents, attr = path.split(".")
    label = f"{module.__name__}.{path}"
    for part in parents:
        owner = getattr(owner, part, None)
        if owner is None:
            note_missing(label)
            return
    wrap_attr(owner, attr, label, name, phase, before, after)


def vllm_mark_of(function: "Any") -> "str | None":
    """The span name vLLM's own `instrument` gave `function` (None: vLLM does not mark it)."""
    raw = getattr(function, "__func__", function)
    mark = getattr(raw, "__starttrace_vllm_mark__", None)
    return mark if isinstance(mark, str) else None


def wrap_attr(
    owner: "Any",
    attr: str,
    label: str,
    name: str | None,
    phase: str,
    before: "Before | None",
    after: "After | None",
) -> bool:
    """Wrap `owner.attr` with span `name` (None: callbacks only). A function vLLM marks itself
    (`vllm.tracing.instrument`, replaced by this probe) already records vLLM's span: our own span
    is dropped there and only the row's callbacks run (each phase once)."""
    raw = raw_attr(owner, attr)
    if raw is None:
        note_missing(label)
        return False
    if vllm_mark_of(raw) is not None:
        function = getattr(raw, "__func__", raw)
        extra = getattr(function, "__starttrace_mark_extra__", None)
        if name is not None and isinstance(extra, dict) and "starttrace.vllm.replaces" not in extra:
            extra["starttrace.vllm.replaces"] = name  # vLLM's span stands for this row's span
        if (before is None and after is None) or getattr(function, "__starttrace_hooks__", False):
            return False  # vLLM's span is the span, or its callbacks run already
        try:
            replace(owner, attr, raw, lambda fn: _identity_only(fn, before, after))
        except Exception as exc:
            recorder.report(f"cannot wrap {attr}: {type(exc).__name__}: {exc}", key=f"patch:{attr}")
            return False
        note_attached(label)
        return True
    if name is None:
        attached = patch(owner, attr, lambda fn: _identity_only(fn, before, after))
    else:
        attrs = {"code.function": label}
        attached = patch(owner, attr, lambda fn: traced(fn, name, phase, attrs, before, after))
    if attached:
        note_attached(label)
    return attached


def _hook(table: "tuple[Row, ...]") -> "Callable[[Any], None]":
    def hook(module: "Any") -> None:
        for path, name, phase, before, after in table:
            try:
                _wrap(module, path, name, phase, before, after)
            except Exception as exc:
                recorder.report(f"vllm probe {path} failed: {type(exc).__name__}: {exc}", key=f"vllm:{path}")
        publish_probe_list()

    hook.__qualname__ = f"vllm_probe[{table[0][0]}]"
    return hook


def _init_worker_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    """After WorkerWrapperBase.init_worker: wrap the worker class vLLM resolved at run time."""
    worker = getattr(args[0], "worker", None) if args else None
    if worker is None:
        return None
    klass = type(worker)
    class_name = f"{klass.__module__}.{klass.__qualname__}"
    for method, name, phase, after in WORKER_METHODS:
        wrap_attr(klass, method, f"{class_name}.{method}", name, phase, None, after)
    for method, name in WORKER_FIRST_CALLS:
        _patch_first(klass, method, f"{class_name}.{method}", lambda fn, n=name: first_request.first_call(fn, n))
    runner = getattr(worker, "model_runner", None)
    if runner is not None:
        _patch_model_runner(runner)
    publish_probe_list()
    return {"vllm.worker_class": class_name}


def _init_device_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    """The model runner exists once init_device returned: wrap its class."""
    worker = args[0] if args else None
    runner = getattr(worker, "model_runner", None)
    if runner is not None:
        _patch_model_runner(runner)
        publish_probe_list()
    device = getattr(worker, "device", None)
    return {"vllm.device": str(device)} if device is not None else None


def _patch_model_runner(runner: "Any") -> None:
    klass = type(runner)
    for method, name, phase, before, after in MODEL_RUNNER_METHODS:
        if not hasattr(klass, method):
            continue  # capture_model exists on GPU runners only, warming_up_model on CPU
        label = f"{klass.__module__}.{klass.__qualname__}.{method}"
        wrap_attr(klass, method, label, name, phase, before, after)


# --------------------------------------------------------------------------------------------
# vLLM's own instrumentation points (`vllm.tracing.instrument` / `instrument_manual`)
# replaced right after `vllm.tracing` is imported, before its importers bind it: every function vLLM
# marks becomes a journal span named as vLLM names it; our table rows for it drop their own span.

# vLLM's span name -> starttrace.phase (checked against every point in vLLM 0.32)
VLLM_MARK_PHASES: "dict[str, str]" = {
    "API server setup": "api_server",
    "Overall Loading": "engine_init",
    "SyncMPClient init": "engine_init",
    "AsyncMPClient init": "engine_init",
    "EngineCoreProc init": "engine_init",
    "Prepare model": "kv_cache",  # EngineCore._initialize_kv_caches: profile, KV allocation, warmup (RPCs)
    "Executor init": "executor_init",
    "Worker init": "worker_init",
    "Init device": "device_init",
    "Load model": "model_load",
    "Loading (GPU)": "model_load",
    "Loading (CPU)": "model_load",
    "Initialize model": "model_load",
    "Load weights": "model_load",
    "Download weights - HF": "model_load",
    "Allocate KV cache": "kv_cache",
    "Warmup (GPU)": "warmup",
    "Warmup (CPU)": "warmup",
    "DeepGemm warmup": "warmup",
    "CuTeDSL warmup": "warmup",
    "MiniMax M3 MSA warmup": "warmup",
    "Capture model": "cuda_graphs",
    "Compile graph": "compile",
    "Inductor compilation": "compile",
    "Dynamo bytecode transform": "compile",
}
# A point a later vLLM adds: its phase from words of its name (first match), else "vllm".
_MARK_WORDS: "tuple[tuple[str, str], ...]" = (
    ("kv cache", "kv_cache"),
    ("warmup", "warmup"),
    ("warm up", "warmup"),
    ("capture", "cuda_graphs"),
    ("cuda graph", "cuda_graphs"),
    ("compil", "compile"),
    ("inductor", "compile"),
    ("dynamo", "compile"),
    ("weight", "model_load"),
    ("load", "model_load"),
    ("model init", "model_load"),
    ("initialize model", "model_load"),
    ("device", "device_init"),
    ("nccl", "dist_init"),
    ("distributed", "dist_init"),
    ("executor", "executor_init"),
    ("worker", "worker_init"),
    ("engine", "engine_init"),
    ("client", "engine_init"),
    ("api", "api_server"),
    ("server", "api_server"),
)
# instrument_manual points recorded (others, such as the per-request "llm_request", are not startup)
MANUAL_POINTS = ("Dynamo bytecode transform",)


def mark_phase(span_name: str) -> str:
    """starttrace.phase of a vLLM instrumentation point."""
    phase = VLLM_MARK_PHASES.get(span_name)
    if phase is not None:
        return phase
    lowered = span_name.lower()
    for word, word_phase in _MARK_WORDS:
        if word in lowered:
            return word_phase
    return "vllm"


class _Marks:
    warmup_keys: "set[str]" = set()  # re-entry keys of the marks whose phase is warmup
    capture_count = 0  # cuda_graphs.capture spans since the last "Capture model" began


_marks = _Marks()


def _otel_recording() -> bool:
    """True when vLLM's own OpenTelemetry export is on in this process (a tracer provider is set:
    vLLM's init_tracer / maybe_init_worker_tracer ran), so vLLM sends its copy of the span too."""
    trace = sys.modules.get("opentelemetry.trace")
    return trace is not None and getattr(trace, "_TRACER_PROVIDER", None) is not None


def _mark_before(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
    return {"starttrace.vllm.otlp": True} if _otel_recording() else None


def _capture_model_begin(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
    _marks.capture_count = 0
    return _mark_before(args, kwargs)


def _capture_model_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    # GPUModelRunner.capture_model returns the bytes the graphs took (free memory before - after)
    attrs: Attrs = {"starttrace.cuda_graphs.count": _marks.capture_count}
    if isinstance(result, int) and not isinstance(result, bool):
        attrs["starttrace.cuda_graphs.memory_bytes"] = result
    return attrs


_MARK_CALLBACKS: "dict[str, tuple[Before, After | None]]" = {
    "Capture model": (_capture_model_begin, _capture_model_after),
}


def mark_function(function: "Any", decorated: "Any", span_name: str) -> "Any":
    """`decorated` (what vLLM's instrument made of `function`) wrapped in a journal span named as
    vLLM names it, phase from VLLM_MARK_PHASES, `starttrace.source` = vllm."""
    qualname = getattr(function, "__qualname__", None) or getattr(function, "__name__", "?")
    name = span_name or qualname
    phase = mark_phase(name)
    label = f"{getattr(function, '__module__', '?')}.{qualname}"
    callback, after = _MARK_CALLBACKS.get(name, (_mark_before, None))
    # attributes learnt after decoration (`starttrace.vllm.replaces`: our table row it stands for)
    extra: Attrs = {}

    def before(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
        found = callback(args, kwargs)
        if extra:
            return {**extra, **found} if found else extra
        return found

    attrs: Attrs = {"starttrace.source": "vllm", "code.function": label}
    wrapper = traced(decorated, name, phase, attrs, before, after, key=label)
    wrapper.__starttrace_vllm_mark__ = name
    wrapper.__starttrace_mark_extra__ = extra
    if phase == "warmup":
        _marks.warmup_keys.add(label)
    note_attached(label)
    return wrapper


def _instrument_wrapper(original: "Callable[..., Any]") -> "Callable[..., Any]":
    def instrument(
        obj: "Any" = None,
        *,
        span_name: str = "",
        attributes: "dict[str, str] | None" = None,
        record_exception: bool = True,
    ) -> "Any":
        if obj is None:  # @instrument(span_name=...): vLLM's own returns a partial of itself

            def decorate(function: "Any") -> "Any":
                return instrument(
                    function, span_name=span_name, attributes=attributes, record_exception=record_exception
                )

            return decorate
        decorated = original(obj, span_name=span_name, attributes=attributes, record_exception=record_exception)
        try:
            return mark_function(obj, decorated, span_name)
        except Exception as exc:
            recorder.report(f"vllm instrument probe failed: {type(exc).__name__}: {exc}", key="vllm:instrument")
            return decorated

    return _mark(instrument, original)


def _epoch_to_mono(epoch_ns: int) -> int:
    state = lifecycle.state
    if not state.anchor_epoch:
        from time import monotonic_ns, time_ns

        return epoch_ns - time_ns() + monotonic_ns()
    return epoch_ns - state.anchor_epoch + state.anchor_mono


def _instrument_manual_wrapper(original: "Callable[..., Any]") -> "Callable[..., Any]":
    def instrument_manual(
        span_name: str,
        start_time: int,
        end_time: "int | None" = None,
        attributes: "dict[str, Any] | None" = None,
        context: "Any" = None,
        kind: "Any" = None,
    ) -> "Any":
        if recorder._writer is not None and span_name in MANUAL_POINTS:
            _record_manual(span_name, start_time, end_time, attributes)
        return original(span_name, start_time, end_time, attributes, context, kind)

    return _mark(instrument_manual, original)


def _record_manual(span_name: str, start_time: "Any", end_time: "Any", attributes: "Any") -> None:
    """A span vLLM records after the fact (epoch times). "Dynamo bytecode transform" covers the
    same time as the compile probe's `compile.*` spans of torch's own events: recorded only when
    that probe is not attached (each phase once)."""
    try:
        if span_name == "Dynamo bytecode transform" and getattr(
            lifecycle.loaded_probes.get("compile"), "active", False
        ):
            return
        from time import monotonic_ns

        now = monotonic_ns()
        start = _epoch_to_mono(int(start_time))
        end = now if end_time is None else _epoch_to_mono(int(end_time))
        attrs: Attrs = {"starttrace.phase": mark_phase(span_name), "starttrace.source": "vllm"}
        if isinstance(attributes, dict):
            for key, value in attributes.items():
                if isinstance(key, str) and isinstance(value, (str, int, float, bool)):
                    attrs[f"vllm.{key}" if not key.startswith("vllm.") else key] = value
        if _otel_recording():
            attrs["starttrace.vllm.otlp"] = True
        span_id = recorder.begin(span_name, attrs, t=min(start, end), push=False)
        recorder.end(span_id, None, None, t=end)
    except Exception as exc:
        recorder.report(f"vllm instrument_manual probe failed: {type(exc).__name__}: {exc}", key="vllm:manual")


def _patch_tracing(tracing: "Any") -> None:
    for attr, make_wrapper in (("instrument", _instrument_wrapper), ("instrument_manual", _instrument_manual_wrapper)):
        original = getattr(tracing, attr, None)
        if callable(original) and not getattr(original, "__starttrace__", False):
            setattr(tracing, attr, make_wrapper(original))
            note_attached(f"vllm.tracing.{attr}")
        elif original is None:
            note_missing(f"vllm.tracing.{attr}")
    publish_probe_list()


def _vllm_backend_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    """VllmBackend.__call__ set compilation_config.local_cache_dir (VLLM_CACHE_ROOT/torch_compile_cache/
    <hash>/rank_<i>_<j>/<prefix>): the compile cache of this graph (compile probe's compile.graph)."""
    backend = args[0] if args else None
    config = getattr(backend, "compilation_config", None)
    path = getattr(config, "local_cache_dir", None)
    if not isinstance(path, str) or not path:
        return None
    compile_probe = lifecycle.loaded_probes.get("compile")
    note = getattr(compile_probe, "note_cache_dir", None)
    if note is not None:
        note(path)
    return {"starttrace.compile.cache_dir": path}


def _aot_load_wrapper(original: "Callable[..., Any]") -> "Callable[..., Any]":
    """`_try_load_aot_compiled_fn(model, aot_compilation_path)`: a warm AOT start loads the compiled
    model without Dynamo, so torch reports no compile event for it. Recorded when it returns:
    `compile.graph` (cache `hit`) when the compile probe saw no graph during it, else
    `compile.aot_load` (`miss` when an existing file failed to load); no file records nothing."""
    import os
    from time import monotonic_ns

    def _try_load_aot_compiled_fn(*args: "Any", **kwargs: "Any") -> "Any":
        if recorder._writer is None:
            return original(*args, **kwargs)
        start = monotonic_ns()
        compile_probe = lifecycle.loaded_probes.get("compile")
        graphs_before = getattr(getattr(compile_probe, "stats", None), "graphs", 0)
        result = original(*args, **kwargs)
        try:
            path = _arg(args, kwargs, 1, "aot_compilation_path")
            if isinstance(path, str) and (result is not None or os.path.exists(path)):
                hit = result is not None
                attrs: Attrs = {
                    "starttrace.phase": "compile",
                    "starttrace.compile.id": "aot",
                    "starttrace.compile.event": "vllm.aot_load",
                    "starttrace.compile.cache": "hit" if hit else "miss",
                    "starttrace.compile.cache_dir": os.path.dirname(path),
                    "starttrace.compile.graphs": 1 if hit else 0,
                    "code.function": "vllm.compilation.decorators._try_load_aot_compiled_fn",
                }
                graphs_now = getattr(getattr(compile_probe, "stats", None), "graphs", 0)
                name = "compile.graph" if hit and graphs_now == graphs_before else "compile.aot_load"
                span_id = recorder.begin(name, attrs, t=start, push=False)
                recorder.end(span_id, None, None if hit else "the AOT artifact did not load")
        except Exception as exc:
            recorder.report(f"vllm aot load probe failed: {type(exc).__name__}: {exc}", key="vllm:aot")
        return result

    return _mark(_try_load_aot_compiled_fn, original)


def _patch_decorators(module: "Any") -> None:
    label = f"{module.__name__}._try_load_aot_compiled_fn"
    if patch(module, "_try_load_aot_compiled_fn", _aot_load_wrapper):
        note_attached(label)
    elif not hasattr(module, "_try_load_aot_compiled_fn"):
        note_missing(label)
    publish_probe_list()


# --------------------------------------------------------------------------------------------
# memory profile run, CUDA-graph capture per size


def _in_warmup() -> bool:
    running = _open_names.get(get_ident())
    return bool(running) and any(key in running for key in _marks.warmup_keys)


def _cuda_int(read: "Callable[[Any], Any]") -> "int | None":
    """`int(read(torch.cuda))` when this process initialised CUDA, else None (never imports torch,
    never initialises CUDA)."""
    cuda = sys.modules.get("torch.cuda")
    try:
        return int(read(cuda)) if cuda is not None and cuda.is_initialized() else None
    except Exception:
        return None


def _profile_run_before(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
    # inside the CPU runner's warming_up_model ("Warmup (CPU)") profile_run is a warmup, not the memory profile
    return {"starttrace.phase": "warmup", "vllm.profile_run.purpose": "warmup"} if _in_warmup() else None


def _profile_run_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    # the peak since the last reset: vLLM's memory_profiling context resets the peak statistics
    # before the profile run (never reset here: vLLM reads them to size the KV cache)
    peak = _cuda_int(lambda cuda: cuda.max_memory_allocated())
    return None if peak is None else {"vllm.kv_cache.profile_peak_bytes": peak}


def _free_device_bytes() -> "int | None":
    return _cuda_int(lambda cuda: cuda.mem_get_info()[0])


_free_before: "dict[int, int | None]" = {}  # per thread: free device memory when the capture began


def _capture_before(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
    # GPUModelRunner._warmup_and_capture(self, desc: BatchDescriptor, cudagraph_runtime_mode, ...):
    # the warmup runs of one batch size and its graph capture (torch.cuda.graph in CUDAGraphWrapper)
    _marks.capture_count += 1
    desc = _arg(args, kwargs, 1, "desc")
    mode = _arg(args, kwargs, 2, "cudagraph_runtime_mode")
    attrs: Attrs = {}
    size = getattr(desc, "num_tokens", None)
    if isinstance(size, int):
        attrs["starttrace.cuda_graphs.batch_size"] = size
    uniform = getattr(desc, "uniform", None)
    if isinstance(uniform, bool):
        attrs["starttrace.cuda_graphs.uniform_decode"] = uniform
    mode_name = getattr(mode, "name", None)
    if isinstance(mode_name, str):
        attrs["starttrace.cuda_graphs.mode"] = mode_name
    _free_before[get_ident()] = _free_device_bytes()
    return attrs


def _capture_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    before = _free_before.pop(get_ident(), None)
    after = None if before is None else _free_device_bytes()
    return None if before is None or after is None else {"starttrace.cuda_graphs.memory_bytes": before - after}


# --------------------------------------------------------------------------------------------
# communicators: NCCL, custom all-reduce and its P2P check (phase dist_init)


def _communicator_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    self = args[0] if args else None
    attrs: Attrs = {}
    # DeviceCommunicatorBase: world_size of the group, rank_in_group; PyNccl/CustomAllreduce: rank
    for attr, key in (
        ("world_size", "starttrace.dist.group_size"),
        ("rank_in_group", "starttrace.dist.rank"),
        ("rank", "starttrace.dist.rank"),
    ):
        value = getattr(self, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and key not in attrs:
            attrs[key] = value
    for attr in ("disabled", "available"):
        value = getattr(self, attr, None)
        if isinstance(value, bool):
            attrs[f"vllm.dist.{attr}"] = value
    unique = getattr(self, "unique_name", None)
    if isinstance(unique, str):
        attrs["vllm.dist.group"] = unique
    return attrs or None


def _group_before(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
    # GroupCoordinator.__init__(self, group_ranks, local_rank, torch_distributed_backend,
    #                           use_device_communicator, use_message_queue_broadcaster, group_name)
    attrs: Attrs = {}
    name = _arg(args, kwargs, 6, "group_name")
    if isinstance(name, str):
        attrs["vllm.dist.group"] = name
    backend = _arg(args, kwargs, 3, "torch_distributed_backend")
    if backend is not None:
        attrs["starttrace.dist.backend"] = str(backend)
    return attrs


def _p2p_check_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    return {"vllm.dist.p2p": result} if isinstance(result, bool) else None


# Rows per defining module. vLLM modules import these by name (`from .parallel_state import *`,
# `from ..launcher import serve_http`): the hook runs right after the defining module finished
# importing, before the importer binds the name, so the importer gets the wrapper.
_COMMUNICATORS = "vllm.distributed.device_communicators"
_TABLES: "dict[str, tuple[Row, ...]]" = {
    "vllm.engine.arg_utils": (
        ("EngineArgs.create_engine_config", "vllm.create_engine_config", "config", None, _config_after),
    ),
    "vllm.entrypoints.launchers.launcher": (
        ("setup_server", "vllm.api_server.setup", "api_server", _role("api_server"), None),
        ("serve_http", None, "api_server", _role("api_server"), None),
    ),
    "vllm.entrypoints.launchers.app": (("build_app", "vllm.api_server.build_app", "api_server", None, None),),
    "vllm.entrypoints.launchers.api_server.app_state": (
        ("init_app_state", "vllm.api_server.init_app_state", "api_server", None, None),
    ),
    "vllm.v1.engine.async_llm": (("AsyncLLM.__init__", "vllm.async_llm.init", "engine_init", None, None),),
    "vllm.v1.engine.llm_engine": (("LLMEngine.__init__", "vllm.llm_engine.init", "engine_init", None, None),),
    "vllm.v1.engine.utils": (("wait_for_engine_startup", "vllm.wait_for_engine_core", "engine_init", None, None),),
    "vllm.v1.engine.core": (
        ("EngineCoreProc.run_engine_core", None, "engine_init", _engine_core_before, None),
        ("EngineCoreProc.__init__", "vllm.engine_core.init", "engine_init", _role("engine_core"), None),
        ("EngineCore._initialize_kv_caches", "vllm.engine_core.init_kv_caches", "kv_cache", None, None),
        ("EngineCoreProc.run_busy_loop", "vllm.engine_core.busy_loop", "idle", None, None),
    ),
    "vllm.v1.executor.abstract": (("Executor.__init__", "vllm.executor.init", "executor_init", None, None),),
    "vllm.v1.executor.multiproc_executor": (
        ("WorkerProc.worker_main", None, "worker_init", _worker_main_before, None),
        ("WorkerProc.__init__", "vllm.worker.init", "worker_init", _worker_init_before, None),
        ("WorkerProc.wait_for_ready", "vllm.executor.wait_for_workers", "executor_init", None, None),
        ("WorkerProc.worker_busy_loop", "vllm.worker.busy_loop", "idle", None, None),
    ),
    "vllm.v1.worker.worker_base": (
        ("WorkerWrapperBase.init_worker", "vllm.worker.init_worker", "worker_init", None, _init_worker_after),
    ),
    "vllm.distributed.parallel_state": (
        ("init_distributed_environment", "vllm.init_distributed_environment", "dist_init", _dist_env_before, None),
        ("initialize_model_parallel", "vllm.initialize_model_parallel", "dist_init", _model_parallel_before, None),
        ("GroupCoordinator.__init__", "vllm.dist.group.init", "dist_init", _group_before, None),
    ),
    # reads every shard once to warm the page cache (network filesystems, or
    # --safetensors-load-strategy=prefetch); the weights.load spans of the files come after it
    "vllm.model_executor.model_loader.weight_utils": (
        ("_prefetch_all_checkpoints", "vllm.weights.prefetch", "model_load", None, None),
    ),
    f"{_COMMUNICATORS}.pynccl": (
        ("PyNcclCommunicator.__init__", "vllm.dist.pynccl.init", "dist_init", None, _communicator_after),
    ),
    f"{_COMMUNICATORS}.custom_all_reduce": (
        ("CustomAllreduce.__init__", "vllm.dist.custom_all_reduce.init", "dist_init", None, _communicator_after),
        ("_can_p2p", "vllm.dist.p2p_check", "dist_init", None, _p2p_check_after),
    ),
    f"{_COMMUNICATORS}.all_reduce_utils": (
        ("gpu_p2p_access_check", "vllm.dist.gpu_p2p_access_check", "dist_init", None, _p2p_check_after),
    ),
    f"{_COMMUNICATORS}.cuda_communicator": (
        ("CudaCommunicator.__init__", "vllm.dist.device_communicator.init", "dist_init", None, _communicator_after),
    ),
    f"{_COMMUNICATORS}.cpu_communicator": (
        ("CpuCommunicator.__init__", "vllm.dist.device_communicator.init", "dist_init", None, _communicator_after),
    ),
    "vllm.compilation.backends": (("VllmBackend.__call__", "vllm.compile", "compile", None, _vllm_backend_after),),
    # VLLM_ENABLE_STARTUP_PLAN=1: the worker looks up its persisted KV-profile result (the start kind's plan_cache)
    "vllm.v1.worker.startup_plan": (("_load_plan", "vllm.startup_plan.load", "kv_cache", None, _startup_plan_after),),
}

# Methods of the worker class vLLM resolves at run time (CPUWorker, Worker, XPUWorker, plugin
# workers): wrapped on that class after WorkerWrapperBase.init_worker built the worker.
WORKER_METHODS: "tuple[tuple[str, str, str, After | None], ...]" = (
    ("init_device", "vllm.worker.init_device", "device_init", _init_device_after),
    ("load_model", "vllm.model_load", "model_load", _load_model_after),
    ("determine_available_memory", "vllm.kv_cache.profile", "kv_cache", _kv_bytes_after),
    ("initialize_from_config", "vllm.kv_cache.allocate", "kv_cache", None),
    ("compile_or_warm_up_model", "vllm.compile_or_warm_up", "compile", None),
)
# Methods of the model runner (built in init_device), wrapped on its class. vLLM 0.32 marks
# capture_model ("Capture model") and the CPU runner's warming_up_model ("Warmup (CPU)"): their rows
# here apply to versions or runners that do not.
MODEL_RUNNER_METHODS: "tuple[tuple[str, str, str, Before | None, After | None], ...]" = (
    ("profile_run", "vllm.kv_cache.profile_run", "kv_cache", _profile_run_before, _profile_run_after),
    ("capture_model", "vllm.cuda_graphs.capture", "cuda_graphs", None, None),
    ("warming_up_model", "vllm.warmup", "warmup", None, None),
    ("_warmup_and_capture", "cuda_graphs.capture", "cuda_graphs", _capture_before, _capture_after),
)


# --------------------------------------------------------------------------------------------
# the first request (phase first_request, probes/first_request.py): in the API server the parts of
# the request the server probe opened (render = tokenize and process the input, engine = the wait
# for the engine's first output, detokenize = the output processor's first pass); in the engine
# core its first step with a request and the schedule inside; in each worker its first
# execute_model and sample_tokens (WORKER_FIRST_CALLS), with what they compile or capture inside.

STEP = "vllm.first_request.step"


def _has_requests(args: "tuple[Any, ...]") -> bool:
    core = args[0] if args else None
    return bool(core.scheduler.has_requests())  # type: ignore[union-attr]


def _in_first_step(args: "tuple[Any, ...]") -> bool:
    return first_request.in_first_call(STEP)


_FIRST_REQUEST: "dict[str, tuple[tuple[str, Callable[[Callable[..., Any]], Callable[..., Any]]], ...]]" = {
    "vllm.entrypoints.openai.completion.serving": (
        (
            "OpenAIServingCompletion.render_completion_request",
            lambda fn: first_request.first_part(fn, "vllm.first_request.render"),
        ),
    ),
    "vllm.entrypoints.openai.chat_completion.serving": (
        ("OpenAIServingChat.render_chat_request", lambda fn: first_request.first_part(fn, "vllm.first_request.render")),
    ),
    "vllm.v1.engine.async_llm": (
        ("AsyncLLM.generate", lambda fn: first_request.first_item(fn, "vllm.first_request.engine")),
    ),
    "vllm.v1.engine.output_processor": (
        (
            "OutputProcessor.process_outputs",
            lambda fn: first_request.first_part(fn, "vllm.first_request.detokenize"),
        ),
    ),
    "vllm.v1.engine.core": (
        ("EngineCore.step", lambda fn: first_request.first_call(fn, STEP, _has_requests)),
        ("EngineCore.step_with_batch_queue", lambda fn: first_request.first_call(fn, STEP, _has_requests)),
    ),
    "vllm.v1.core.sched.scheduler": (
        (
            "Scheduler.schedule",
            lambda fn: first_request.first_call(fn, "vllm.first_request.schedule", _in_first_step),
        ),
    ),
}
WORKER_FIRST_CALLS = (
    ("execute_model", "vllm.first_request.execute_model"),
    ("sample_tokens", "vllm.first_request.sample_tokens"),
)


def _patch_first(
    owner: "Any", attr: str, label: str, make: "Callable[[Callable[..., Any]], Callable[..., Any]]"
) -> None:
    if raw_attr(owner, attr) is None:
        note_missing(label)
    elif patch(owner, attr, make):
        note_attached(label)


def _first_request_hook(rows: "tuple[tuple[str, Any], ...]") -> "Callable[[Any], None]":
    def hook(module: "Any") -> None:
        for path, make in rows:
            try:
                owner_name, attr = path.split(".")
                owner = getattr(module, owner_name, None)
                if owner is None:
                    note_missing(f"{module.__name__}.{path}")
                else:
                    _patch_first(owner, attr, f"{module.__name__}.{path}", make)
            except Exception as exc:
                recorder.report(f"vllm probe {path} failed: {type(exc).__name__}: {exc}", key=f"vllm:{path}")
        publish_probe_list()

    hook.__qualname__ = f"vllm_first_request[{rows[0][0]}]"
    return hook


_HOOKS: "tuple[tuple[str, Callable[[Any], None]], ...]" = (
    ("vllm.tracing", _patch_tracing),
    *((module, _hook(rows)) for module, rows in _TABLES.items()),
    ("vllm.compilation.decorators", _patch_decorators),
    *((module, _first_request_hook(rows)) for module, rows in _FIRST_REQUEST.items()),
)
