"""Activation: the `.pth` line's entry, and what every traced process shares from its start.

Every traced Python process loads this module (each module loaded at activation costs ~0.34 M
instructions, and ~30 more per byte of its bytecode: docs/benchmarks.md), so it holds the common
case of activation, kept small, and the names, state and records the rest of the hot path shares:

- The common case (`_activate_light`): the C core is built, no probe loads at activation (the
  command line names no vLLM, no forkserver preload), spans are not held back, and a root starts
  no exporter and is no job of several nodes. It writes the same records as boot's activation,
  with the C core's import hook, whose other cases go to trampolines here, and opens the
  journal's next segments itself. The recorder, the journal writer, the import probe and the probe
  loader load on their first use (`_adopt`): a library with a probe is imported, the C hook hands
  an import on (another thread, importlib), a fork, the program imports the recorder itself.
- Anything else: boot.activate_in_python, the whole activation in Python.

Standard library only, and only modules loaded at interpreter start (`atexit` is loaded and
hidden again: boot's docstring). No `from __future__ import annotations` (it loads `__future__`).
"""

import os
import sys
from _thread import get_ident
from time import monotonic_ns, time_ns

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, MutableMapping
    from typing import Any
else:  # annotations are evaluated at run time here
    Any = object
    MutableMapping = dict

FORMAT_VERSION = 3  # of the journal (docs/journal.md)
SEGMENT_SUFFIX = ".journal"
FIRST_SEGMENT = 256 * 1024  # bytes; each next segment is twice the size of the one before ...
MAX_SEGMENT = 8 * 1024 * 1024  # ... up to this (a record larger than that gets a segment of its own)
SEGMENT_RESERVE = 1024  # a segment's last bytes, kept for the `warn` record that ends a failed journal

SWITCH_VARS = ("STARTTRACE", "VLLM_STARTTRACE")
ON_VALUES = frozenset({"1", "true", "on", "yes"})
OFF_VALUES = frozenset({"", "0", "false", "off", "no"})

ENV_RUN_ID = "STARTTRACE_RUN_ID"
ENV_RUN_DIR = "STARTTRACE_RUN_DIR"
ENV_TRACE_ID = "STARTTRACE_TRACE_ID"
ENV_ROOT_SPAN = "STARTTRACE_ROOT_SPAN"
ENV_PARENT_SPAN = "STARTTRACE_PARENT_SPAN"
ENV_PARENT_PID = "STARTTRACE_PARENT_PID"
ENV_START_METHOD = "STARTTRACE_START_METHOD"
ENV_LAUNCH_NS = "STARTTRACE_LAUNCH_NS"
ENV_SERVICE = "STARTTRACE_SERVICE_NAME"
ENV_DIR = "STARTTRACE_DIR"
ENV_PURE_PYTHON = "STARTTRACE_PURE_PYTHON"  # on: ignore the C core of the hot path
ENV_ANCHOR = "STARTTRACE_ANCHOR"
ENV_NEW_RUN_ID = "STARTTRACE_NEW_RUN_ID"
ENV_DISABLED = "STARTTRACE_DISABLED"  # set when the run could not be recorded: children stay off
ENV_INTERNAL = "STARTTRACE_INTERNAL"  # set in starttrace's own helper processes: never traced
ENV_CLOCK_DOMAIN = "STARTTRACE_CLOCK_DOMAIN"
ENV_HOST_ID = "STARTTRACE_HOST_ID"
ENV_MIN_IMPORT_US = "STARTTRACE_MIN_IMPORT_US"


# What this process knows about itself and its run: one module-global namespace (a SimpleNamespace,
# the type of sys.implementation: a class of its own costs ~58k instructions in every traced process).
STATE_DEFAULTS: "dict[str, Any]" = {
    "run_id": "",
    "run_dir": "",
    "trace_id": "",
    "root_span": "",
    "is_root": False,
    "method": "exec",
    "created": 0,
    "activated": 0,
    "ready": False,
    "ended": False,
    "in_launch": 0,  # > 0 while a multiprocessing Process.start() runs in this process
    "fork_span": "",
    "fork_started": 0,
    "bootstrap_span": "",
    "role": "",
    "instance_id": "",
    "activation_seen": False,
    "exit_status": None,  # NO_STATUS from activation on; sys.exit(status) records it
    # One clock anchor for the whole run (the root's), so every lane converts monotonic time to
    # epoch time the same way and lanes of different processes line up exactly.
    "anchor_mono": 0,
    "anchor_epoch": 0,
    "parent_of_root": None,
    # The job of several nodes this root belongs to (launchers.identify at run creation: roots only),
    # None: a run of its own
    "job": None,
}
state: Any = type(sys.implementation)(**STATE_DEFAULTS)
NO_STATUS = object()

# Modules starttrace loaded for itself and removed from sys.modules again: name -> ns the load
# took (None: not measured). Written into the process record (docs/journal.md, "footprint").
footprint: dict = {}

