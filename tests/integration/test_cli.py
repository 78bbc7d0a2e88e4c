"""The `starttrace` command line, run as users run it (real subprocesses)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from starttrace import __version__
from starttrace.cli import app


@pytest.fixture
def cli(venv_python: str, clean_env: Callable[..., dict[str, str]]) -> Callable[..., subprocess.CompletedProcess[str]]:
    # A wide console: rich would otherwise wrap long paths at 80 columns when not on a terminal.
    env = clean_env(COLUMNS="400", NO_COLOR="1")

    def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [venv_python, "-m", "starttrace", *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
        )

    return run


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_run_passes_the_exit_code_and_summarizes(
    cli: Callable[..., subprocess.CompletedProcess[str]], venv_python: str, journal_root: Path
) -> None:
    proc = cli("run", "--dir", str(journal_root), "--", venv_python, "-c", "import json, sys; sys.exit(3)")
    assert proc.returncode == 3, proc.stderr
    match = re.search(r"starttrace: run (\S+) stored in (\S+)", proc.stderr)
    assert match, proc.stderr
    run_id, run_dir = match.group(1), Path(match.group(2))
    assert run_dir == journal_root / run_id and run_dir.is_dir()
    assert (run_dir / "run.json").exists()
    assert f"run {run_id}: 1 processes" in proc.stderr, proc.stderr  # the summary table
    assert "import json" not in proc.stderr  # a summary, not a dump
    assert f"starttrace report {run_id}" in proc.stderr

    listing = cli("runs", "--dir", str(journal_root))
    assert listing.returncode == 0, listing.stderr
    assert run_id in listing.stdout
    rows = json.loads(cli("runs", "--dir", str(journal_root), "--json").stdout)
    assert [row["run_id"] for row in rows] == [run_id]
    # the model's status (analysis/liveness.py): the startup span ended with the root's exit
    assert rows[0]["processes"] == 1 and rows[0]["status"] == "finished"
    assert "sys.exit(3)" in rows[0]["command"]

    report = cli("report", run_id[:17], "--dir", str(journal_root))  # a unique prefix is enough
    assert report.returncode == 0, report.stderr
    assert run_id in report.stdout
    assert "main" in report.stdout
    as_json = cli("report", run_id, "--dir", str(journal_root), "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert run_id in as_json.stdout and json.loads(as_json.stdout)["status"] == rows[0]["status"]


def test_run_of_a_missing_program(cli: Callable[..., subprocess.CompletedProcess[str]], journal_root: Path) -> None:
    proc = cli("run", "--dir", str(journal_root), "--", "/nonexistent/program-xyz")
    assert proc.returncode == 127
    assert "cannot start" in proc.stderr and "program-xyz" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["report", "export"])
def test_unknown_run_id(cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path, command: str) -> None:
    root = tmp_path / "runs"
    proc = cli(command, "no-such-run", "--dir", str(root))
    assert proc.returncode == 2
    assert "unknown run id 'no-such-run'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not root.exists(), "a lookup must not create the journal root"
    root.mkdir()
    (root / "20260101-000000-abcdef").mkdir()
    before = _tree(root)
    proc = cli(command, "no-such-run", "--dir", str(root))
    assert proc.returncode == 2 and "unknown run id" in proc.stderr
    assert _tree(root) == before


def test_empty_journal_is_a_bad_request(cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "20260101-000000-e0e0e0"
    run_dir.mkdir(parents=True)
    (run_dir / "123-0000abcd.jsonl").write_bytes(b"")
    for args in (("report", run_dir.name), ("export", run_dir.name, "-f", "perfetto")):
        proc = cli(*args, "--dir", str(run_dir.parent))
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "no readable journal" in proc.stderr and "123-0000abcd.jsonl" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stdout == ""


def test_corrupt_journal_is_a_bad_request(cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "20260101-000000-c0c0c0"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text('{"v": 1, "run_id": "20260101-000000-c0c0c0"}\n')
    (run_dir / "77-deadbeef.jsonl").write_bytes(b"\x00\xffthis is not JSON\n{{{\n")
    proc = cli("report", "--dir", str(run_dir.parent))  # the newest run
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "77-deadbeef.jsonl" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_of_every_command(cli: Callable[..., subprocess.CompletedProcess[str]], venv_python: str) -> None:
    from typer.testing import CliRunner

    names = sorted(command.name or command.callback.__name__ for command in app.registered_commands)  # type: ignore[union-attr]
    assert {"run", "runs", "report", "export", "compare", "serve", "demo"} <= set(names)
    top = cli("--help")  # the real entry point, once
    assert top.returncode == 0, top.stderr
    runner = CliRunner()
    for name in names:
        assert name in top.stdout
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
        assert result.exit_code == 0, (name, result.output)
        assert "Usage:" in result.output and name in result.output, name
    script = Path(venv_python).parent / "starttrace"  # the console script entry point
    version = subprocess.run([str(script), "version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == __version__


def test_serve_refuses_a_database_of_an_older_schema(
    cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    import sqlite3

    old = tmp_path / "old.db"
    with sqlite3.connect(old) as connection:  # the 0.1 pre-release layout: spans with text run/lane columns
        connection.execute("CREATE TABLE spans (span_id TEXT, trace_id TEXT, run_id TEXT, lane_id TEXT)")
    before = old.read_bytes()
    done = cli("serve", "--db", str(old), "--port", "1", "--no-journal")
    assert done.returncode == 2
    assert "older starttrace service" in done.stderr and "choose another --db" in done.stderr
    assert old.read_bytes() == before  # nothing touched


def test_serve_rejects_a_bad_retention(cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    done = cli("serve", "--db", str(tmp_path / "new.db"), "--port", "1", "--no-journal", "--retention", "soon")
    assert done.returncode == 2
    assert "soon" in done.stderr
