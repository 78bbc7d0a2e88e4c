"""vLLM probe: process roles and ranks, and vLLM's startup phases as spans.

Everything is wrapped by name after vLLM imported the module that defines it, with getattr
checks: what the installed vLLM lacks is skipped and listed in the process attribute
`starttrace.probes_missing`; what attached is listed in `starttrace.probes`. This module imports
the standard library only. Checked against vLLM 0.32 (see docs/probes.md for the table).

Roles (process attribute `starttrace.role`):
- `api_server`: the process runs vLLM's API server entry (command line), or calls
  `launcher.setup_server` / `serve_http` / `build_async_engine_client`.
- `engine_core`: `EngineCoreProc.run_engine_core` (the EngineCore process target).
- `worker`: `WorkerProc.worker_main` (target) and `WorkerProc.__init__` (rank, local_rank and
  world size from their arguments: no RANK env var reaches a vLLM worker).
- `helper`: vLLM's model-inspection subprocess, the custom all-reduce P2P check, the
  multiprocessing resource tracker (recognised from the command line at activation).
"""

import sys

from starttrace import recorder
from starttrace.probes._wrap import (
    _mark,
    note_attached,
    note_missing,
    patch,
    publish_probe_list,
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
    if len(args) > index:
        return args[index]
    return None


def _world_size(vllm_config: "Any") -> int | None:
    try:
        value = vllm_config.parallel_config.world_size
        return int(value)
    except Exception:
        return None


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
    world_size = _world_size(vllm_config)
    if world_size is not None:
        attrs["starttrace.world_size"] = world_size
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
    identity = _worker_identity(rank, local_rank, vllm_config)
    set_role_and_attrs(identity)
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
    return attrs or None


# --------------------------------------------------------------------------------------------
# wrapping

# Table rows: (attribute path in the module, span name or None for identity only, phase,
# before, after). A row with no span name only runs `before` (process identity) on each call:
# used for the targets that run for the process's whole life (a span there would cover the
# process and hide its gaps).
Row = tuple  # (str, str | None, str, Before | None, After | None)


def _identity_only(original: "Callable[..., Any]", before: "Before") -> "Callable[..., Any]":
    def wrapper(*args: "Any", **kwargs: "Any") -> "Any":
        if recorder._writer is not None:
            try:
                before(args, kwargs)
            except Exception as exc:
                recorder.report(f"vllm probe identity failed: {type(exc).__name__}: {exc}", key="vllm:identity")
        return original(*args, **kwargs)

    code = getattr(original, "__code__", None)
    if code is not None and code.co_flags & 0x80:  # a coroutine function

        async def async_wrapper(*args: "Any", **kwargs: "Any") -> "Any":
            if recorder._writer is not None:
                try:
                    before(args, kwargs)
                except Exception as exc:
                    recorder.report(f"vllm probe identity failed: {type(exc).__name__}: {exc}", key="vllm:identity")
            return await original(*args, **kwargs)

        return _mark(async_wrapper, original)
    return _mark(wrapper, original)


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
    if not hasattr(owner, attr):
        note_missing(label)
        return
    if name is None:
        assert before is not None
        attached = patch(owner, attr, lambda fn: _identity_only(fn, before))
    else:
        span_name = name
        attached = patch(owner, attr, lambda fn: traced(fn, span_name, phase, {"code.function": label}, before, after))
    if attached:
        note_attached(label)


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
    for method, name, phase, after in WORKER_METHODS:
        label = f"{klass.__module__}.{klass.__qualname__}.{method}"
        if not hasattr(klass, method):
            note_missing(label)
            continue
        if patch(klass, method, _method_wrapper(name, phase, label, after)):
            note_attached(label)
    runner = getattr(worker, "model_runner", None)
    if runner is not None:
        _patch_model_runner(runner)
    publish_probe_list()
    return {"vllm.worker_class": f"{klass.__module__}.{klass.__qualname__}"}


def _method_wrapper(
    name: str, phase: str, label: str, after: "After | None"
) -> "Callable[[Callable[..., Any]], Callable[..., Any]]":
    def make(fn: "Callable[..., Any]") -> "Callable[..., Any]":
        return traced(fn, name, phase, {"code.function": label}, None, after)

    return make


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
    for method, name, phase in MODEL_RUNNER_METHODS:
        if not hasattr(klass, method):
            continue  # capture_model exists on GPU runners only, warming_up_model on CPU
        label = f"{klass.__module__}.{klass.__qualname__}.{method}"
        if patch(klass, method, _method_wrapper(name, phase, label, None)):
            note_attached(label)


# Per defining module. vLLM modules import these by name (`from .parallel_state import *`,
# `from ..launcher import serve_http`): the hook runs right after the defining module finished
# importing, before the importer binds the name, so the importer gets the wrapper.
_ARG_UTILS: "tuple[Row, ...]" = (
    ("EngineArgs.create_engine_config", "vllm.create_engine_config", "config", None, _config_after),
)
_LAUNCHER: "tuple[Row, ...]" = (
    ("setup_server", "vllm.api_server.setup", "api_server", _role("api_server"), None),
    ("serve_http", None, "api_server", _role("api_server"), None),
)
_APP: "tuple[Row, ...]" = (("build_app", "vllm.api_server.build_app", "api_server", None, None),)
_APP_STATE: "tuple[Row, ...]" = (("init_app_state", "vllm.api_server.init_app_state", "api_server", None, None),)
_ASYNC_LLM: "tuple[Row, ...]" = (("AsyncLLM.__init__", "vllm.async_llm.init", "engine_init", None, None),)
_LLM_ENGINE: "tuple[Row, ...]" = (("LLMEngine.__init__", "vllm.llm_engine.init", "engine_init", None, None),)
_ENGINE_UTILS: "tuple[Row, ...]" = (
    ("wait_for_engine_startup", "vllm.wait_for_engine_core", "engine_init", None, None),
)
_ENGINE_CORE: "tuple[Row, ...]" = (
    ("EngineCoreProc.run_engine_core", None, "engine_init", _engine_core_before, None),
    ("EngineCoreProc.__init__", "vllm.engine_core.init", "engine_init", _role("engine_core"), None),
    ("EngineCore._initialize_kv_caches", "vllm.engine_core.init_kv_caches", "kv_cache", None, None),
    ("EngineCoreProc.run_busy_loop", "vllm.engine_core.busy_loop", "idle", None, None),
)
_EXECUTOR: "tuple[Row, ...]" = (("Executor.__init__", "vllm.executor.init", "executor_init", None, None),)
_MULTIPROC_EXECUTOR: "tuple[Row, ...]" = (
    ("WorkerProc.worker_main", None, "worker_init", _worker_main_before, None),
    ("WorkerProc.__init__", "vllm.worker.init", "worker_init", _worker_init_before, None),
    ("WorkerProc.wait_for_ready", "vllm.executor.wait_for_workers", "executor_init", None, None),
    ("WorkerProc.worker_busy_loop", "vllm.worker.busy_loop", "idle", None, None),
)
_WORKER_BASE: "tuple[Row, ...]" = (
    ("WorkerWrapperBase.init_worker", "vllm.worker.init_worker", "worker_init", None, _init_worker_after),
)
_PARALLEL_STATE: "tuple[Row, ...]" = (
    ("init_distributed_environment", "vllm.init_distributed_environment", "dist_init", _dist_env_before, None),
    ("initialize_model_parallel", "vllm.initialize_model_parallel", "dist_init", _model_parallel_before, None),
)
_COMPILATION_BACKENDS: "tuple[Row, ...]" = (("VllmBackend.__call__", "vllm.compile", "compile", None, None),)

# Methods of the worker class vLLM resolves at run time (CPUWorker, Worker, XPUWorker, plugin
# workers): wrapped on that class after WorkerWrapperBase.init_worker built the worker.
WORKER_METHODS: "tuple[tuple[str, str, str, After | None], ...]" = (
    ("init_device", "vllm.worker.init_device", "device_init", _init_device_after),
    ("load_model", "vllm.model_load", "model_load", _load_model_after),
    ("determine_available_memory", "vllm.kv_cache.profile", "kv_cache", _kv_bytes_after),
    ("initialize_from_config", "vllm.kv_cache.allocate", "kv_cache", None),
    ("compile_or_warm_up_model", "vllm.compile_or_warm_up", "compile", None),
)
# Methods of the model runner (built in init_device), wrapped on its class.
MODEL_RUNNER_METHODS: tuple[tuple[str, str, str], ...] = (
    ("profile_run", "vllm.kv_cache.profile_run", "kv_cache"),
    ("capture_model", "vllm.cuda_graphs.capture", "cuda_graphs"),
    ("warming_up_model", "vllm.warmup", "compile"),
)

_HOOKS: "tuple[tuple[str, Callable[[Any], None]], ...]" = (
    ("vllm.engine.arg_utils", _hook(_ARG_UTILS)),
    ("vllm.entrypoints.launchers.launcher", _hook(_LAUNCHER)),
    ("vllm.entrypoints.launchers.app", _hook(_APP)),
    ("vllm.entrypoints.launchers.api_server.app_state", _hook(_APP_STATE)),
    ("vllm.v1.engine.async_llm", _hook(_ASYNC_LLM)),
    ("vllm.v1.engine.llm_engine", _hook(_LLM_ENGINE)),
    ("vllm.v1.engine.utils", _hook(_ENGINE_UTILS)),
    ("vllm.v1.engine.core", _hook(_ENGINE_CORE)),
    ("vllm.v1.executor.abstract", _hook(_EXECUTOR)),
    ("vllm.v1.executor.multiproc_executor", _hook(_MULTIPROC_EXECUTOR)),
    ("vllm.v1.worker.worker_base", _hook(_WORKER_BASE)),
    ("vllm.distributed.parallel_state", _hook(_PARALLEL_STATE)),
    ("vllm.compilation.backends", _hook(_COMPILATION_BACKENDS)),
)
