"""Python 3.14's default start method, forkserver, for a program that never names one, traced.

On Linux, 3.14 starts every `multiprocessing.Process` of a program that names no start method
from a forkserver (gh-84559), and that forkserver's default preload, ['__main__'], now really
imports the program's main script (gh-126631). On 3.11-3.13 the tests run the program with
tests/integration/py314_default/ on PYTHONPATH: its sitecustomize makes the same two changes when
multiprocessing is first imported (see its docstring), so the program itself names nothing. On
3.14 and later the folder does nothing and the interpreter's own default is tested.

The program: the root (which imports `heavy_setup`, 0.15 s, at its top) starts two ranks; each
imports RANK_MODULES after its fork, rank 0 starts a `leaf` process of its own (again without a
start method: a forkserver child starts a forkserver of its own). A second mode starts the
forkserver the way servers warm it up (`forkserver.ensure_running()` when the default is
forkserver) and forks nothing: the `unused_forkserver` finding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from run_spans import children, named, span_index, spans_of

from starttrace.sources.journal_files import journal_files, journal_lines
from starttrace.sources.journal_reader import Process, Run, Span

HERE = Path(__file__).resolve().parent
PY314_DEFAULT = HERE / "py314_default"
RANK_MODULES = ("decimal", "difflib", "tomllib", "email.mime.multipart", "http.server", "xml.dom.minidom")
HEAVY_S = 0.15

HEAVY_SETUP = f"""\
import sys, time
time.sleep({HEAVY_S})  # a costly import at the program's top (torch, in real servers)
sys.stdout.write("heavy_setup loaded\\n")  # buffered (stdout is a pipe): who flushes it, and how often?
"""

PROGRAM = f'''\
"""A program that names no start method."""
import json, multiprocessing, os, sys

import heavy_setup  # noqa: F401

RANK_MODULES = {RANK_MODULES!r}


def leaf(conn):
    conn.send(os.getpid())
    conn.close()


def put_pid(queue):
    queue.put(os.getpid())


def rank(r, conn):
    before = sorted(sys.modules)
    for name in RANK_MODULES:
        __import__(name)
    after = sorted(sys.modules)
    leaf_pid = None
    if r == 0:  # a process of its own, again without a start method
        mine, its = multiprocessing.Pipe()
        child = multiprocessing.Process(target=leaf, args=(its,), name="leaf")
        child.start()
        leaf_pid = mine.recv()
        child.join()
    conn.send({{"rank": r, "pid": os.getpid(), "before": before, "after": after, "leaf": leaf_pid}})
    conn.close()


def main():
    out = {{"before": multiprocessing.get_start_method(allow_none=True)}}
    if sys.argv[1] == "ranks":
        ends, procs = [], []
        for r in range(2):
            mine, its = multiprocessing.Pipe()
            proc = multiprocessing.Process(target=rank, args=(r, its), name=f"rank-{{r}}")
            proc.start()
            ends.append(mine)
            procs.append(proc)
        out["ranks"] = [end.recv() for end in ends]
        for proc in procs:
            proc.join()
        out["exitcodes"] = [proc.exitcode for proc in procs]
    elif sys.argv[1] == "queue":  # a Queue first: its lock registers with the resource tracker, starting it
        queue = multiprocessing.Queue()
        proc = multiprocessing.Process(target=put_pid, args=(queue,), name="queue-child")
        proc.start()
        out["child"] = queue.get(timeout=60)
        proc.join()
    elif multiprocessing.get_start_method() == "forkserver":  # warm it up, as servers do
        from multiprocessing import forkserver

        forkserver.ensure_running()
    from multiprocessing import forkserver

    out["method"] = multiprocessing.get_start_method()
    out["forkserver"] = forkserver._forkserver._forkserver_pid
    out["root"] = os.getpid()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
'''


@dataclass
class Traced:
    run: Run
    out: dict[str, Any]
    stdout: str
    app: Path


def _program(base: Path) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    (base / "heavy_setup.py").write_text(HEAVY_SETUP)
    app = base / "app.py"
    app.write_text(textwrap.dedent(PROGRAM))
    return app


def _env(clean_env: Callable[..., dict[str, str]], **extra: str) -> dict[str, str]:
    env = clean_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PY314_DEFAULT), env.get("PYTHONPATH", "")) if p)
    return env


def _run(app: Path, mode: str, env: dict[str, str]) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, str(app), mode], cwd=app.parent, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{mode}: {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("{")]
    return json.loads(line), done.stdout


def _traced(
    base: Path, mode: str, clean_env: Callable[..., dict[str, str]], only_run_dir: Callable[[Path], Path]
) -> Traced:
    from st_service_helpers import wait_final

    app = _program(base)
    env = _env(clean_env, STARTTRACE="1", STARTTRACE_DIR=str(base / "runs"))
    out, stdout = _run(app, mode, env)
    run = wait_final(only_run_dir(base / "runs"), timeout=60, environ=env)
    return Traced(run, out, stdout, app)


@pytest.fixture(scope="module")
def ranks(
    tmp_path_factory: pytest.TempPathFactory,
    clean_env: Callable[..., dict[str, str]],
    only_run_dir: Callable[[Path], Path],
) -> Traced:
    return _traced(tmp_path_factory.mktemp("ranks"), "ranks", clean_env, only_run_dir)


@pytest.fixture(scope="module")
def prewarm(
    tmp_path_factory: pytest.TempPathFactory,
    clean_env: Callable[..., dict[str, str]],
    only_run_dir: Callable[[Path], Path],
) -> Traced:
    return _traced(tmp_path_factory.mktemp("prewarm"), "prewarm", clean_env, only_run_dir)


@pytest.fixture(scope="module")
def queue(
    tmp_path_factory: pytest.TempPathFactory,
    clean_env: Callable[..., dict[str, str]],
    only_run_dir: Callable[[Path], Path],
) -> Traced:
    return _traced(tmp_path_factory.mktemp("queue"), "queue", clean_env, only_run_dir)


def by_pid(run: Run, pid: int) -> Process:
    (process,) = [p for p in run.processes if p.pid == pid]
    return process


def ancestors(run: Run, process: Process, span: Span) -> list[str]:
    by_id = {s.span_id: s for s in spans_of(run, process)}
    names = []
    parent = by_id.get(span.parent_id or "")
    while parent is not None:
        names.append(parent.name)
        parent = by_id.get(parent.parent_id or "")
    return names


def test_the_program_names_no_method_and_gets_the_forkserver(ranks: Traced) -> None:
    out = ranks.out
    assert out["before"] is None  # nothing chose a start method before the first Process.start()
    assert out["method"] == "forkserver"
    assert out["exitcodes"] == [0, 0]
    run = ranks.run
    assert not run.problems
    rank_pids = [r["pid"] for r in out["ranks"]]
    leaf_pid = out["ranks"][0]["leaf"]
    servers = [p for p in run.processes if p.role == "forkserver"]
    assert len(servers) == 2, [(p.pid, p.role) for p in run.processes]  # the root's and rank 0's
    for pid in [out["root"], *rank_pids, leaf_pid]:
        by_pid(run, pid)
    assert {by_pid(run, pid).resource["starttrace.start_method"] for pid in [*rank_pids, leaf_pid]} == {"forkserver"}


def test_launch_spans_say_forkserver_from_their_begin(ranks: Traced) -> None:
    """The method is known when the launch begins (an open launch of a hung start says it), though the
    program asked for none: the default, read without choosing it."""
    run = ranks.run
    root = by_pid(run, ranks.out["root"])
    launches = {s.attrs["starttrace.process_name"]: s for s in named(run, root, "process.launch")}
    assert {"rank-0", "rank-1"} <= set(launches)
    for r in ranks.out["ranks"]:
        launch = launches[f"rank-{r['rank']}"]
        assert launch.attrs["starttrace.start_method"] == "forkserver"
        assert launch.attrs["starttrace.child_pid"] == r["pid"]
    assert root.journal_path is not None
    begins = []
    for journal in journal_files(root.journal_path.parent):
        for line in journal_lines(journal):
            if line.startswith(b'{"k":"b"') and b'"n":"process.launch"' in line:
                record = json.loads(line)
                if record["s"] in {launches["rank-0"].span_id, launches["rank-1"].span_id}:
                    begins.append(record["a"]["starttrace.start_method"])
    assert begins == ["forkserver", "forkserver"]


def test_forkserver_start_and_its_preload_of_main(ranks: Traced) -> None:
    run = ranks.run
    spans = span_index(run)
    root = by_pid(run, ranks.out["root"])
    server = by_pid(run, ranks.out["forkserver"])
    assert server.role == "forkserver"
    (start,) = named(run, root, "forkserver.start")
    assert start.attrs["starttrace.preload"] == ["__main__"]  # multiprocessing's default preload
    assert start.attrs["starttrace.child_pid"] == server.pid
    assert spans[start.parent_id or ""][1].name == "process.launch"  # started by the first Process.start()
    server_span = run.process_span(server)
    assert server_span is not None and server_span.parent_id == start.span_id

    (preload,) = named(run, server, "forkserver.preload")
    assert preload.end_ns is not None and preload.error is None
    assert preload.attrs["starttrace.preload"] == ["__main__"]
    assert preload.attrs.get("starttrace.preload_failed") == []
    kids = children(run, server, preload)
    assert [s.name for s in kids] == ["preload __main__"]  # one span per preloaded module
    (main,) = kids
    assert main.attrs["starttrace.import.module"] == "__main__"
    assert main.attrs["code.file.path"] == str(ranks.app)
    (heavy,) = named(run, server, "import heavy_setup")
    assert "preload __main__" in ancestors(run, server, heavy)
    assert heavy.end_ns is not None and (heavy.end_ns - heavy.start_ns) / 1e9 >= HEAVY_S * 0.9


def test_ranks_are_forked_by_the_forkserver_and_linked_to_their_launch(ranks: Traced) -> None:
    run = ranks.run
    spans = span_index(run)
    root = by_pid(run, ranks.out["root"])
    server = by_pid(run, ranks.out["forkserver"])
    forks = {s.attrs["starttrace.child_pid"]: s for s in named(run, server, "process.fork")}
    rank_pids = [r["pid"] for r in ranks.out["ranks"]]
    assert sorted(forks) == sorted(rank_pids)
    for pid in rank_pids:
        lane = by_pid(run, pid)
        assert lane.ppid == server.pid and lane.role == "child"
        own = run.process_span(lane)
        assert own is not None and own.parent_id == forks[pid].span_id
        owner, launch = spans[str(own.attrs.get("starttrace.launched_by"))]
        assert owner is root and launch.name == "process.launch" and launch.attrs["starttrace.child_pid"] == pid
        (bootstrap,) = named(run, lane, "process.bootstrap")
        assert bootstrap.end_ns is not None and bootstrap.attrs.get("starttrace.process_name", "").startswith("rank-")
        first = min(s.start_ns for s in named(run, lane, f"import {RANK_MODULES[0]}"))
        assert first >= bootstrap.end_ns
        assert not named(run, lane, "python.init")  # forked: no interpreter start of its own
        assert not named(run, lane, "import heavy_setup")  # the preloaded __main__ had it


def test_each_rank_recorded_what_its_sys_modules_gained(ranks: Traced) -> None:
    """Ground truth: the modules a rank's target added to sys.modules are its import spans after
    the bootstrap, no more (phantom) and no fewer (missing); and it inherited the preloaded ones."""
    run = ranks.run
    for r in ranks.out["ranks"]:
        lane = by_pid(run, r["pid"])
        assert "heavy_setup" in r["before"] and "__mp_main__" in r["before"]
        gained = {m for m in set(r["after"]) - set(r["before"]) if not m.startswith("starttrace")}
        assert set(RANK_MODULES) <= gained
        (bootstrap,) = named(run, lane, "process.bootstrap")
        assert bootstrap.end_ns is not None
        lane_spans = spans_of(run, lane)
        recorded = {
            s.attrs["starttrace.import.module"]
            for s in lane_spans
            if s.attrs.get("starttrace.phase") == "import" and s.start_ns >= bootstrap.end_ns and s.error is None
        }
        if r["rank"] == 0:  # then it started its leaf: what that loaded came after `after`
            leaf_start = min(s.start_ns for s in named(run, lane, "process.launch"))
            recorded = {
                s.attrs["starttrace.import.module"]
                for s in lane_spans
                if s.attrs.get("starttrace.phase") == "import"
                and bootstrap.end_ns <= s.start_ns < leaf_start
                and s.error is None
            }
        assert recorded == gained, (r["rank"], sorted(gained - recorded)[:20], sorted(recorded - gained)[:20])


def test_a_rank_that_starts_a_process_gets_a_forkserver_of_its_own(ranks: Traced) -> None:
    """A forkserver child has no authkey or pid of its parent's forkserver (3.14's forkserver.py keeps
    `_forkserver_authkey` and `_forkserver_pid` in the process that started it): the default starts
    another one, whose fork the leaf hangs under."""
    run = ranks.run
    spans = span_index(run)
    rank0 = by_pid(run, ranks.out["ranks"][0]["pid"])
    leaf = by_pid(run, ranks.out["ranks"][0]["leaf"])
    (start,) = named(run, rank0, "forkserver.start")
    second = by_pid(run, start.attrs["starttrace.child_pid"])
    assert second.role == "forkserver" and second.ppid == rank0.pid
    assert second.pid != ranks.out["forkserver"]
    (preload,) = named(run, second, "forkserver.preload")
    assert [s.name for s in children(run, second, preload)] == ["preload __main__"]
    (fork,) = named(run, second, "process.fork")
    assert fork.attrs["starttrace.child_pid"] == leaf.pid
    leaf_span = run.process_span(leaf)
    assert leaf_span is not None and leaf_span.parent_id == fork.span_id
    owner, launch = spans[str(leaf_span.attrs.get("starttrace.launched_by"))]
    assert owner is rank0 and launch.attrs["starttrace.start_method"] == "forkserver"


def test_preload_finding_for_the_ranks_of_the_default_forkserver(ranks: Traced) -> None:
    from starttrace.analysis.lanes import build_model

    model = build_model(ranks.run)
    findings = [f for f in model.findings if f["kind"] == "preload"]
    (finding,) = [f for f in findings if f.get("start_method") == "forkserver"]
    assert set(finding["pids"]) >= {r["pid"] for r in ranks.out["ranks"]}
    modules = set(finding["modules"])
    assert modules and modules <= set(RANK_MODULES) | {m for r in ranks.out["ranks"] for m in r["after"]}
    assert not modules & {"heavy_setup", "__main__", "__mp_main__", "app"}  # the forkserver holds them
    assert "(it preloads [__main__] now)" in finding["text"]
    # both forkservers forked during startup: neither is unused
    assert not [f for f in model.findings if f["kind"] == "unused_forkserver"]


def test_a_warmed_up_default_forkserver_that_forks_nothing_is_unused(prewarm: Traced) -> None:
    from starttrace.analysis.lanes import build_model

    assert prewarm.out["before"] is None and prewarm.out["method"] == "forkserver"
    run = prewarm.run
    server = by_pid(run, prewarm.out["forkserver"])
    assert server.role == "forkserver" and not named(run, server, "process.fork")
    (preload,) = named(run, server, "forkserver.preload")
    assert [s.name for s in children(run, server, preload)] == ["preload __main__"]
    model = build_model(run)
    (unused,) = [f for f in model.findings if f["kind"] == "unused_forkserver"]
    assert unused["forkserver_pid"] == server.pid and unused["started_by_pid"] == prewarm.out["root"]
    assert unused["preload"] == ["__main__"] and unused["preload_s"] >= HEAVY_S * 0.9
    assert "forked nothing during startup" in unused["text"]


def test_tracing_leaves_the_output_as_it_was(
    ranks: Traced, tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    """What the forkserver's preload wrote to stdout reaches it as often traced as untraced: the probe
    does the preload itself and flushes where the interpreter's forkserver does (3.14, gh-135335);
    where it does not, each forked child writes the forkserver's buffer again, traced or not."""
    out, stdout = _run(_program(tmp_path / "untraced"), "ranks", _env(clean_env))
    assert out["method"] == "forkserver" and out["exitcodes"] == [0, 0]
    untraced = stdout.count("heavy_setup loaded")
    assert untraced >= 3  # the root and both forkservers, at least
    assert ranks.stdout.count("heavy_setup loaded") == untraced


