"""torch elastic probe: one run per torchrun launch, agreed on in the rendezvous store (docs/multinode.md).

In `SimpleElasticAgent._assign_worker_ranks` (every agent, after each rendezvous round) group rank 0
sets `starttrace/run` = "<run id> <trace id>" on entry, the others read it on return, and each agent
adopts that run (journal moved into its folder, run.json, its workers' environment). A failure is
reported once and the node keeps its command line's run. Loaded in torchrun agents only.
"""

import os
import sys

from starttrace.tracer import launchers, lifecycle, recorder
from starttrace.tracer.journal import FORMAT_VERSION, encode, segment_path
from starttrace.tracer.lifecycle import state
from starttrace.tracer.probes._wrap import _mark, note, patch, publish_probe_list

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any
else:  # annotations are evaluated at run time (no __future__ import: it would load a module)
    Any = object
    Callable = object  # (annotations naming it are strings)

AGENT_MODULE = "torch.distributed.elastic.agent.server.api"
STORE_KEY = "starttrace/run"
FAST_PATH_WAIT_S = 10.0
MOVED_PREFIX = ".moved-"  # <first run folder>/.moved-<root span id>: the new folder (for the follower)
_HEX = frozenset("0123456789abcdef")


_settled = []  # non-empty: this agent's run is its launch's (it published or adopted it)


def install() -> None:
    recorder.when_imported(AGENT_MODULE, _patch_agent)


def _patch_agent(module: Any) -> None:
    agent = getattr(module, "SimpleElasticAgent", None)
    attached = agent is not None and patch(agent, "_assign_worker_ranks", _wrap_assign)
    note("torch.distributed.elastic.SimpleElasticAgent._assign_worker_ranks", attached)
    publish_probe_list()


def _wrap_assign(original: "Callable[..., Any]") -> "Callable[..., Any]":
    def _assign_worker_ranks(self: Any, *args: Any, **kwargs: Any) -> Any:
        if recorder._writer is None:
            return original(self, *args, **kwargs)
        store = args[0] if args else kwargs.get("store")
        group_rank = args[1] if len(args) > 1 else kwargs.get("group_rank")
        published = _publish(store) if group_rank == 0 else None
        result = original(self, *args, **kwargs)
        try:
            if published is not None:
                adopt(published[0], published[1], "c10d-store")
            elif isinstance(group_rank, int) and group_rank > 0 and _eligible():
                found = _published_run(store)
                if found is not None:
                    adopt(found[0], found[1], "c10d-store")
        except Exception as exc:
            recorder.report(f"torchrun run adoption failed: {type(exc).__name__}: {exc}", key="torchelastic-adopt")
        return result

    return _mark(_assign_worker_ranks, original)


def _eligible() -> bool:
    """A traced torchrun agent whose run its command line named (not an explicit, SLURM or
    `starttrace run` id), or that adopted its launch's run already."""
    if not state.is_root or recorder._writer is None:
        return False
    if _settled:
        return True
    job = state.job
    return job is not None and job.kind == "torchrun" and job.from_argv and state.run_id == job.run_id


def _publish(store: Any) -> "tuple[str, str] | None":
    """Group rank 0: the launch's run, set in the round's store (None: nothing published)."""
    try:
        if not _eligible():
            return None
        if _settled:
            run_id, trace_id = state.run_id, state.trace_id
        else:
            run_id, trace_id = "torchrun-" + os.urandom(6).hex(), os.urandom(16).hex()
        store.set(STORE_KEY, f"{run_id} {trace_id}")
        return run_id, trace_id
    except Exception as exc:
        recorder.report(
            f"cannot publish the run id in the torchrun rendezvous store ({type(exc).__name__}: {exc}); the nodes"
            " keep the run their command line names",
            key="torchelastic-publish",
        )
        return None


