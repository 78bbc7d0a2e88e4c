"""The real process tree of examples/tree.py, traced: structure, links, nesting, ground truth.

One traced run (with PYTHONPROFILEIMPORTTIME=1 and one stderr file per process) serves every
test here: its journals are compared with what `-X importtime` printed for the same processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from run_spans import all_spans, named, span_index, spans_of

from starttrace.sources.journal_reader import Process, Run, Span, list_run_dirs, read_run

REPO = Path(__file__).resolve().parents[2]
IMPORTTIME_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|\s*(\S+)\s*$")
HAVE_TORCH = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


@dataclass
class TracedTree:
    run: Run
    pids: dict[str, int]
    root_pid: int
    stderr_dir: Path
    root_stderr: Path


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> TracedTree:
    base = tmp_path_factory.mktemp("tree")
    journal_root = base / "runs"
    split = base / "stderr"
    root_stderr = base / "root.err"
    env = {
        k: v
        for k, v in os.environ.items()
        if k == "STARTTRACE_PURE_PYTHON"  # kept: scripts/test_pythons.sh runs this with the Python code too
        or (not k.startswith("STARTTRACE") and k.lower() != "traceparent")
    }
    env.update(STARTTRACE="1", STARTTRACE_DIR=str(journal_root), PYTHONPROFILEIMPORTTIME="1")
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    command = [sys.executable, str(REPO / "examples" / "tree.py"), "--split-stderr", str(split)]
    if not HAVE_TORCH:
        command.append("--no-torch")
    with open(root_stderr, "wb") as err:
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=err, timeout=240, check=False)
    assert done.returncode == 0, root_stderr.read_text()[-3000:]
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    runs = list_run_dirs(journal_root)
    assert len(runs) == 1
    return TracedTree(read_run(runs[0]), result["pids"], result["root"], split, root_stderr)


def by_pid(run: Run, pid: int) -> Process:
    matches = [p for p in run.processes if p.pid == pid]
    assert len(matches) == 1, f"pid {pid}: {len(matches)} journals"
    return matches[0]


def test_one_run_for_the_whole_tree(tree: TracedTree) -> None:
    run = tree.run
    expected = 9 if HAVE_TORCH else 8  # root, resource tracker, spawn, fork, forkserver + 2, subprocess, torch
    assert len(run.processes) == expected, [(p.pid, p.role) for p in run.processes]
    assert {p.resource["starttrace.run_id"] for p in run.processes} == {run.run_id}
    assert {p.record["trace"] for p in run.processes} == {run.trace_id}
    assert len({p.instance_id for p in run.processes}) == expected
    assert not run.problems
    startup = run.startup
    assert startup is not None and startup.end_ns is not None
    root = by_pid(run, tree.root_pid)
    assert root.resource["starttrace.start_method"] == "root"
    assert root.resource["starttrace.role"] == "main"
    own = run.process_span(root)
    assert own is not None and own.parent_id == startup.span_id


def test_children_link_to_the_span_that_made_them(tree: TracedTree) -> None:
    run, pids = tree.run, tree.pids
    spans = span_index(run)
    root = by_pid(run, tree.root_pid)

    def parent_of(pid: int) -> tuple[Process | None, Span]:
        own = run.process_span(by_pid(run, pid))
        assert own is not None
        return spans[own.parent_id or ""]

    owner, launch = parent_of(pids["spawn"])
    assert owner is root and launch.name == "process.launch"
    assert launch.attrs["starttrace.child_pid"] == pids["spawn"]
    assert launch.attrs["starttrace.start_method"] == "spawn"
    assert by_pid(run, pids["spawn"]).resource["starttrace.start_method"] == "spawn"

    owner, fork = parent_of(pids["fork"])
    assert owner is root and fork.name == "process.fork"
    assert fork.attrs["starttrace.child_pid"] == pids["fork"]
    assert spans[fork.parent_id or ""][1].name == "process.launch"  # the fork happened inside Process.start()
    assert by_pid(run, pids["fork"]).resource["starttrace.start_method"] == "fork"

    owner, launch = parent_of(pids["subprocess"])
    assert owner is root and launch.name == "process.launch"
    assert launch.attrs["starttrace.start_method"] == "exec"
    assert launch.attrs["starttrace.child_pid"] == pids["subprocess"]
    assert by_pid(run, pids["subprocess"]).resource["starttrace.start_method"] == "exec"


def test_forkserver_start_preload_and_forked_children(tree: TracedTree) -> None:
    run = tree.run
    spans = span_index(run)
    root = by_pid(run, tree.root_pid)
    servers = [p for p in run.processes if p.role == "forkserver"]
    assert len(servers) == 1
    server = servers[0]
    starts = named(run, root, "forkserver.start")
    assert len(starts) == 1
    assert starts[0].attrs["starttrace.preload"] == ["colorsys", "email.utils", "runpy", "pkgutil"]
    assert starts[0].attrs["starttrace.child_pid"] == server.pid
    server_span = run.process_span(server)
    assert server_span is not None and server_span.parent_id == starts[0].span_id

    preload = named(run, server, "forkserver.preload")
    assert len(preload) == 1 and preload[0].end_ns is not None
    server_spans = spans_of(run, server)
    per_module = [s for s in server_spans if s.parent_id == preload[0].span_id and s.name.startswith("preload ")]
    assert [s.name for s in per_module] == [
        "preload colorsys",
        "preload email.utils",
        "preload runpy",
        "preload pkgutil",
    ]
    email_imports = [s for s in server_spans if s.name == "import email.utils"]
    assert email_imports and email_imports[0].parent_id == per_module[1].span_id

    forks = named(run, server, "process.fork")
    children = [p for p in run.processes if p.resource["starttrace.start_method"] == "forkserver"]
    assert len(children) == 2 and len(forks) == 2
    assert {f.attrs["starttrace.child_pid"] for f in forks} == {c.pid for c in children}
    for child in children:
        own = run.process_span(child)
        assert own is not None
        owner, fork = spans[own.parent_id or ""]
        assert owner is server and fork.name == "process.fork"
        launched_by = own.attrs.get("starttrace.launched_by")
        owner, launch = spans[str(launched_by)]
        assert owner is root and launch.name == "process.launch" and launch.attrs["starttrace.child_pid"] == child.pid
        # what the child imported after its fork is its own: difflib, tomllib
        imported = {
            s.attrs["starttrace.import.module"]
            for s in spans_of(run, child)
            if s.attrs.get("starttrace.phase") == "import"
        }
        assert {"difflib", "tomllib"} <= imported
        assert "email.utils" not in imported  # preloaded in the forkserver


def test_bootstrap_ends_where_the_target_starts(tree: TracedTree) -> None:
    run, pids = tree.run, tree.pids
    for key, first_import in (("spawn", "decimal"), ("fork", "statistics")):
        child = by_pid(run, pids[key])
        bootstraps = named(run, child, "process.bootstrap")
        assert len(bootstraps) == 1, key
        boot = bootstraps[0]
        assert boot.end_ns is not None and boot.end_ns >= boot.start_ns
        target_import = named(run, child, f"import {first_import}")
        assert target_import and target_import[0].start_ns >= boot.end_ns
        assert child.resource["starttrace.process_name"] in ("spawn-child", "fork-child")
    spawn = by_pid(run, pids["spawn"])
    init = named(run, spawn, "python.init")
    assert len(init) == 1 and init[0].end_ns is not None and init[0].end_ns - init[0].start_ns > 0
    assert not named(run, by_pid(run, pids["fork"]), "python.init")  # a fork child runs no interpreter start


def test_spans_nest_inside_their_parents(tree: TracedTree) -> None:
    run = tree.run
    spans = span_index(run)
    checked = 0
    for process, span in all_spans(run):
        if span.parent_id is None or span.parent_id not in spans:
            assert span.name == "startup" or span.parent_id in spans, span
            continue
        parent_process, parent = spans[span.parent_id]
        assert span.start_ns >= parent.start_ns - 1_000, (span.name, parent.name)
        if (
            parent_process is process
            and span.end_ns is not None
            and parent.end_ns is not None
            and parent.name != "process"
        ):
            assert span.end_ns <= parent.end_ns + 1_000, (span.name, parent.name)
            checked += 1
        if (
            span.attrs.get("starttrace.phase") == "import"
            and parent_process is process
            and parent.attrs.get("starttrace.phase") == "import"
        ):
            assert span.thread == parent.thread
    assert checked > (500 if HAVE_TORCH else 300)  # without torch: the tree's stdlib imports only


def _importtime(path: Path, activation_loads: set[str] = frozenset()) -> dict[str, int]:  # type: ignore[assignment]
    """Module -> cumulative us, as printed; `activation_loads` (the process record's footprint:
    what starttrace's activation loaded and hid again) are printed once more by the activation
    itself, first, and that line is not the program's."""
    modules: dict[str, int] = {}
    skip = set(activation_loads)
    for line in path.read_text(errors="replace").splitlines():
        match = IMPORTTIME_LINE.match(line)
        if match:  # a module can be printed twice (re-entrant loads): keep the outermost call
            name = match.group(3)
            if name in skip:
                skip.discard(name)
                continue
            modules[name] = max(modules.get(name, 0), int(match.group(2)))
    return modules


def test_recorded_imports_equal_importtime_per_process(tree: TracedTree) -> None:
    """Ground truth: per process, the modules -X importtime printed after activation."""
    compared = 0
    for process in tree.run.processes:
        if process.pid == tree.root_pid:
            source = tree.root_stderr
        else:
            source = tree.stderr_dir / f"{process.pid}.err"
        assert source.exists(), f"no stderr file for {process.label()}"
        activated_here = process.record.get("method") not in ("fork", "forkserver")
        truth = _importtime(source, set(process.record.get("footprint") or ()) if activated_here else set())
        preloaded = set(process.preloaded)
        # starttrace's own modules loaded after activation (the light case's hand-over to the
        # recorder: activation.py) are printed by -X importtime, and are not the program's imports
        expected = {m for m in set(truth) - preloaded if m != "starttrace" and not m.startswith("starttrace.")}
        imports: dict[str, Span] = {}
        for span in spans_of(tree.run, process):  # for a module loaded re-entrantly, keep the outermost span
            if span.attrs.get("starttrace.phase") == "import":
                module = span.attrs["starttrace.import.module"]
                if module not in imports or (span.duration_ns or 0) > (imports[module].duration_ns or 0):
                    imports[module] = span
        via_statement = {m for m, s in imports.items() if s.attrs.get("starttrace.import.via") != "importlib"}
        assert via_statement == expected, (
            process.label(),
            sorted(expected - via_statement)[:20],
            sorted(via_statement - expected)[:20],
        )
        compared += len(expected)
        # cumulative time per module: within 25 % + 3 ms of importtime's for modules >= 5 ms
        for module, cumulative_us in truth.items():
            span = imports.get(module)
            if span is None or span.end_ns is None or cumulative_us < 5_000:
                continue
            ours_us = (span.end_ns - span.start_ns) / 1000
            assert abs(ours_us - cumulative_us) <= 0.25 * cumulative_us + 3_000, (module, ours_us, cumulative_us)
    assert compared > 200


def test_import_self_time_and_file_paths(tree: TracedTree) -> None:
    child = by_pid(tree.run, tree.pids["spawn"])
    decimal = next(s for s in spans_of(tree.run, child) if s.name == "import decimal")
    assert decimal.attrs["code.file.path"].endswith("decimal.py")
    assert 0 <= decimal.attrs["starttrace.import.self_us"] <= (decimal.end_ns - decimal.start_ns) // 1000
    failed = [s for _, s in all_spans(tree.run) if s.attrs.get("starttrace.phase") == "import" and s.error]
    assert failed and all("Error" in (s.error or "") for s in failed)  # optional imports that failed are kept


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_torch_child_records_torch_imports(tree: TracedTree) -> None:
    child = by_pid(tree.run, tree.pids["torch"])
    spans = spans_of(tree.run, child)
    torch_span = [s for s in spans if s.name == "import torch"]
    assert len(torch_span) == 1
    nested = [s for s in spans if s.parent_id == torch_span[0].span_id]
    assert len(nested) > 20
    total = sum(1 for s in spans if s.attrs.get("starttrace.import.module", "").startswith("torch"))
    assert total > 300


def test_a_helper_ready_is_not_the_run_ready(tree: TracedTree) -> None:
    """The resource tracker marks `process.ready`; only a server's `ready` makes the run ready."""
    from starttrace.analysis.lanes import build_model

    tracker = [p for p in tree.run.processes if named(tree.run, p, "process.ready")]
    assert tracker, "the resource tracker records process.ready"
    model = build_model(tree.run)
    assert model.ready_ns is None and model.status != "ready"
    startup = tree.run.startup
    assert startup is not None and startup.end_ns is not None
    # not cut short at the tracker's process.ready; it may run past the root's exit by the time the
    # forkserver takes to notice that exit (its lane is the run's last), which a loaded machine stretches
    ready_s = max(s.start_ns for p in tracker for s in named(tree.run, p, "process.ready")) - startup.start_ns
    margin = 0.2 if HAVE_TORCH else 0.05  # the tree without torch (other Python versions) ends in ~0.4 s
    assert ready_s / 1e9 < (startup.end_ns - startup.start_ns) / 1e9 - margin
    assert (startup.end_ns - startup.start_ns) / 1e9 - 0.05 < model.startup_s <= (model.t_end - model.t0) / 1e9


def test_resource_tracker_started_through_the_module_alias_is_linked(tree: TracedTree) -> None:
    """`resource_tracker.ensure_running()` (a bound method taken at import) is still seen."""
    run = tree.run
    spans = span_index(run)
    trackers = [p for p in run.processes if p.resource.get("starttrace.process_name") == "resource_tracker"]
    assert len(trackers) == 1
    tracker = trackers[0]
    assert tracker.resource["starttrace.start_method"] == "spawn"
    own = run.process_span(tracker)
    assert own is not None
    owner, launch = spans[own.parent_id or ""]
    assert owner is not None and owner.pid == tree.root_pid
    assert launch.name == "process.launch" and launch.attrs["starttrace.child_pid"] == tracker.pid