# probe -> the modules its install() hooks (tests/unit/test_lazy_probes.py keeps them equal)
LAZY_PROBES: "dict[str, tuple[str, ...]]" = {
    "starttrace.tracer.probes.multiprocessing": (
        "multiprocessing.process",
        "multiprocessing.forkserver",
        "multiprocessing.resource_tracker",
        "subprocess",
    ),
    "starttrace.tracer.probes.torch": ("torch.serialization", "torch.cuda", "torch.distributed", "torch.accelerator"),
    "starttrace.tracer.probes.compile": ("torch._dynamo.utils",),
    "starttrace.tracer.probes.weights": ("safetensors", "safetensors.torch", "huggingface_hub.file_download"),
    "starttrace.tracer.probes.vllm": (
        "vllm.tracing",
        "vllm.engine.arg_utils",
        "vllm.entrypoints.launchers.launcher",
        "vllm.entrypoints.launchers.app",
        "vllm.entrypoints.launchers.api_server.app_state",
        "vllm.v1.engine.async_llm",
        "vllm.v1.engine.llm_engine",
        "vllm.v1.engine.utils",
        "vllm.v1.engine.core",
        "vllm.v1.executor.abstract",
        "vllm.v1.executor.multiproc_executor",
        "vllm.v1.worker.worker_base",
        "vllm.v1.worker.startup_plan",
        "vllm.distributed.parallel_state",
        "vllm.compilation.backends",
        "vllm.compilation.decorators",
        "vllm.model_executor.model_loader.weight_utils",
        "vllm.distributed.device_communicators.pynccl",
        "vllm.distributed.device_communicators.custom_all_reduce",
        "vllm.distributed.device_communicators.all_reduce_utils",
        "vllm.distributed.device_communicators.cuda_communicator",
        "vllm.distributed.device_communicators.cpu_communicator",
        "vllm.entrypoints.openai.completion.serving",
        "vllm.entrypoints.openai.chat_completion.serving",
        "vllm.v1.engine.output_processor",
        "vllm.v1.core.sched.scheduler",
    ),
    "starttrace.tracer.probes.tokenizer": (
        "transformers.tokenization_utils_base",
        "transformers.models.auto.tokenization_auto",
    ),
    "starttrace.tracer.probes.servers": ("uvicorn.server",),
}
# probe -> words of the command line that load it at activation
EAGER_WHEN_ARGV: "dict[str, tuple[str, ...]]" = {
    "starttrace.tracer.probes.vllm": ("vllm", "all_reduce_utils", "resource_tracker"),
}
# probe -> environment variables that load it at activation (when set and not blank)
EAGER_WHEN_ENV: "dict[str, tuple[str, ...]]" = {
    "starttrace.tracer.probes.multiprocessing": ("STARTTRACE_FORKSERVER_PRELOAD",),
}
# the probes named installed from activation on (`starttrace.probes.installed`): the import probe,
# then the lazy probes whose install() only hooks modules, which their lazy loader hooks alike
INSTALLED_AT_ACTIVATION = ("imports", "multiprocessing")

# What launchers.identify reads: without any of it a root is a run of its own, and activation does
# not load launchers.py (~0.9 M instructions; tests/unit/test_launchers.py keeps the two in step).
JOB_ENV_VARS = ("STARTTRACE_RUN_ID", "VLLM_STARTTRACE_RUN_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
JOB_ARGV_WORDS = ("torch", "vllm", "sglang")

_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES[ord('"')] = '\\"'
_ESCAPES[ord("\\")] = "\\\\"
_ESCAPES[0x7F] = "\\u007f"


def quote(text: str) -> str:
    if text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'  # the common case (module names, paths): 5x faster than translate
    return '"' + text.translate(_ESCAPES) + '"'


def encode(value: object) -> str:
    """Encode a JSON value (str, int, float, bool, None, list, tuple, dict); others as str."""
    kind = type(value)
    if kind is str:
        return quote(value)  # type: ignore[arg-type]
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            return quote(repr(value))
        return repr(value)
    if value is None:
        return "null"
    if kind is list or kind is tuple:
        return "[" + ",".join([encode(item) for item in value]) + "]"  # type: ignore[attr-defined]
    if kind is dict:
        return (
            "{"
            + ",".join([quote(str(k)) + ":" + encode(v) for k, v in value.items()])  # type: ignore[attr-defined]
            + "}"
        )
    return quote(str(value))


def segment_path(base: str, number: int) -> str:
    return f"{base}.{number}{SEGMENT_SUFFIX}"


# ---- the switch, the run, the process ------------------------------------------------------------


def switch_value(environ: Any = None) -> tuple[str, str]:
    """('on'|'off'|'invalid', raw value) from STARTTRACE, else VLLM_STARTTRACE."""
    environ = os.environ if environ is None else environ
    for name in SWITCH_VARS:
        raw = environ.get(name)
        if raw is not None and raw.strip():
            value = raw.strip().lower()
            if value in ON_VALUES:
                return "on", raw
            if value in OFF_VALUES:
                return "off", raw
            return "invalid", f"{name}={raw!r}"
    return "off", ""


def default_journal_root() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "starttrace", "runs")


def may_be_job(environ: Any, argv: Any, incoming_trace: str) -> bool:
    """False when launchers.identify would find no job (it is not loaded then)."""
    if incoming_trace or any(environ.get(name) for name in JOB_ENV_VARS):
        return True
    for arg in argv[1:]:  # a launcher is the script or the -m module, never named after -c
        if arg == "-c":
            return False
        if any(word in arg for word in JOB_ARGV_WORDS):
            return True
    return False


def parse_traceparent(value: str) -> tuple[str, "str | None"]:
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return "", None
    trace_id, span_id = parts[1].lower(), parts[2].lower()
    hexdigits = "0123456789abcdef"
    if not all(c in hexdigits for c in trace_id + span_id) or int(trace_id, 16) == 0 or int(span_id, 16) == 0:
        return "", None
    return trace_id, span_id


def process_start_monotonic(pid: "int | str" = "self") -> "tuple[int, bytes] | None":
    """(monotonic ns of the process's creation, its state letter) from /proc/<pid>/stat, which
    counts clock ticks since boot; None when there is no such process (or no /proc)."""
    try:
        stat = _read_file(f"/proc/{pid}/stat", 4096)
        fields = stat[stat.rindex(b")") + 2 :].split()
        start_ticks = int(fields[19])
        import time as _time  # a builtin module

        since_start = _time.clock_gettime_ns(_time.CLOCK_BOOTTIME) - start_ticks * 1_000_000_000 // os.sysconf(
            "SC_CLK_TCK"
        )
        return monotonic_ns() - since_start, fields[0]
    except (OSError, ValueError, IndexError):
        return None


