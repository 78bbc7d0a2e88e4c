"""examples/forkserver_ranks.py, traced: two nested forkservers, four ranks, real gloo process group.

Two real runs (module-scoped): the CUDA-clean tree, and the `--cuda-in-preload` tree whose worker
forkserver preloads a module that initialises CUDA. Needs torch (skipped with the reason if the
venv has none).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from run_spans import children, named, spans_of

from starttrace.sources.journal_reader import Process, Run, Span, read_run

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "forkserver_ranks.py"
# the project's venv interpreter (starttrace installed with its .pth), as tests/conftest.py picks it
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
RANKS = 4
API_PRELOAD = ["forkserver_ranks", "json"]
WORKER_PRELOAD = ["forkserver_ranks", "socket"]

HAVE_TORCH = importlib.util.find_spec("torch") is not None
CUDA = False
if HAVE_TORCH:
    import torch

    CUDA = bool(torch.cuda.is_available())

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="examples/forkserver_ranks.py needs torch in the venv")


@dataclass
class Traced:
    run: Run
    stdout: str
    seconds: float


def _run_example(clean_env: Callable[..., dict[str, str]], tmp: Path, *args: str) -> Traced:
    import time

    root = tmp / "runs"
    env = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(root))
    start = time.monotonic()
    done = subprocess.run(
        [PYTHON, str(EXAMPLE), "--ranks", str(RANKS), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.monotonic() - start
    assert done.returncode == 0, f"example failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}"
    runs = [p for p in root.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return Traced(read_run(runs[0]), done.stdout, seconds)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, clean_env: Callable[..., dict[str, str]]) -> Traced:
    return _run_example(clean_env, tmp_path_factory.mktemp("clean"))


@pytest.fixture(scope="module")
def dirty(tmp_path_factory: pytest.TempPathFactory, clean_env: Callable[..., dict[str, str]]) -> Traced:
    return _run_example(clean_env, tmp_path_factory.mktemp("dirty"), "--cuda-in-preload")


def forkservers(run: Run) -> dict[str, Process]:
    """The two forkservers by their preload list: 'api' and 'workers'."""
    found: dict[str, Process] = {}
    for process in run.processes:
        if process.role != "forkserver":
            continue
        (preload,) = named(run, process, "forkserver.preload")
        modules = preload.attrs["starttrace.preload"]
        if modules == API_PRELOAD:
            found["api"] = process
        elif modules[: len(WORKER_PRELOAD)] == WORKER_PRELOAD:
            found["workers"] = process
    assert sorted(found) == ["api", "workers"], [(p.pid, p.role) for p in run.processes]
    return found


def ranks(run: Run) -> dict[int, Process]:
    lanes = [p for p in run.processes if p.role == "worker"]
    by_rank = {p.rank: p for p in lanes}
    assert sorted(by_rank, key=lambda r: -1 if r is None else r) == list(range(RANKS)), [
        (p.pid, p.role, p.rank) for p in run.processes
    ]
    assert len(lanes) == RANKS
    return by_rank  # type: ignore[return-value]


def test_runs_fast_and_correctly(clean: Traced) -> None:
    assert "forkserver_ranks: ok" in clean.stdout
    assert clean.seconds < 60
    assert not clean.run.problems


def test_preload_has_one_child_span_per_module(clean: Traced) -> None:
    run = clean.run
    for kind, expected in (("api", API_PRELOAD), ("workers", WORKER_PRELOAD)):
        server = forkservers(run)[kind]
        (preload,) = named(run, server, "forkserver.preload")
        assert preload.error is None and preload.end_ns is not None
        kids = sorted(children(run, server, preload), key=lambda s: s.start_ns)
        assert [s.attrs.get("starttrace.import.module") for s in kids] == expected
        assert all(s.start_ns >= preload.start_ns and s.end_ns <= preload.end_ns for s in kids)  # type: ignore[operator]


def test_one_fork_per_rank_and_ranks_on_their_lanes(clean: Traced) -> None:
    run = clean.run
    workers = forkservers(run)["workers"]
    by_rank = ranks(run)
    forks = named(run, workers, "process.fork")
    assert sorted(s.attrs["starttrace.child_pid"] for s in forks) == sorted(p.pid for p in by_rank.values())
    fork_by_child = {s.attrs["starttrace.child_pid"]: s for s in forks}
    for rank, lane in by_rank.items():
        assert lane.ppid == workers.pid
        assert lane.resource.get("starttrace.start_method") == "forkserver"
        assert lane.resource.get("starttrace.world_size") == RANKS
        # the lane hangs under the fork that made it, and its target is the rank it reports
        own = run.process_span(lane)
        assert own is not None and own.parent_id == fork_by_child[lane.pid].span_id
        (bootstrap,) = named(run, lane, "process.bootstrap")
        assert bootstrap.attrs.get("starttrace.process_name") == f"rank-{rank}"
        # torch was imported after the fork, in the rank (the forkservers never imported it)
        assert named(run, lane, "import torch")
    for server in forkservers(run).values():
        assert not named(run, server, "import torch")


def test_dist_init_in_every_rank(clean: Traced) -> None:
    run = clean.run
    for rank, lane in ranks(run).items():
        (init,) = named(run, lane, "dist.init")
        assert init.error is None and init.end_ns is not None and init.end_ns > init.start_ns
        assert init.attrs["starttrace.phase"] == "dist_init"
        assert init.attrs["starttrace.dist.backend"] == "gloo"
        assert init.attrs["starttrace.dist.rank"] == rank
        assert init.attrs["starttrace.dist.world_size"] == RANKS
        assert init.attrs["starttrace.dist.init_method"].startswith("tcp://127.0.0.1:")
        assert "torch.distributed.init_process_group" in lane.resource["starttrace.probes"]


def test_cuda_init_recorded_in_every_rank(clean: Traced) -> None:
    run = clean.run
    for lane in ranks(run).values():
        (init,) = named(run, lane, "cuda.init")
        assert init.attrs["starttrace.phase"] == "cuda_init"
        assert "forkserver_ranks.py" in init.attrs["starttrace.cuda.trigger"]
        if CUDA:
            assert init.error is None
            assert init.attrs["starttrace.cuda.device_count"] >= 1
        else:
            assert init.error is not None and "not compiled with CUDA" in init.error
        assert lane.resource.get("starttrace.cuda_init_attempted") is True


def test_clean_tree_passes_the_audit(clean: Traced) -> None:
    run = clean.run
    for process in run.processes:
        assert not process.resource.get("starttrace.cuda_before_fork"), process.label
        assert not any(s.attrs.get("starttrace.cuda_before_fork") for s in spans_of(run, process)), process.label
    for server in forkservers(run).values():
        assert not named(run, server, "cuda.init")


def test_cuda_in_preload_is_flagged(dirty: Traced) -> None:
    run = dirty.run
    servers = forkservers(run)
    workers = servers["workers"]
    assert workers.resource.get("starttrace.cuda_before_fork") is True
    (preload,) = named(run, workers, "forkserver.preload")
    assert preload.attrs["starttrace.preload"] == [*WORKER_PRELOAD, "cuda_preload"]
    # the import chain that triggered CUDA init: preload cuda_preload -> cuda.init
    (init,) = named(run, workers, "cuda.init")
    by_id = {s.span_id: s for s in spans_of(run, workers)}
    chain = []
    span: Span | None = init
    while span is not None:
        chain.append(span.name)
        span = by_id.get(span.parent_id or "")
    assert "preload cuda_preload" in chain and "forkserver.preload" in chain, chain
    forks = named(run, workers, "process.fork")
    assert len(forks) == RANKS and all(s.attrs.get("starttrace.cuda_before_fork") is True for s in forks)
    # the api forkserver stayed clean
    assert not servers["api"].resource.get("starttrace.cuda_before_fork")
    # the ranks still ran
    assert "forkserver_ranks: ok" in dirty.stdout
    ranks(run)
