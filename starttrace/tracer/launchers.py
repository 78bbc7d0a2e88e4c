"""One run per job: the run id and trace id every node of a multi-node job derives on its own
(docs/multinode.md).

Called by `boot` when a root process creates its run (hot path: imports nothing; the hash is pure
Python). Where a launcher gives all nodes of one job a shared key, every node's root derives the
same run id and trace id from it, so the nodes' journals, spans and vLLM's own traces join. In order:

1. explicit: `STARTTRACE_RUN_ID` (or `VLLM_STARTTRACE_RUN_ID`, the name vLLM copies to Ray workers)
   set by the user, the same on every node; else an incoming W3C `TRACEPARENT`;
2. SLURM: `SLURM_JOB_ID` + `SLURM_STEP_ID` (+ `SLURM_RESTART_COUNT`) of a step with several tasks;
3. a torchrun worker that is its own root (its agent is not traced): `TORCHELASTIC_RUN_ID` (when not
   "none") + `MASTER_ADDR:MASTER_PORT` + `TORCHELASTIC_RESTART_COUNT`;
4. the command line: torchrun (`--nnodes` > 1 with `--rdzv-id`/`--rdzv-endpoint`, or the static
   `--master-addr/--master-port`: the agents then move into their launch's own run, agreed on in
   the rendezvous store, `probes/torchelastic.py`), `vllm serve --nnodes N --master-addr A --master-port P`
   (`--headless` nodes included) or its data-parallel form (`--data-parallel-address`,
   `--data-parallel-rpc-port`), SGLang `--dist-init-addr A --nnodes N`.

Each root records its rendezvous endpoint, node count and node rank (`starttrace.job.*`): the
service groups per-node runs that found no shared key by them.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any
else:  # annotations are evaluated at run time (no __future__ import: it would load a module)
    Any = object
    Mapping = Sequence = dict

_MASK128 = (1 << 128) - 1
_FNV128_OFFSET = 0x6C62272E07BB014262B821756295C58D
_FNV128_PRIME = 0x0000000001000000000000000000013B
_RUN_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
MAX_RUN_ID = 80

TOOL_MODULES = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
    "vllm.entrypoints.openai.api_server": "vllm",
    "vllm.entrypoints.cli.main": "vllm",
    "vllm.entrypoints.launchers.api_server.entry": "vllm",
    "sglang.launch_server": "sglang",
}
VLLM_DEFAULT_PORT = "29501"  # vllm/config/parallel.py


def fnv1a_128(text: str) -> int:
    """FNV-1a, 128 bits: a stable hash of `text` (the same on every node and Python version)."""
    h = _FNV128_OFFSET
    for byte in text.encode("utf-8", "replace"):
        h = ((h ^ byte) * _FNV128_PRIME) & _MASK128
    return h


class Job:
    """The shared identity of one job: what its run is called, wherever a node starts."""

    __slots__ = ("from_argv", "key", "kind", "nnodes", "node_rank", "rendezvous", "run_id", "trace_id")

    def __init__(
        self,
        kind: str,
        key: str,
        run_id: str = "",
        trace_id: str = "",
        rendezvous: str = "",
        nnodes: int | None = None,
        node_rank: int | None = None,
    ) -> None:
        self.kind = kind
        self.key = key
        digest = fnv1a_128(kind + "\x00" + key)
        self.trace_id = trace_id or ("%032x" % (digest or 1))
        self.run_id = run_id or f"{kind}-{digest >> 80:012x}"
        self.rendezvous = rendezvous
        self.nnodes = nnodes
        self.node_rank = node_rank
        # keyed by a command line alone: a relaunch of the same command derives the same ids (the
        # torch elastic probe then agrees on a launch's own run through the rendezvous store)
        self.from_argv = False

    def attrs(self) -> dict[str, Any]:
        """Resource attributes of the node's root process."""
        out: dict[str, Any] = {"starttrace.job.kind": self.kind, "starttrace.job.key": self.key}
        if self.rendezvous:
            out["starttrace.job.rendezvous"] = self.rendezvous
        if self.nnodes is not None:
            out["starttrace.job.nnodes"] = self.nnodes
        if self.node_rank is not None:
            out["starttrace.job.node_rank"] = self.node_rank
        return out


def identify(environ: Mapping[str, str], argv: Sequence[str], incoming_trace: str = "") -> Job | None:
    """The job a new root process belongs to, or None (a run of its own, as on one host); boot
    keeps it in `lifecycle.state.job`.

    `incoming_trace`: the trace id of a valid incoming TRACEPARENT (boot parses it)."""
    explicit = environ.get("STARTTRACE_RUN_ID") or environ.get("VLLM_STARTTRACE_RUN_ID") or ""
    if explicit:
        run_id = clean_run_id(explicit)
        if run_id:
            return Job("explicit", run_id, run_id=run_id, trace_id=incoming_trace)
    if incoming_trace:
        return Job("traceparent", incoming_trace, run_id=f"trace-{incoming_trace[:16]}", trace_id=incoming_trace)
    return _slurm(environ) or _torchrun_worker(environ) or from_argv(argv)