def test_every_process_records_with_the_hot_path_asked_for(ranks: Traced) -> None:
    """The C core where it is built, the Python code with STARTTRACE_PURE_PYTHON=1 (which the tests'
    environments keep: scripts/test_pythons.sh runs them both ways)."""
    import importlib.util

    pure = os.environ.get("STARTTRACE_PURE_PYTHON", "").strip().lower() in ("1", "true", "on", "yes")
    built = importlib.util.find_spec("starttrace.tracer._hotpath") is not None
    expected = "python" if pure or not built else "c"
    assert {p.record.get("hotpath") for p in ranks.run.processes} == {expected}


def test_a_resource_tracker_started_by_a_queue_is_linked_to_its_launch(queue: Traced) -> None:
    """Under any start method but fork a Queue's lock registers with the resource tracker, which
    starts it: since gh-131788 (3.14, 3.13.7) through `ResourceTracker._launch` without
    `ensure_running`. Its lane hangs under a launch span of the root, made when the Queue was."""
    run = queue.run
    spans = span_index(run)
    root = by_pid(run, queue.out["root"])
    assert queue.out["before"] is None and queue.out["method"] == "forkserver"
    (tracker,) = [p for p in run.processes if p.resource.get("starttrace.process_name") == "resource_tracker"]
    tracker_span = run.process_span(tracker)
    assert tracker_span is not None
    owner, launch = spans[tracker_span.parent_id or ""]
    assert owner is root and launch.name == "process.launch"
    assert launch.attrs["starttrace.child_pid"] == tracker.pid
    root_span = run.process_span(root)
    assert root_span is not None and launch.parent_id == root_span.span_id  # not inside a start
    (start,) = named(run, root, "forkserver.start")
    assert launch.end_ns is not None and launch.end_ns <= start.start_ns  # before the first Process.start()
    child = by_pid(run, queue.out["child"])
    assert child.resource["starttrace.start_method"] == "forkserver"