def _published_run(store: Any) -> "tuple[str, str] | None":
    """Another agent: the run group rank 0 published for this round (None: reported)."""
    try:
        if not store.check([STORE_KEY]):
            if os.environ.get("TORCH_ELASTIC_WORKER_IDENTICAL", "0") != "1":
                raise LookupError("the group-rank-0 agent published no run id (is it traced?)")
            from datetime import timedelta  # loaded by torch.distributed already

            store.wait([STORE_KEY], timedelta(seconds=FAST_PATH_WAIT_S))
        value = store.get(STORE_KEY)
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
        run_id, _, trace_id = text.strip().partition(" ")
        if not launchers.clean_run_id(run_id) or len(trace_id) != 32 or not set(trace_id) <= _HEX:
            raise ValueError(f"unusable value {text[:120]!r} under {STORE_KEY}")
        return run_id, trace_id
    except Exception as exc:
        recorder.report(
            f"torchrun rendezvous: {type(exc).__name__}: {exc}; this node keeps run {state.run_id}",
            key="torchelastic-join",
        )
        return None


def adopt(run_id: str, trace_id: str, how: str) -> bool:
    """Make this root process's run `run_id` (with `trace_id`): move its journal into that run's
    folder and export the run to the environment its children inherit. False: nothing changed."""
    if state.run_id == run_id and state.trace_id == trace_id:
        _settled.append(True)
        return False
    first_id, first_dir = state.run_id, state.run_dir
    new_dir = os.path.join(os.path.dirname(first_dir), run_id)
    os.makedirs(new_dir, exist_ok=True)
    marker = os.path.join(first_dir, MOVED_PREFIX + state.root_span)
    follower = lifecycle.auto_export_endpoint() is not None
    if follower:
        _write_file(marker, new_dir + "\n")
    try:
        _move_journal(recorder._writer, os.path.join(new_dir, os.path.basename(recorder._writer.base)))
    except OSError:
        if follower:
            os.unlink(marker)
        raise
    # moved: from here on nothing may stop halfway (the workers must follow the journal)
    state.run_id, state.run_dir, state.trace_id = run_id, new_dir, trace_id
    lifecycle.export_run_environment()
    _settled.append(True)
    recorder.set_process_attrs({"starttrace.job.adopted": how, "starttrace.job.first_run_id": first_id})
    try:
        _write_file(os.path.join(new_dir, "run.json"), encode(_run_meta()) + "\n")
    except OSError as exc:
        recorder.report(f"cannot write {new_dir}/run.json: {exc}", key="torchelastic-run-json")
    _remove_if_unused(first_dir)
    os.write(2, f"starttrace: tracing run {run_id} -> {new_dir} (this launch's; was {first_id})\n".encode())
    return True


def _move_journal(writer: Any, new_base: str) -> None:
    """Rename every segment written so far to `new_base`; the next ones are created there."""
    with writer._lock:  # no segment is opened meanwhile (JournalWriter.overflow takes the lock)
        moved: list[tuple[str, str]] = []
        try:
            for number in range(writer.number + 1):
                pair = (segment_path(writer.base, number), segment_path(new_base, number))
                os.rename(*pair)
                moved.append(pair)
        except OSError:
            for old, new in reversed(moved):
                try:
                    os.rename(new, old)
                except OSError:
                    pass
            raise
        writer.base = new_base


def _run_meta() -> "dict[str, Any]":
    """The run.json a root writes (boot._create_run), for the adopted run."""
    return {
        "v": FORMAT_VERSION,
        "run_id": state.run_id,
        "trace_id": state.trace_id,
        "root_span_id": state.root_span,
        "parent_span_id": state.parent_of_root,
        "argv": list(getattr(sys, "orig_argv", sys.argv)),
        "cwd": os.getcwd(),
        "host": os.uname().nodename,
        "created_epoch_ns": state.anchor_epoch,
        "service": lifecycle.service_name(),
    }


def _write_file(path: str, text: str) -> None:
    """Written whole or not at all (a reader may look at any moment; the nodes of a shared folder
    may write the same file at once, and their pids repeat: the temporary name is random)."""
    temporary = f"{path}.{os.urandom(4).hex()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)


def _remove_if_unused(run_dir: str) -> None:
    """The first folder, once no journal is left in it (other nodes on a shared filesystem may
    still be moving theirs: the last one removes it; a follower's marker keeps it until read)."""
    try:
        names = os.listdir(run_dir)
        if any(n.endswith(".journal") or n.endswith(".jsonl") for n in names):
            return
        if "run.json" in names:
            os.unlink(os.path.join(run_dir, "run.json"))
        os.rmdir(run_dir)
    except OSError:
        pass