def clean_run_id(value: str) -> str:
    """A user-given run id as a folder name: [A-Za-z0-9._-], at most MAX_RUN_ID characters; "" when
    unusable."""
    value = value.strip()
    if not value or len(value) > MAX_RUN_ID or value in (".", "..") or not set(value) <= _RUN_ID_CHARS:
        return ""
    return value


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _slurm(environ: Mapping[str, str]) -> Job | None:
    job = environ.get("SLURM_JOB_ID", "")
    step = environ.get("SLURM_STEP_ID", "")
    if not job or not step:
        return None  # the batch script itself, or an allocation's shell: not one job step
    tasks = _int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS")) or 1
    nodes = _int(environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES")) or 1
    if tasks < 2 and nodes < 2:
        return None  # `srun --pty bash`: every command in it would join one run
    restart = environ.get("SLURM_RESTART_COUNT", "0")
    return Job(
        "slurm",
        f"{job}.{step}.{restart}",
        rendezvous=f"slurm:{job}.{step}",
        nnodes=nodes,
        node_rank=_int(environ.get("SLURM_NODEID")),
    )


def _torchrun_worker(environ: Mapping[str, str]) -> Job | None:
    run = environ.get("TORCHELASTIC_RUN_ID", "")
    addr, port = environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", "")
    if not run or run == "none" or not addr or not port:
        return None
    restart = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    groups = _int(environ.get("GROUP_WORLD_SIZE"))
    return Job(
        "torchrun",
        f"{run}@{addr}:{port}#{restart}",
        rendezvous=f"{addr}:{port}",
        nnodes=groups,
        node_rank=_int(environ.get("GROUP_RANK")),
    )


# ------------------------------------------------------------------------------------------------
# command lines


def command_of(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(tool, its arguments) of an interpreter command line: ("torchrun", [...]) for
    `python .../torchrun ...` or `python -m torch.distributed.run ...`; ("", []) otherwise."""
    args = list(argv[1:])
    i = 0
    while i < len(args):  # interpreter options before the script or -m
        arg = args[i]
        if arg == "-m" and i + 1 < len(args):
            return TOOL_MODULES.get(args[i + 1], ""), args[i + 2 :]
        if arg in ("-c",):
            return "", []
        if arg in ("-X", "-W") and i + 1 < len(args):
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        name = arg.replace("\\", "/").rsplit("/", 1)[-1]
        if name.endswith(".py"):
            name = name[:-3]
        return (name if name in _JOB_OF_TOOL else ""), args[i + 1 :]
    return "", []


def option(args: Sequence[str], *names: str) -> str | None:
    """The value of the last `--name value` / `--name=value` among `names` (dashes and
    underscores are the same), or None."""
    wanted = {n.replace("_", "-") for n in names}
    found = None
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        name, eq, value = arg.partition("=")
        if name.replace("_", "-") not in wanted:
            continue
        if eq:
            found = value
        elif i + 1 < len(args):
            found = args[i + 1]
    return found


def flag(args: Sequence[str], *names: str) -> bool:
    wanted = {n.replace("_", "-") for n in names}
    return any(a.partition("=")[0].replace("_", "-") in wanted for a in args if a.startswith("-"))


def _max_nodes(value: str | None) -> int | None:
    """--nnodes N or MIN:MAX (torchrun's elastic form): the largest node count."""
    if not value:
        return None
    return _int(value.rpartition(":")[2].strip())


def from_argv(argv: Sequence[str]) -> Job | None:
    tool, args = command_of(argv)
    job = _JOB_OF_TOOL[tool](args) if tool else None
    if job is not None:
        job.from_argv = True
    return job


def _torchrun_agent(args: list[str]) -> Job | None:
    nnodes = _max_nodes(option(args, "--nnodes"))
    if nnodes is None or nnodes < 2 or flag(args, "--standalone"):
        return None
    rdzv_id = option(args, "--rdzv-id", "--rdzv_id") or "none"
    endpoint = option(args, "--rdzv-endpoint", "--rdzv_endpoint") or ""
    if not endpoint:
        addr = option(args, "--master-addr", "--master_addr") or "127.0.0.1"
        endpoint = f"{addr}:{option(args, '--master-port', '--master_port') or '29500'}"
    return Job(
        "torchrun",
        f"{rdzv_id}@{endpoint}/{nnodes}",
        rendezvous=endpoint,
        nnodes=nnodes,
        node_rank=_int(option(args, "--node-rank", "--node_rank")),
    )


def _vllm(args: list[str]) -> Job | None:
    dp_address = option(args, "--data-parallel-address", "-dpa")
    if dp_address:
        port = option(args, "--data-parallel-rpc-port", "-dpp") or "default"
        size = option(args, "--data-parallel-size", "-dp") or "1"
        endpoint = f"{dp_address}:{port}"
        return Job("vllm-dp", f"{endpoint}/{size}", rendezvous=endpoint, nnodes=_int(option(args, "--nnodes", "-n")))
    nnodes = _int(option(args, "--nnodes", "-n"))
    if nnodes is None or nnodes < 2:
        return None
    addr = option(args, "--master-addr") or "127.0.0.1"
    endpoint = f"{addr}:{option(args, '--master-port') or VLLM_DEFAULT_PORT}"
    return Job(
        "vllm",
        f"{endpoint}/{nnodes}",
        rendezvous=endpoint,
        nnodes=nnodes,
        node_rank=_int(option(args, "--node-rank", "-r")) or 0,
    )


def _sglang(args: list[str]) -> Job | None:
    addr = option(args, "--dist-init-addr", "--nccl-init-addr")
    nnodes = _int(option(args, "--nnodes"))
    if not addr or nnodes is None or nnodes < 2:
        return None
    return Job(
        "sglang", f"{addr}/{nnodes}", rendezvous=addr, nnodes=nnodes, node_rank=_int(option(args, "--node-rank"))
    )


_JOB_OF_TOOL = {"torchrun": _torchrun_agent, "vllm": _vllm, "sglang": _sglang}