def process_creation_ns(now: int) -> int:
    """Monotonic time of this process's creation (never later than `now`). A creation more than
    an hour back is not believed: a faked clock (libfaketime fakes CLOCK_BOOTTIME too) says so."""
    started = process_start_monotonic()
    return now if started is None or now - started[0] > 3_600_000_000_000 else min(now, started[0])


def inherit_run(environ: "Mapping[str, str]") -> bool:
    """A child of a traced process: take its run from the environment (False: this is a root)."""
    inherited_run = environ.get(ENV_RUN_ID)
    run_dir = environ.get(ENV_RUN_DIR)
    if not (inherited_run and run_dir):
        return False
    state.run_id = inherited_run
    state.run_dir = run_dir
    state.trace_id = environ.get(ENV_TRACE_ID, "")
    state.root_span = environ.get(ENV_ROOT_SPAN, "")
    state.is_root = False
    mono, _, epoch = environ.get(ENV_ANCHOR, "").partition(":")
    if mono.isdigit() and epoch.isdigit():
        state.anchor_mono, state.anchor_epoch = int(mono), int(epoch)
    return True


def place_in_tree(environ: "Mapping[str, str]", now: int) -> "tuple[str | None, int | None, int]":
    """(parent span, launching pid, creation time) of this process; sets state.method/created."""
    ppid = os.getppid()
    parent_span = None
    launch_pid = None
    method = "root" if state.is_root else "exec"
    created = process_creation_ns(now)
    if not state.is_root and environ.get(ENV_PARENT_PID) == str(ppid):
        parent_span = environ.get(ENV_PARENT_SPAN) or None
        method = environ.get(ENV_START_METHOD) or "exec"
        launch_pid = ppid
        launched = environ.get(ENV_LAUNCH_NS, "")
        if launched.isdigit():
            created = max(created, int(launched))
    if state.is_root:
        parent_span = state.root_span
    state.method = method
    state.created = created
    return parent_span, launch_pid, created


