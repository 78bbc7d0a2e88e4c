"""Journal reading has bounds (issue 38 item 8, 10): the CLI on hostile copies of one real run.

A segment linked to /dev/zero is refused and named; a 1 GiB sparse segment costs no more memory
than the run without it; 2M malformed lines give a bounded answer; bytes past the per-run cap are
named; a folder that cannot be listed is skipped and named by `runs`, `report` and `compare`;
`report ''` says the run id is empty."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hostile_journals import (
    clone,
    junk_segments,
    lock,
    malformed_lines,
    real_run,
    sparse_segment,
    unlock,
    without_dac,
    zero_link,
)

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(clean_env: Callable[..., dict[str, str]]) -> Cli:
    env = clean_env(COLUMNS="400", NO_COLOR="1")

    def run(*args: str, extra: dict[str, str] | None = None, no_dac: bool = False) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "starttrace", *args]
        return subprocess.run(
            without_dac(cmd) if no_dac else cmd,
            capture_output=True,
            text=True,
            timeout=300,
            env={**env, **(extra or {})},
        )

    return run


@pytest.fixture
def base(journal_root: Path, clean_env: Callable[..., dict[str, str]]) -> Path:
    return real_run(journal_root, clean_env())


def _report(cli: Cli, root: Path, run_id: str, **kw: object) -> dict[str, object]:
    proc = cli("report", run_id, "--dir", str(root), "--json", **kw)  # type: ignore[arg-type]
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_segment_linked_to_dev_zero_is_refused_and_named(cli: Cli, base: Path) -> None:
    run = clone(base, "20250101-000000-zero00")
    name = zero_link(run)
    doc = _report(cli, base.parent, run.name)
    problems = doc["problems"]
    assert any(name in p and "not a regular file (a character device)" in p for p in problems), problems  # type: ignore[union-attr]
    assert doc["lanes"], doc  # the real journal is read


def _peak_rss_kib(cli: Cli, *args: str) -> int:
    """The peak RSS of one CLI run (a fresh child: RUSAGE_CHILDREN's max is the largest child)."""
    code = (
        "import resource, subprocess, sys;"
        "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, sys.executable, "-m", "starttrace", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1])


def test_a_1_gib_sparse_segment_costs_no_memory(cli: Cli, base: Path) -> None:
    run = clone(base, "20250101-000000-sparse")
    name = sparse_segment(run)
    assert (run / name).stat().st_size == 1 << 30
    doc = _report(cli, base.parent, run.name)
    assert len(doc["lanes"]) == 2  # type: ignore[arg-type]  # the sparse segment's process is read
    plain = _peak_rss_kib(cli, "report", base.name, "--dir", str(base.parent), "--json")
    sparse = _peak_rss_kib(cli, "report", run.name, "--dir", str(base.parent), "--json")
    assert sparse < plain + 64 * 1024, (plain, sparse)  # was ~1.1 GB more


def test_two_million_malformed_lines_give_a_bounded_answer(cli: Cli, base: Path) -> None:
    run = clone(base, "20250101-000000-malfor")
    name = malformed_lines(run)
    proc = cli("report", run.name, "--dir", str(base.parent), "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout) < 2_000_000, len(proc.stdout)  # was 119 MB
    problems = json.loads(proc.stdout)["problems"]
    mine = [p for p in problems if name in p]
    assert 1 < len(mine) <= 5, mine
    assert any("(1999999 in all)" in p for p in mine), mine  # and the last line: named as the cut last one


def test_bytes_past_the_run_cap_are_named(cli: Cli, base: Path) -> None:
    run = clone(base, "20250101-000000-capped")
    name = junk_segments(run, 12)
    doc = _report(cli, base.parent, run.name, extra={"STARTTRACE_MAX_RUN_MB": "4"})
    problems = doc["problems"]
    assert any("the run's cap" in p and name.split(".")[0] in p for p in problems), problems  # type: ignore[union-attr]
    assert doc["lanes"], doc
    full = _report(cli, base.parent, run.name)
    assert not any("the run's cap" in p for p in full["problems"])  # type: ignore[union-attr]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to drop root's file access")
def test_an_unreadable_run_folder_is_skipped_and_named(cli: Cli, base: Path) -> None:
    locked = clone(base, "20250101-000000-locked")  # older than base: base stays the newest run
    lock(locked)
    root = str(base.parent)
    try:
        runs = cli("runs", "--dir", root, "--json", no_dac=True)
        assert runs.returncode == 0, runs.stderr
        rows = {row["run_id"]: row for row in json.loads(runs.stdout)}
        assert rows[locked.name]["status"] == "unreadable" and rows[base.name]["status"] == "finished", rows
        mine = cli("report", base.name, "--dir", root, no_dac=True)
        assert mine.returncode == 0 and base.name in mine.stdout, mine.stderr
        theirs = cli("report", locked.name, "--dir", root, no_dac=True)
        assert theirs.returncode == 2, theirs.stderr
        assert "Traceback" not in theirs.stderr
        assert f"run {locked.name} is unreadable: cannot list its folder (Permission denied)" in theirs.stderr
        both = cli("compare", base.name, locked.name, "--dir", root, no_dac=True)
        assert both.returncode == 2 and "Traceback" not in both.stderr and "unreadable" in both.stderr, both.stderr
        same = cli("compare", base.name, base.name, "--dir", root, no_dac=True)
        assert same.returncode == 0, same.stderr
    finally:
        unlock(locked)


def test_report_of_an_empty_run_id_says_so(cli: Cli, base: Path) -> None:
    proc = cli("report", "", "--dir", str(base.parent))
    assert proc.returncode == 2
    assert "a run id is required: the one given is empty" in proc.stderr, proc.stderr
