"""The loop on a forkserver tree, for real (examples/preload_loop.py, stdlib only):

run A (traced) -> `starttrace advise A --preload-list` -> run B with STARTTRACE_FORKSERVER_PRELOAD
set to that line -> `starttrace compare A B`. In B the engine's forkserver preloads the modules
(`forkserver.preload` holds them) and the ranks import none of them after the fork; the realised
saving per rank is within max(50 ms, 50 %) of the predicted one, and the change of time to ready
within max(0.5 s, 40 % of A's) of the estimate. Whole-run times are noisy on two cores shared with
other work: A and B are each the run with the median time to ready of three.

Also: `starttrace run --preload`, labels of generic children, and the CLI at COLUMNS=80.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from run_spans import children, named, spans_named, spans_of

from starttrace.sources.journal_reader import Process, Run, read_run

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "preload_loop.py"
sys.path.insert(0, str(REPO / "examples"))
from preload_loop import RANK_MODULES  # noqa: E402

PER_RANK_TOLERANCE_S = 0.05
PER_RANK_TOLERANCE_SHARE = 0.5
TIME_TO_READY_TOLERANCE_S = 0.5
TIME_TO_READY_TOLERANCE_SHARE = 0.4
REPEAT = 3


@dataclass
class Loop:
    root: Path
    a: Run
    b: Run
    preload: list[str]
    advise_out: str
    env: dict[str, str]


def cli(python: str, env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([python, "-m", "starttrace", *args], env=env, capture_output=True, text=True, timeout=120)
    if check:
        assert done.returncode == 0, f"starttrace {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def newest(root: Path, before: set[str]) -> Run:
    (new,) = [p for p in root.iterdir() if p.is_dir() and p.name not in before]
    return read_run(new)


def median_run(runs: list[Run]) -> Run:
    from starttrace.analysis.lanes import build_model

    return sorted(runs, key=lambda r: build_model(r).startup_s)[len(runs) // 2]


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory, clean_env: Callable[..., dict[str, str]], venv_python: str) -> Loop:
    root = tmp_path_factory.mktemp("loop") / "runs"
    root.mkdir()
    env = clean_env(COLUMNS="80")
    subprocess.run([venv_python, str(EXAMPLE)], env=env, check=True, capture_output=True, timeout=120)  # warm caches
    runs_a = []
    for _ in range(REPEAT):
        before = {p.name for p in root.iterdir()}
        cli(venv_python, env, "run", "--dir", str(root), "-q", "--", venv_python, str(EXAMPLE))
        runs_a.append(newest(root, before))
    a = median_run(runs_a)
    advised = cli(venv_python, env, "advise", a.run_id, "--dir", str(root), "--preload-list")
    line = advised.stdout.rstrip("\n").splitlines()[-1]
    traced = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(root), STARTTRACE_FORKSERVER_PRELOAD=line)
    runs_b = []
    for _ in range(REPEAT):
        before = {p.name for p in root.iterdir()}
        done = subprocess.run([venv_python, str(EXAMPLE)], env=traced, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stderr.count("STARTTRACE_FORKSERVER_PRELOAD: every forkserver of this run also preloads") == 1
        runs_b.append(newest(root, before))
    return Loop(root, a, median_run(runs_b), line.split(","), advised.stdout, env)


def ranks(run: Run) -> list[Process]:
    found = sorted(
        (p for p in run.processes if p.resource.get("starttrace.process_name", "").startswith("rank-")),
        key=lambda p: p.pid,
    )
    assert len(found) == 2, [(p.label(), p.resource.get("starttrace.process_name")) for p in run.processes]
    return found


def imported(run: Run, process: Process) -> set[str]:
    return {s.attrs["starttrace.import.module"] for s in spans_of(run, process) if s.name.startswith("import ")}


def test_generic_children_are_labelled_by_name_and_target(loop: Loop) -> None:
    from starttrace.analysis.lanes import build_model

    model = build_model(loop.a)
    labels = {ln.pid: ln.label for ln in model.lanes}
    for rank in ranks(loop.a):
        assert rank.role == "child" and rank.resource["starttrace.process_target"] == "rank_main"
        assert labels[rank.pid] == f"{rank.resource['starttrace.process_name']} (rank_main) pid {rank.pid}"
    (engine,) = [p for p in loop.a.processes if p.resource.get("starttrace.process_name") == "EngineCore"]
    assert labels[engine.pid] == f"EngineCore (engine_main) pid {engine.pid}"
    # real helpers stay helpers
    assert [p.role for p in loop.a.processes if p.resource.get("starttrace.process_name") == "resource_tracker"] == [
        "helper"
    ]


def test_advise_preload_list_covers_the_rank_imports(loop: Loop) -> None:
    assert loop.preload and all(re.fullmatch(r"[\w.]+", m) for m in loop.preload)
    assert {"asyncio", "email.mime.multipart", "unittest", "decimal"} <= set(loop.preload)
    assert "__main__" not in loop.preload and "preload_loop" not in loop.preload
    for rank in ranks(loop.a):
        assert set(RANK_MODULES) <= imported(loop.a, rank)  # run A: every rank paid for them after its fork
    flat = " ".join(loop.advise_out.split())  # the findings list wraps at spaces
    assert "to the preload of forkserver pid" in flat and "(it preloads [__main__] now)" in flat


def test_run_b_preloads_them_in_the_forkserver_and_ranks_import_none(loop: Loop) -> None:
    for rank in ranks(loop.b):
        assert rank.resource["starttrace.start_method"] == "forkserver"
        assert not imported(loop.b, rank) & set(RANK_MODULES), sorted(imported(loop.b, rank) & set(RANK_MODULES))
    (fs,) = [p for p in loop.b.processes if p.role == "forkserver"]
    (pre,) = named(loop.b, fs, "forkserver.preload")
    assert pre.attrs["starttrace.preload"] == ["__main__", *loop.preload]
    assert pre.attrs["starttrace.preload_added"] == loop.preload
    held = {s.attrs.get("starttrace.import.module") for s in children(loop.b, fs, pre)}
    assert set(loop.preload) <= held
    (root,) = [p for p in loop.b.processes if p.resource.get("starttrace.start_method") == "root"]
    assert root.resource["starttrace.forkserver_preload_extra"] == loop.preload
    (start,) = spans_named(loop.b, "forkserver.start")
    assert start.attrs["starttrace.preload_added"] == loop.preload


def test_compare_shows_realised_against_predicted(loop: Loop, venv_python: str) -> None:
    done = cli(venv_python, loop.env, "compare", loop.a.run_id, loop.b.run_id, "--dir", str(loop.root), "--json")
    (check,) = json.loads(done.stdout)["preload_checks"]
    assert check["applied"] and check["modules"] == loop.preload
    assert len(check["ranks"]) == 2
    for r in check["ranks"]:
        tolerance = max(PER_RANK_TOLERANCE_S, PER_RANK_TOLERANCE_SHARE * r["predicted_s"])
        assert r["predicted_s"] > 0.02
        assert abs(r["realised_s"] - r["predicted_s"]) <= tolerance, r
        assert r["still_imported_s"] == 0
    ttr: dict[str, Any] = check["time_to_ready"]
    assert ttr["label"] == "estimate"
    from starttrace.analysis.lanes import build_model

    tolerance = max(TIME_TO_READY_TOLERANCE_S, TIME_TO_READY_TOLERANCE_SHARE * build_model(loop.a).startup_s)
    assert abs(ttr["realised_change_s"] - ttr["predicted_change_s"]) <= tolerance, ttr
    text = cli(venv_python, loop.env, "compare", loop.a.run_id, loop.b.run_id, "--dir", str(loop.root)).stdout
    assert "applied in B" in text and "predicted s" in text and "realised s" in text


def test_a_start_that_never_tried_the_advice_is_not_reported_as_failing_it(loop: Loop, venv_python: str) -> None:
    """A against itself: its forkserver preloads none of the advice, so B never tried it."""
    done = cli(venv_python, loop.env, "compare", loop.a.run_id, loop.a.run_id, "--dir", str(loop.root), "--json")
    (check,) = json.loads(done.stdout)["preload_checks"]
    assert not check["tried"] and not check["applied"]
    assert any("did not try this advice" in note for note in check["notes"])
    text = cli(venv_python, loop.env, "compare", loop.a.run_id, loop.a.run_id, "--dir", str(loop.root)).stdout
    assert "not tried in B" in text and "NOT" not in text
    (b_check,) = json.loads(
        cli(venv_python, loop.env, "compare", loop.a.run_id, loop.b.run_id, "--dir", str(loop.root), "--json").stdout
    )["preload_checks"]
    assert b_check["tried"]


def test_cli_fits_80_columns(loop: Loop, venv_python: str) -> None:
    root = ["--dir", str(loop.root)]
    outputs = {
        "report": cli(venv_python, loop.env, "report", loop.a.run_id, *root).stdout,
        "advise": cli(venv_python, loop.env, "advise", loop.a.run_id, *root).stdout,
        "compare": cli(venv_python, loop.env, "compare", loop.a.run_id, loop.b.run_id, *root).stdout,
    }
    for name, out in outputs.items():
        lines = out.splitlines()
        assert lines and all(len(line) <= 80 for line in lines), (name, max(lines, key=len))
        for before, _after in re.findall(r"(\S*)…(\S*)", out):
            assert before == "", (name, out)
    titles = [line.strip() for line in outputs["report"].splitlines()]
    assert titles.index("findings") < titles.index("processes")
    wide = cli(venv_python, loop.env, "report", loop.a.run_id, *root, "--wide").stdout
    assert "…" not in wide and "email.mime.multipart" in wide


def test_run_preload_option(loop: Loop, venv_python: str) -> None:
    before = {p.name for p in loop.root.iterdir()}
    done = cli(
        venv_python,
        loop.env,
        "run",
        "--dir",
        str(loop.root),
        "-q",
        "--preload",
        "asyncio, decimal",
        "--",
        venv_python,
        str(EXAMPLE),
    )
    assert done.stderr.count("every forkserver of this run also preloads asyncio, decimal") == 1
    run = newest(loop.root, before)
    (start,) = spans_named(run, "forkserver.start")
    assert start.attrs["starttrace.preload"] == ["__main__", "asyncio", "decimal"]
    for rank in ranks(run):
        assert not imported(run, rank) & {"asyncio", "decimal"}
    bad = cli(
        venv_python, loop.env, "run", "--dir", str(loop.root), "--preload", "not a module", "--", "true", check=False
    )
    assert bad.returncode == 2 and "--preload wants module names" in bad.stderr


def test_demo_defaults_to_spawn() -> None:
    import inspect

    from typer.testing import CliRunner

    from starttrace.cli import app
    from starttrace.demo import run_demo

    assert inspect.signature(run_demo).parameters["method"].default == "spawn"
    result = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0 and "[default: spawn]" in result.output
    bad = CliRunner().invoke(app, ["demo", "--method", "thread"])
    assert bad.exit_code == 2