def new_run(now: int, environ: "MutableMapping[str, str]", root_span: str, job: Any) -> None:
    """A root: choose the run's ids and create its folder and run.json (raises OSError)."""
    trace_id, parent_span = parse_traceparent(environ.get("TRACEPARENT") or environ.get("traceparent") or "")
    state.is_root = True
    state.job = job
    state.trace_id = (job.trace_id if job else trace_id) or os.urandom(16).hex()
    state.root_span = root_span
    import time as _time  # a builtin module: importing it loads nothing new

    stamp = _time.strftime("%Y%m%d-%H%M%S", _time.gmtime())
    requested = environ.pop(ENV_NEW_RUN_ID, "")  # chosen by `starttrace run`, which reports it
    state.run_id = requested if requested.replace("-", "").isalnum() else f"{stamp}-{os.urandom(3).hex()}"
    if job and not requested:
        state.run_id = job.run_id
    root = environ.get(ENV_DIR) or default_journal_root()
    state.run_dir = os.path.join(os.path.abspath(root), state.run_id)
    state.parent_of_root = parent_span
    os.makedirs(state.run_dir, exist_ok=True)
    meta = {
        "v": FORMAT_VERSION,
        "run_id": state.run_id,
        "trace_id": state.trace_id,
        "root_span_id": state.root_span,
        "parent_span_id": parent_span,
        "argv": list(getattr(sys, "orig_argv", sys.argv)),
        "cwd": os.getcwd(),
        "host": os.uname().nodename,
        "created_epoch_ns": time_ns(),
        "service": service_name(),
    }
    data = (encode(meta) + "\n").encode("utf-8", "backslashreplace")
    fd = os.open(os.path.join(state.run_dir, "run.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def remove_run_dir() -> None:
    """The root could not open its journal: take away the run folder it made (run.json only), so
    no run without a journal is left behind. Anything else in it (another run's) stays."""
    try:
        if os.listdir(state.run_dir) == ["run.json"]:
            os.unlink(os.path.join(state.run_dir, "run.json"))
            os.rmdir(state.run_dir)
    except OSError:
        pass


def process_record(
    parent_span: "str | None", launch_pid: "int | None", created: int, now: int, span: str, hotpath: str
) -> str:
    record = {
        "k": "process",
        "v": FORMAT_VERSION,
        "run": state.run_id,
        "trace": state.trace_id,
        "iid": state.instance_id,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "host": os.uname().nodename,
        "argv": list(getattr(sys, "orig_argv", sys.argv)),
        "exe": sys.executable,
        "service": service_name(),
        "method": state.method,
        "created": created,
        "activated": now,
        "anchor_mono": state.anchor_mono,
        "anchor_epoch": state.anchor_epoch,
        "span": span,
        "parent": parent_span,
        "launch_pid": launch_pid,
        "root_span": state.root_span,
        "preloaded": sorted(sys.modules),
        "footprint": footprint,
        "python": sys.version.split()[0],
        "hotpath": hotpath,
    }
    return encode(record) + "\n"


def startup_begin_record() -> str:
    """The root's `startup` span, begun at its creation."""
    root_parent = state.parent_of_root
    line = '{"k":"b","s":"%s","p":%s,"n":"startup","t":%d,"a":{"starttrace.phase":"startup"}}\n'
    return line % (state.root_span, quote(root_parent) if root_parent else "null", state.created)


def identity_attrs(environ: "MutableMapping[str, str]") -> "dict[str, Any]":
    attrs: dict[str, Any] = {"starttrace.start_method": state.method}
    rank = environ.get("RANK", "")
    if rank.isdigit():
        attrs["starttrace.role"] = "worker"
        attrs["starttrace.rank"] = int(rank)
        for env_name, key in (("LOCAL_RANK", "starttrace.local_rank"), ("WORLD_SIZE", "starttrace.world_size")):
            value = environ.get(env_name, "")
            if value.isdigit():
                attrs[key] = int(value)
    elif state.is_root:
        attrs["starttrace.role"] = "main"
    attrs.update(process_attrs(environ, state.is_root, state.job))  # clock domain, host id, job keys
    return attrs


def is_multiprocessing_child() -> bool:
    argv = getattr(sys, "orig_argv", sys.argv)
    return any("multiprocessing" in arg for arg in argv[1:3]) or "--multiprocessing-fork" in argv


def service_name() -> str:
    environ = os.environ
    name = environ.get(ENV_SERVICE) or environ.get("OTEL_SERVICE_NAME")
    if name:
        return name
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if "-m" in argv[1:]:
        index = argv.index("-m", 1)
        if index + 1 < len(argv):
            return argv[index + 1].split(".")[0]
    if "-c" in argv[1:]:
        return "python"
    for arg in argv[1:]:
        if not arg.startswith("-"):
            return os.path.splitext(os.path.basename(arg))[0] or "python"
    return os.path.basename(argv[0]) if argv else "python"


def export_run_environment() -> None:
    """Hand this root's run down to its children (the environment they inherit)."""
    environ = os.environ
    environ[ENV_RUN_ID] = state.run_id
    environ[ENV_RUN_DIR] = state.run_dir
    environ[ENV_TRACE_ID] = state.trace_id
    environ[ENV_ROOT_SPAN] = state.root_span
    environ[ENV_ANCHOR] = f"{state.anchor_mono}:{state.anchor_epoch}"
    environ.setdefault(ENV_SERVICE, service_name())
    # vLLM reads and writes the lowercase W3C header: its own startup spans join this trace.
    environ["traceparent"] = f"00-{state.trace_id}-{state.root_span}-01"


def otlp_endpoint(environ: "Mapping[str, str] | None" = None) -> "str | None":
    environ = os.environ if environ is None else environ
    specific = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if specific:
        return specific
    general = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return general.rstrip("/") + "/v1/traces" if general else None


def auto_export_endpoint(environ: "Mapping[str, str] | None" = None) -> "str | None":
    """The endpoint a root's follower exports the run to (an OTLP endpoint is configured and
    STARTTRACE_OTLP_AUTO is not 0); None: the run is known from its journals only."""
    environ = os.environ if environ is None else environ
    endpoint = otlp_endpoint(environ)
    return endpoint if endpoint and environ.get("STARTTRACE_OTLP_AUTO", "1") != "0" else None


# ---- host and clock domain -----------------------------------------------------------------------
# A clock domain is a set of processes whose CLOCK_MONOTONIC is one clock: one kernel boot
# (`/proc/sys/kernel/random/boot_id`) and one time namespace (`readlink /proc/self/ns/time`; a time
# namespace offsets CLOCK_MONOTONIC, containers without one share the host's). The root reads them
# once and passes them on in the environment (STARTTRACE_CLOCK_DOMAIN, STARTTRACE_HOST_ID), so its
# children pay two dictionary lookups. Every process records them as resource attributes
# `starttrace.clock.domain` and `host.id` (the machine id, else the boot id). The kernel's NTP state
# is read off the hot path (`starttrace.clocksync`, started by `record_clock_later`).


def _read_file(path: str, limit: int) -> bytes:
    """The first `limit` bytes of a small file (raises OSError): no buffered file object."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _read(path: str) -> str:
    try:
        return _read_file(path, 200).decode("ascii", "replace").strip()
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


def process_attrs(environ: "MutableMapping[str, str]", is_root: bool = False, job: Any = None) -> "dict[str, Any]":
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


_clock_recorded = False
_HELPER_ENV = ("PATH", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH")


def record_clock_state(reap: bool) -> None:
    """The NTP state of a journal-only run, read off the traced processes (with a follower, the
    follower measures it): once per root, at its ready or exit."""
    if state.is_root and auto_export_endpoint() is None:
        record_clock_later(state.run_dir, state.root_span, reap)


def record_clock_later(run_dir: str, root_span: str, reap: bool) -> None:
    """The kernel's NTP state for a run no exporter follows (journals only): a root process calls
    this at its `ready` or exit (once; `record_clock_state`). A detached helper (`python -m
    starttrace.clocksync`, not traced, its output to /dev/null: it holds none of the program's
    pipes) reads adjtimex, which needs ctypes, and writes `<run folder>/clock-<root span>.json`;
    readers put it on the processes of this host (docs/journal.md). `reap`: wait for the helper on
    a thread of ours (at ready; at exit, init reaps it)."""
    global _clock_recorded
    environ = os.environ
    if _clock_recorded or not run_dir or not root_span:
        return
    _clock_recorded = True
    env = {ENV_INTERNAL: "1"}  # what the helper needs, not a copy of the program's environment
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
        report(f"cannot record the clock state: {type(exc).__name__}: {exc}", key="clock-state")
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


# ---- the end of the process (both activations install these) --------------------------------------


def report(message: str, key: "str | None" = None) -> None:
    """Report an internal failure once (recorder.report; before the recorder is loaded, it loads)."""
    recorder = _python_recorder or _adopt()[0]
    recorder.report(message, key)


def end_process(exit_code: "int | None") -> None:
    recorder = _python_recorder
    if state.ended or not (recorder.active() if recorder is not None else _writer is not None):
        return
    state.ended = True
    attrs: dict[str, Any] = {}
    if exit_code is not None:
        attrs["process.exit_code"] = exit_code
    if recorder is not None:
        recorder.end(recorder.process_span_id, attrs or None)
        if state.is_root and not state.ready:
            recorder.end(state.root_span, {"starttrace.ended_by": "root_exit"})
    else:
        _write_light(_end_line(process_span_id, attrs))
        if state.is_root and not state.ready:
            _write_light(_end_line(state.root_span, {"starttrace.ended_by": "root_exit"}))
    record_clock_state(reap=False)  # at exit: init reaps the helper


def at_exit() -> None:
    try:
        end_process(exit_code_at_exit())
    except Exception:
        pass


def exit_code_at_exit() -> "int | None":
    """The interpreter's exit status, as far as atexit can know it."""
    last = getattr(sys, "last_value", None)  # set for an exception that ended the main thread
    if last is not None and not isinstance(last, SystemExit):
        return 1
    status = state.exit_status
    if status is NO_STATUS:
        return None  # the end of the program, or `raise SystemExit(n)`: atexit cannot tell which
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    return 1  # sys.exit("message") prints it and exits 1


def make_sys_exit_wrapper(real_exit: Any) -> Any:
    def exit(status: object = None) -> None:
        recorder = _python_recorder
        main = recorder._main_ident if recorder is not None else _main_ident
        if get_ident() == main:  # sys.exit in a thread ends only that thread
            state.exit_status = status
        real_exit(status)

    exit.__starttrace__ = True  # type: ignore[attr-defined]
    exit.__wrapped__ = real_exit  # type: ignore[attr-defined]
    exit.__doc__ = real_exit.__doc__
    return exit


def make_exit_wrapper(real_exit: Any) -> Any:
    def _exit(code: int) -> None:
        try:
            end_process(code)
        except Exception:
            pass
        real_exit(code)

    _exit.__starttrace__ = True  # type: ignore[attr-defined]
    _exit.__wrapped__ = real_exit  # type: ignore[attr-defined]
    return _exit


def load_atexit() -> Any:
    """`atexit` (a builtin module, not loaded at interpreter start); the caller hides it again."""
    loaded = sys.modules.get("atexit")
    if loaded is None:
        start = monotonic_ns()
        import atexit as loaded

        footprint["atexit"] = monotonic_ns() - start
    return loaded


# Modules that activation may load and can hide again: their state lives in the interpreter (atexit)
# or they have none (__future__, mmap), so a second module object made by the program's own import
# behaves like the first. Any other module activation loads stays and is named in the footprint.
_HIDEABLE = frozenset({"__future__", "atexit", "mmap"})


def hide_footprint(before: "set[str]") -> None:
    """Remove from sys.modules what activation loaded beyond starttrace's own modules (see _HIDEABLE)."""
    modules = sys.modules
    for name in [m for m in modules if m not in before]:
        if name == "starttrace" or name.startswith("starttrace."):
            continue
        if name in _HIDEABLE:
            del modules[name]
        footprint.setdefault(name, None)


# ---- the common case ----------------------------------------------------------------------------
# The light activation writes through these globals, named as the recorder's: the C import hook
# reads them from this module's dict until `adopt` hands it the recorder's.

_python_recorder: Any = None  # the recorder module, once it writes this process's records
_writer: Any = None
process_span_id = ""
_stacks: "dict[int, list[str]]" = {}
pending: "dict[str, tuple[str, int]]" = {}
_post_import_hooks: "dict[str, list[Callable[[Any], None]]]" = {}
plain_ident = -1
_main_ident = -1
_process_attrs: "dict[str, Any]" = {}
# the C core, the hook, the original _find_and_load, the journal's base, segment number and size
_light: "dict[str, Any]" = {}
span_ids: Any = iter(())
_block = 0


def refill_span_ids() -> str:
    """The recorder's span ids (recorder.py has the scheme): the next block of 256, made by the C
    core (the light case has it)."""
    global span_ids, _block
    if not _block:
        _block = int.from_bytes(os.urandom(7), "little") % ((1 << 56) - (1 << 32)) + 1
    span_ids = iter(_light["hotpath"].span_id_block(_block))
    _block += 1
    return next(span_ids)


def _new_span_id() -> str:
    span_id = next(span_ids, None)
    return span_id if span_id is not None else refill_span_ids()


def _write_light(line: str) -> None:
    segment = _writer  # a _hotpath.Segment: the C hook writes into it too
    if segment is None:
        return
    try:
        data = line.encode()
    except UnicodeEncodeError:
        data = line.encode("utf-8", "backslashreplace")
    try:
        segment.write(data)
    except ValueError:  # the segment is full
        if not _next_segment(data):
            _adopt()[0].write_encoded(data)  # the journal writer says why there is no next one


def _next_segment(data: bytes) -> bool:
    """Open the journal's next segment (sized as journal.JournalWriter.overflow sizes it) and write
    `data` there; False where it cannot be opened (a full disk: the journal writer reports it)."""
    global _writer
    number = _light["number"] + 1
    size = max(min(_light["size"] * 2, MAX_SEGMENT), (len(data) + SEGMENT_RESERVE + 4096) // 4096 * 4096)
    try:
        segment = _open_segment(_light["hotpath"], segment_path(_light["base"], number), size)
    except OSError:
        return False
    _light.update(number=number, size=size)
    _writer = segment
    segment.write(data)
    return True


def _end_line(span_id: str, attrs: "dict[str, Any]") -> str:
    return '{"k":"e","s":"%s","t":%d%s}\n' % (span_id, monotonic_ns(), ',"a":' + encode(attrs) if attrs else "")


def _begin_line(span_id: str, name: str, phase: str, parent: str, t: int) -> str:
    return '{"k":"b","s":"%s","p":"%s","n":"%s","t":%d,"a":{"starttrace.phase":"%s"}}\n' % (
        span_id,
        parent,
        name,
        t,
        phase,
    )


def _attrs_line(attrs: "dict[str, Any]") -> str:
    changed = {k: v for k, v in attrs.items() if _process_attrs.get(k) != v}
    _process_attrs.update(changed)
    return '{"k":"attrs","t":%d,"a":%s}\n' % (monotonic_ns(), encode(changed)) if changed else ""


def _light_case(environ: "Mapping[str, str]", argv: "list[str]") -> bool:
    """True where the light activation applies (see the module docstring)."""
    if (environ.get(ENV_PURE_PYTHON) or "").strip().lower() not in OFF_VALUES:
        return False
    if (environ.get(ENV_MIN_IMPORT_US) or "0").strip() != "0":
        return False
    for variables in EAGER_WHEN_ENV.values():
        if any((environ.get(variable) or "").strip() for variable in variables):
            return False
    joined = " ".join(argv)
    for words in EAGER_WHEN_ARGV.values():
        if any(word in joined for word in words):
            return False
    if environ.get(ENV_RUN_ID) and environ.get(ENV_RUN_DIR):
        return True
    trace_id = parse_traceparent(environ.get("TRACEPARENT") or environ.get("traceparent") or "")[0]
    return not may_be_job(environ, argv, trace_id) and auto_export_endpoint(environ) is None


def activate() -> None:
    """Entry point of the .pth line. Never raises."""
    # site reads a venv's site-packages twice on some Pythons (3.11): the .pth line may run twice.
    if state.activation_seen:
        return
    state.activation_seen = True
    try:
        environ = os.environ
        verdict, raw = switch_value()
        if verdict == "invalid":
            os.write(
                2,
                f"starttrace: ignoring {raw}: use 1/true/on/yes or 0/false/off/no; tracing is off\n".encode(),
            )
            return
        if verdict == "off" or environ.get(ENV_INTERNAL) == "1" or environ.get(ENV_DISABLED):
            return
        if _light_case(environ, getattr(sys, "orig_argv", sys.argv)) and _activate_light():
            return
    except Exception as exc:
        if _writer is not None:  # the light case had begun its journal: no second activation on top
            _light_failed(exc)
            return
    try:
        _load_in_order(PYTHON_ACTIVATION).activate_in_python()
    except Exception as exc:
        os.write(2, f"starttrace: tracing is off: {type(exc).__name__}: {exc}\n".encode("utf-8", "replace"))


def _light_failed(exc: BaseException) -> None:
    """The light case failed half-way (a bug: nothing the program does gets here): said once, and
    this process and its children stay untraced."""
    global _writer
    _writer = None  # the C hook, if installed, passes every import through; the exit hooks end nothing
    message = f"tracing is off: {type(exc).__name__}: {exc}"
    os.environ[ENV_DISABLED] = message
    if state.is_root:
        os.write(2, f"starttrace: {message} (pid {os.getpid()})\n".encode("utf-8", "replace"))


def _activate_light() -> bool:
    """The common case; False where it could not start (boot's activation then starts again and
    says what failed, from a clean state)."""
    global _writer, process_span_id, _main_ident, plain_ident
    try:
        from starttrace.tracer import _hotpath  # type: ignore[attr-defined]
    except ImportError:
        return False
    _light["hotpath"] = _hotpath
    before = set(sys.modules)
    environ = os.environ
    now = monotonic_ns()
    state.exit_status = NO_STATUS
    state.activated = now
    state.anchor_mono, state.anchor_epoch = monotonic_ns(), time_ns()
    requested = environ.get(ENV_NEW_RUN_ID)
    try:
        if not inherit_run(environ):
            new_run(now, environ, _new_span_id(), None)
        parent_span, launch_pid, created = place_in_tree(environ, now)
        atexit = load_atexit()
        hide_footprint(before)
        state.instance_id = os.urandom(4).hex()
        base = os.path.join(state.run_dir, f"{os.getpid()}-{state.instance_id}")
        segment = _open_segment(_hotpath, segment_path(base, 0), FIRST_SEGMENT)
    except Exception:
        _undo(requested)
        return False
    _light.update(base=base, number=0, size=FIRST_SEGMENT)
    span_id = _new_span_id()
    process_span_id = span_id
    _main_ident = plain_ident = get_ident()
    _writer = segment
    lines = [process_record(parent_span, launch_pid, created, now, span_id, "c")]
    if state.is_root:
        lines.append(startup_begin_record())
    lines.append(_begin_line(span_id, "process", "process", parent_span or state.root_span, created))
    if state.method != "fork" and state.method != "forkserver":
        init_span = _new_span_id()
        lines.append(_begin_line(init_span, "python.init", "interpreter", span_id, created))
        lines.append('{"k":"e","s":"%s","t":%d}\n' % (init_span, now))
    lines.append(_attrs_line(identity_attrs(environ)))
    if state.method == "spawn" and is_multiprocessing_child():
        state.bootstrap_span = _new_span_id()
        lines.append(_begin_line(state.bootstrap_span, "process.bootstrap", "bootstrap", span_id, now))
    for line in lines:
        _write_light(line)
    if state.is_root:
        os.write(2, f"starttrace: tracing run {state.run_id} -> {state.run_dir}\n".encode("utf-8", "replace"))
        export_run_environment()
    atexit.register(at_exit)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    if not getattr(os.fork, "__starttrace__", False):
        os.fork = _make_fork_trampoline(os.fork)
    if not getattr(os._exit, "__starttrace__", False):
        os._exit = make_exit_wrapper(os._exit)
    if not getattr(sys.exit, "__starttrace__", False):
        sys.exit = make_sys_exit_wrapper(sys.exit)
    _install_import_hook(_hotpath)
    _write_light(_attrs_line({"starttrace.probes.installed": list(INSTALLED_AT_ACTIVATION)}))
    for name, targets in LAZY_PROBES.items():
        load = _lazy_probe(name)
        for target in targets:
            if target in sys.modules:  # imported before activation (a sitecustomize): loaded now
                _run_hook(load, sys.modules[target])
            else:
                _post_import_hooks.setdefault(target, []).append(load)
    untrack_own_modules(_hotpath)
    return True


def _open_segment(hotpath: Any, path: str, size: int) -> Any:
    """A new journal segment of `size` bytes, mapped by the C core (journal.py has the format)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)  # a full disk fails here, not as SIGBUS later
        return hotpath.map_segment(fd, size - SEGMENT_RESERVE)
    except BaseException:
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def _undo(requested: "str | None") -> None:
    """The light activation gives up before it wrote anything: back to the state it found."""
    if state.is_root and state.run_dir:
        remove_run_dir()
    if requested is not None:
        os.environ[ENV_NEW_RUN_ID] = requested
    for name in ("run_id", "run_dir", "trace_id", "root_span", "is_root", "job", "parent_of_root"):
        setattr(state, name, STATE_DEFAULTS[name])
    footprint.clear()


def _install_import_hook(hotpath: Any) -> None:
    import _frozen_importlib as bootstrap  # already loaded: the interpreter runs on it

    original = bootstrap._find_and_load
    if getattr(original, "__starttrace__", False):
        return
    _light["original"] = original
    hook = hotpath.ImportHook(
        original, __import__, _fallback, sys.modules, globals(), _end_slow, _end_failed, _end_record, _write_compact
    )
    _light["hook"] = hook
    bootstrap._find_and_load = hook


# What the C hook hands on (an import off its common path, a rare end): the import probe's own
# helpers, once `adopt` loaded them and gave them to the hook (`ImportHook.rebind`).


def _fallback(name: str, import_: Any) -> Any:
    if _taking_over == get_ident():  # starttrace's own modules, loading to take over: no span
        return _light["original"](name, import_)
    return _imports_probe()._python_wrapper(name, import_)


def _end_slow(*args: Any) -> Any:
    return _imports_probe()._end_slow(*args)


def pop_span(stacks: "dict[int, list[str]]", span_id: str) -> None:
    """Take an ending span off this thread's stack (the top, most of the time)."""
    stack = stacks.get(get_ident())
    if stack:
        if stack[-1] == span_id:
            stack.pop()
        elif span_id in stack:
            stack.remove(span_id)


def _end_failed(span_id: str, exc: BaseException) -> None:
    """The end of an import that raised (`sitecustomize`, looked for in every process, is one)."""
    if _python_recorder is not None:
        _imports_probe()._end_failed(span_id, exc)
        return
    pop_span(_stacks, span_id)
    error = quote(f"{type(exc).__name__}: {exc}")
    _write_light('{"k":"e","s":"%s","t":%d,"err":%s}\n' % (span_id, monotonic_ns(), error))


def _end_record(*args: Any) -> Any:
    return _imports_probe()._end_record(*args)


def _write_compact(line: str) -> None:
    """A record the C hook could not copy: the segment is full (or a name needs JSON escapes)."""
    if _python_recorder is None and _writer is not None:
        try:
            data = line.encode()
        except UnicodeEncodeError:
            data = b""  # lone surrogates: the import probe writes the equivalent JSON record
        if data and _next_segment(data):
            return
    _imports_probe()._write_compact(line)


def _imports_probe() -> Any:
    _adopt()
    return _light["imports"]


def _lazy_probe(name: str) -> Any:
    def load(module: Any) -> None:
        _adopt()[1].lazy_loader(name)(module)

    return load


def _run_hook(hook: Any, module: Any) -> None:
    try:
        hook(module)
    except Exception as exc:
        report(f"probe {getattr(hook, '__qualname__', hook)} failed: {type(exc).__name__}: {exc}")


def _make_fork_trampoline(real_fork: Any) -> Any:
    def fork() -> int:
        wrapper = _adopt()[1].import_unrecorded(FULL_ACTIVATION).make_fork_wrapper(real_fork)
        if os.fork is fork:
            os.fork = wrapper
        return wrapper()

    fork.__starttrace__ = True  # type: ignore[attr-defined]
    fork.__wrapped__ = real_fork  # type: ignore[attr-defined]
    return fork


def _after_fork_in_child() -> None:
    try:
        _adopt()[1].import_unrecorded(FULL_ACTIVATION).after_fork_in_child()
    except Exception:
        pass


# Modules loaded by name, as the probe loader loads probes: each of them imports this module.
FULL_ACTIVATION = "starttrace.tracer.boot"  # the whole activation in Python, and fork handling
PROBE_LOADER = "starttrace.tracer.probes"  # takes the light case over (`probes.take_over`)
# What each needs loaded first, in order: every module then finds the starttrace modules it
# imports in sys.modules, and all of them load through `load_own`
HAND_OVER = (
    "starttrace.tracer.journal",
    "starttrace.tracer.recorder",
    "starttrace.tracer.lifecycle",
    PROBE_LOADER,
    "starttrace.tracer.probes.imports",
)
PYTHON_ACTIVATION = (*HAND_OVER[:3], FULL_ACTIVATION)

_adopted: "tuple[Any, ...]" = ()
_adopt_lock: Any = None


def _load_in_order(names: "tuple[str, ...]") -> Any:
    """The modules `names` (by name: each imports this module), loaded in this order; the last."""
    for name in names:
        module = load_own(name)
    return module


# ---------------------------------------------------------------------------------------------
# starttrace's own modules, loaded from their bytecode cache without importlib's search: ~0.045 M
# instructions a module where importlib takes ~0.29 M (docs/benchmarks.md). They load in the traced
# program's time (its first import of torch loads eight), and they are not its imports.

OWN_PREFIX = "starttrace.tracer."
OWN_PACKAGES = frozenset({PROBE_LOADER})
_TRACER_DIR = os.path.dirname(__file__)
_PYC_HEADER = 16  # magic, flags (0: validated by the source's mtime and size), mtime, size
loaded_own: "list[str]" = []  # what load_own loaded from the cache, in order (tests read it)


def load_own(name: str, fallback: "Callable[[str], Any] | None" = None) -> Any:
    """starttrace's module `name` (under starttrace.tracer), loaded as importlib would load it
    (same spec, loader, attributes and bytecode), from its cache. Where that cannot be (no cache
    or a stale one, `-O`, a pycache prefix), importlib loads it: `fallback(name)`, else `__import__`."""
    module = sys.modules.get(name)
    if module is None:
        module = _load_cached(name)
        if module is None:
            (fallback or __import__)(name)
            module = sys.modules[name]
    return module


def _load_cached(name: str) -> Any:
    tag = sys.implementation.cache_tag
    if not name.startswith(OWN_PREFIX) or sys.flags.optimize or sys.pycache_prefix is not None or tag is None:
        return None
    parent, _, child = name.rpartition(".")
    if parent not in sys.modules:
        return None
    parts = name[len(OWN_PREFIX) :].split(".")
    folder = os.path.join(_TRACER_DIR, *parts[:-1])
    package = name in OWN_PACKAGES
    if package:
        folder = os.path.join(folder, parts[-1])
        stem = "__init__"
    else:
        stem = parts[-1]
    source = os.path.join(folder, stem + ".py")
    cached = os.path.join(folder, "__pycache__", f"{stem}.{tag}.pyc")
    external = sys.modules["_frozen_importlib_external"]
    try:
        source_stat = os.stat(source)
        fd = os.open(cached, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    except OSError:
        return None
    if (
        len(data) <= _PYC_HEADER
        or data[:4] != external.MAGIC_NUMBER
        or data[4:8] != b"\0\0\0\0"
        or int.from_bytes(data[8:12], "little") != int(source_stat.st_mtime) & 0xFFFFFFFF
        or int.from_bytes(data[12:16], "little") != source_stat.st_size & 0xFFFFFFFF
    ):
        return None
    import marshal  # builtin, loaded at interpreter start

    code = marshal.loads(memoryview(data)[_PYC_HEADER:])
    sys.modules["_imp"]._fix_co_filename(code, source)  # as importlib: the tree may have moved
    loader = external.SourceFileLoader(name, source)
    spec = sys.modules["_frozen_importlib"].ModuleSpec(name, loader, origin=source, is_package=package)
    spec.has_location = True
    spec.cached = cached
    module = type(sys)(name)
    module.__spec__ = spec
    module.__loader__ = loader
    module.__file__ = source
    module.__cached__ = cached
    if package:
        module.__path__ = spec.submodule_search_locations = [folder]
        module.__package__ = name
    else:
        module.__package__ = parent
    present = sys.modules.setdefault(name, module)
    if present is not module:  # another thread loads it: importlib would hand that one out too
        return present
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    module = sys.modules[name]
    setattr(sys.modules[parent], child, module)
    loaded_own.append(name)
    if untrack is not None:
        untrack(module)
    return module


untrack: "Callable[[Any], None] | None" = None  # the C core's untrack_module, where the process uses it


def untrack_own_modules(hotpath: Any) -> None:
    """starttrace's own modules leave the garbage collector's lists (the C core's `untrack_module`):
    those loaded so far now, the others as `load_own` loads them. They live as long as the process,
    yet each collection of their generation, and those at exit, would walk them."""
    global untrack
    untrack = getattr(hotpath, "untrack_module", None)
    if untrack is None:
        return
    from starttrace.tracer import activation  # (the packages above it hold a docstring each)

    untrack(activation)
    for name in loaded_own:
        untrack(sys.modules[name])


def _adopt() -> "tuple[Any, ...]":
    """(recorder, probes): the Python recorder, journal writer and probe loader take this process
    over from the light activation, with its writer, span stacks and hooks (once)."""
    global _adopted, _adopt_lock
    if _adopted:
        return _adopted
    if _adopt_lock is None:
        from _thread import RLock  # a builtin module

        _adopt_lock = RLock()
    with _adopt_lock:  # two threads may need it at once: one adopts, the other waits here
        if not _adopted:
            _adopted = _take_over()
    return _adopted


_taking_over = -1  # the thread loading the recorder and probes (`_take_over`), if one is


def _take_over() -> "tuple[Any, ...]":
    global _python_recorder, _writer, plain_ident, _taking_over
    segment = _writer
    if "hook" not in _light or segment is None:  # boot's activation, or none at all
        _load_in_order(HAND_OVER)
        probes = sys.modules[PROBE_LOADER]
        return (probes.recorder, probes)
    # Meanwhile the C hook hands every import to the fallback: this thread's (starttrace's own
    # modules) pass through unrecorded, every other thread's wait in _adopt, then are recorded.
    plain_ident = -1
    _taking_over = get_ident()
    try:
        _load_in_order(HAND_OVER)
        probes = sys.modules[PROBE_LOADER]
        recorder, _light["imports"] = probes.take_over(
            _light, segment, process_span_id, _main_ident, _stacks, pending, _post_import_hooks, _process_attrs
        )
    except BaseException:
        plain_ident = _main_ident
        raise
    finally:
        _taking_over = -1
    _python_recorder = recorder
    _writer = None
    return (recorder, probes)


def recorder_imported() -> None:
    """recorder.py ran: in a light process, a program that records spans of its own through the
    recorder imported it itself, and the recorder takes over at once (else it would write nothing).
    Not while a take-over loads it (in this thread, or another: that one takes over)."""
    if _writer is not None and _taking_over == -1 and _python_recorder is None and "hook" in _light:
        _adopt()


def python_recorder(recorder: Any) -> None:
    """boot's activation: the recorder writes this process's records from the start."""
    global _python_recorder
    _python_recorder = recorder
