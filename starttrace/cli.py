"""`starttrace`: run a traced command, list runs, report, export, compare, fleet, serve, demo.

Exit codes: the traced command's own for `run`; 2 for a bad request (unknown run id, empty or
corrupt journal, bad option); 1 for a failure on the way (an export the endpoint refused). The
gate `compare --max-regression`: 1 for a regression, 3 for starts of unlike kind (docs/fleet.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from starttrace import __version__
from starttrace.sources.journal_reader import ReaderError, Run, default_root, find_run_dir, list_run_dirs, read_run

app = typer.Typer(
    help="Where the startup time of multi-process Python servers goes (vLLM, SGLang, torchrun, ...).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_show_locals=False,
)
console = Console()
errors = Console(stderr=True)

DirOption = Annotated[
    Path | None,
    typer.Option("--dir", help="journal root (default: $STARTTRACE_DIR, else ~/.local/state/starttrace/runs)"),
]
ClickHouseOption = Annotated[
    str | None,
    typer.Option(
        "--clickhouse",
        envvar="STARTTRACE_CLICKHOUSE",
        help="read runs from ClickHouse's otel_traces: http(s)://user:pass@host:8123/db[?table=otel_traces]"
        " or chdb:PATH (docs/fleet.md)",
    ),
]
RunArgument = Annotated[str | None, typer.Argument(help="run id or a unique prefix of it; default: the newest run")]
WideOption = Annotated[
    bool, typer.Option("--wide", help="names whole, tables as wide as they need (default: fit the terminal, COLUMNS)")
]


# the caller's STARTTRACE_* settings a traced command inherits (the rest would mix in another run's state)
PASSED_SETTINGS = (
    "STARTTRACE_MIN_IMPORT_US",
    "STARTTRACE_SERVICE_NAME",
    "STARTTRACE_DIR",
    "STARTTRACE_OTLP_DETAIL",
    "STARTTRACE_SUMMARY_IMPORTS",
    "STARTTRACE_FORKSERVER_PRELOAD",
    "STARTTRACE_STALL_S",
)


class Format(StrEnum):
    otlp = "otlp"
    otlp_json = "otlp-json"
    perfetto = "perfetto"
    jaeger = "jaeger"


class Detail(StrEnum):
    full = "full"
    summary = "summary"


def _fail(message: str, code: int = 2) -> typer.Exit:
    errors.print(Text(f"starttrace: {message}", style="red"))
    return typer.Exit(code)


def _root(directory: Path | None) -> Path:
    return directory if directory is not None else default_root()


def strict_json(obj: Any, indent: int | None = None) -> str:
    """Strict JSON (NaN and infinities as null), as every JSON output of the CLI writes it."""
    from starttrace.views.json import dumps

    return dumps(obj, indent=indent)


def _load(run: str | None, directory: Path | None, clickhouse: str | None = None) -> Run:
    from starttrace.analysis.clocks import correct_clocks

    if clickhouse:
        return correct_clocks(_load_clickhouse(run, clickhouse), owned=True)
    from starttrace.sources.run_groups import join_journal_runs

    try:
        run_dir = find_run_dir(_root(directory), run)
        # per-node runs of one job in the same journal root, joined as the service joins them
        the_run = join_journal_runs(read_run(run_dir), run_dir.parent)
    except ReaderError as exc:
        raise _fail(str(exc)) from None
    return correct_clocks(the_run, owned=True)  # the hosts of a multi-node run on one clock (docs/multinode.md)


def _load_clickhouse(run: str | None, url: str) -> Run:
    from starttrace.sources.clickhouse.client import ClickHouseError, check_traces_table, connect
    from starttrace.sources.clickhouse.runs import ClickHouseRuns

    try:
        client = connect(url)
        check_traces_table(client)
        runs = ClickHouseRuns(client)
        run_id = run or runs.latest_run_id()
        the_run = runs.load_run(run_id) if run_id else None
    except ClickHouseError as exc:
        raise _fail(str(exc)) from None
    if the_run is None:
        raise _fail(f"no run {run!r} in ClickHouse" if run else "no runs in ClickHouse")
    return the_run


def _model(run: Run, until: str = "ready") -> Any:
    from starttrace.analysis.lanes import NoFirstToken, build_model

    try:
        return build_model(run, until=until)
    except NoFirstToken as exc:
        raise _fail(str(exc)) from None


class Until(StrEnum):
    """Where breakdowns and the critical path end (`--until`)."""

    ready = "ready"
    first_token = "first-token"


UntilOption = Annotated[
    Until,
    typer.Option("--until", help="end breakdowns and the critical path at ready, or at the first token"),
]


@app.command()
def version() -> None:
    """Print the version."""
    console.print(__version__)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def run(
    command: Annotated[list[str], typer.Argument(help="the command to trace, after --")],
    directory: DirOption = None,
    service: Annotated[str | None, typer.Option(help="service.name for every process of the run")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no summary after the command")] = False,
    preload: Annotated[
        str | None,
        typer.Option(
            help="modules (mod,mod) added to the preload of every forkserver the command starts"
            " (sets STARTTRACE_FORKSERVER_PRELOAD; what `starttrace advise RUN --preload-list` prints)"
        ),
    ] = None,
) -> None:
    """Run COMMAND with tracing switched on for its whole process tree, then summarize the run."""
    # Long by design: one linear sequence (environment, child, signal forwarding, exit code); split, its steps would
    # only pass the same dozen locals around.
    extra_preload = _preload_option(preload)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARTTRACE_") or k in PASSED_SETTINGS}
    root = _root(directory).resolve()
    env["STARTTRACE"] = "1"
    env["STARTTRACE_DIR"] = str(root)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    run_id = f"{stamp}-{os.urandom(3).hex()}"
    env["STARTTRACE_NEW_RUN_ID"] = run_id
    if service:
        env["STARTTRACE_SERVICE_NAME"] = service
    if extra_preload:
        env["STARTTRACE_FORKSERVER_PRELOAD"] = ",".join(extra_preload)
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise _fail(f"cannot start {command[0]!r}: {exc}", 127) from None
    previous = {sig: signal.signal(sig, lambda s, f: child.send_signal(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    run_dir = root / run_id
    if not quiet:
        if run_dir.is_dir():
            errors.print(f"starttrace: run {run_id} stored in {run_dir}", soft_wrap=True, markup=False, highlight=False)
            try:
                _summary(read_run(run_dir))
            except Exception as exc:  # the traced command's exit code must come through regardless
                errors.print(Text(f"starttrace: no summary: {type(exc).__name__}: {exc}", style="yellow"))
            errors.print(
                f"details: starttrace report {run_id}    web: starttrace serve, then http://127.0.0.1:4318/startup/{run_id}"
            )
        else:
            why = f"no run was recorded in {run_dir} (is {command[0]!r} a Python program?)"
            errors.print(Text(f"starttrace: {why}", style="yellow"))
    raise typer.Exit(code if code >= 0 else 128 - code)


def _preload_option(value: str | None) -> list[str]:
    """`--preload mod,mod`: dotted module names, else a clear error (exit 2)."""
    if value is None:
        return []
    names = [part.strip() for part in value.split(",") if part.strip()]
    bad = [n for n in names if not all(part.isidentifier() for part in n.split("."))]
    if bad or not names:
        raise _fail(f"--preload wants module names separated by commas, not {value!r}")
    return list(dict.fromkeys(names))


def _summary(run: Run) -> None:
    import polars as pl

    model = _model(run)
    table = Table(title=f"run {run.run_id}: {len(run.processes)} processes, startup {model.startup_s:.3f} s")
    for column in ("process", "start", "lane s", "ready at s", "imports", "import s", "status"):
        table.add_column(column, justify="left" if column in ("process", "start", "status") else "right")
    imports_of = dict(model.core.filter(pl.col("phase") == "import").group_by("lane").len().iter_rows())
    for lane in model.lanes:
        ready_at = model.seconds(lane.ready_ns)
        imports = imports_of.get(lane.index, 0)
        if lane.exited:
            status = f"exit {lane.exit_code}" if lane.exit_code is not None else "exited"
        else:
            status = "ready" if lane.ready_ns is not None else ("in progress" if lane.in_progress else "-")
        table.add_row(
            Text(lane.label),
            Text(str(lane.start_method or "-")),
            f"{(lane.end - lane.start) / 1e9:.3f}",
            "-" if ready_at is None else f"{ready_at:.3f}",
            str(imports),
            f"{lane.import_ns / 1e9:.3f}",
            Text(status),
        )
    errors.print(table)


@app.command()
def runs(
    directory: DirOption = None,
    limit: Annotated[int, typer.Option(help="newest N runs")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table")] = False,
) -> None:
    """List recorded runs: time, id, command, processes, status."""
    rows = [_run_row(path) for path in list_run_dirs(_root(directory))[:limit]]
    if as_json:
        console.print_json(strict_json(rows))
        return
    table = Table(title=f"runs in {_root(directory)}")
    for column in ("time (UTC)", "run id", "command", "processes", "status"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["time"], row["run_id"], Text(row["command"]), str(row["processes"]), row["status"])
    console.print(table)


def _run_row(path: Path) -> dict[str, Any]:
    from starttrace.analysis.liveness import run_status
    from starttrace.sources.journal_files import journal_files, read_small
    from starttrace.sources.journal_reader import EmptyRun, ReaderError, read_run

    meta: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        meta = json.loads(read_small(path / "run.json"))  # bounded: a link to /dev/zero never ends
    meta = meta if isinstance(meta, dict) else {}
    try:
        journals = journal_files(path)  # one per process, either format version (docs/journal.md)
    except OSError:
        journals = []  # a folder we may not list: its status says so
    try:  # the model's status (analysis/liveness.py): `report` and the service say the same
        status = run_status(read_run(path))
    except EmptyRun:
        status = "no journal"
    except ReaderError:
        status = "unreadable"
    created = meta.get("created_epoch_ns")
    when = datetime.utcfromtimestamp(created / 1e9).strftime("%Y-%m-%d %H:%M:%S") if isinstance(created, int) else "-"
    argv = meta.get("argv") or []
    return {
        "time": when,
        "run_id": path.name,
        "command": " ".join(str(a) for a in argv)[:80],
        "processes": len(journals),
        "status": status,
    }


@app.command()
def report(
    run_id: RunArgument = None,
    directory: DirOption = None,
    clickhouse: ClickHouseOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="the waterfall model as JSON (what GET /startup returns)")
    ] = False,
    wide: WideOption = False,
    until: UntilOption = Until.ready,
    full: Annotated[
        bool, typer.Option("--full", help="every helper, part, phase, hotspot and path step (default: the summary)")
    ] = False,
) -> None:
    """Per-process startup report of a run: time to ready, the plan, findings, phases, top imports."""
    the_run = _load(run_id, directory, clickhouse)
    model = _model(the_run, until.value.replace("-", "_"))
    if as_json:
        from starttrace.views.json import to_json

        sys.stdout.write(strict_json(to_json(model, include_spans=False), indent=2) + "\n")
        return
    from starttrace.views.terminal import render_report

    render_report(model, console, wide=wide, full=full)


@app.command()
def compare(
    run_a: Annotated[str, typer.Argument(help="run A (e.g. spawn)")],
    run_b: Annotated[str, typer.Argument(help="run B (e.g. forkserver)")],
    directory: DirOption = None,
    clickhouse: ClickHouseOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="the comparison as JSON (what GET /compare returns)")] = False,
    wide: WideOption = False,
    max_regression: Annotated[
        float | None,
        typer.Option(
            "--max-regression",
            metavar="PCT",
            help="CI gate: exit 1 when B's time to ready is more than PCT % slower than A's (like with like);"
            " starts of unlike start kind, configuration or hardware are refused with exit 3",
        ),
    ] = None,
    allow_unlike: Annotated[
        bool, typer.Option("--allow-unlike", help="with --max-regression: gate unlike starts too")
    ] = False,
    until: UntilOption = Until.ready,
) -> None:
    """Run A vs run B: why time to ready changed (causes), per phase, per rank, per module; A's
    preload advice predicted vs realised in B. With --max-regression: a gate for CI (docs/fleet.md)."""
    from starttrace.analysis.compare import compare as compare_models
    from starttrace.views.terminal import render_compare

    end = until.value.replace("-", "_")
    model_a = _model(_load(run_a, directory, clickhouse), end)
    model_b = _model(_load(run_b, directory, clickhouse), end)
    verdict = None
    if max_regression is not None:
        from starttrace.analysis.causes import GATE_UNLIKE, gate

        verdict = gate(model_a, model_b, max_regression, allow_unlike)
        if verdict.code == GATE_UNLIKE:
            sys.stderr.write(f"starttrace compare: {verdict.message}\n")
            raise typer.Exit(verdict.code)
    result = compare_models(model_a, model_b)
    if as_json:
        sys.stdout.write(strict_json(result.to_json(), indent=2) + "\n")
    else:
        render_compare(result, console, wide=wide)
    if verdict is not None:
        sys.stdout.flush()
        sys.stderr.write(f"starttrace compare: {verdict.message}\n")  # one line, never wrapped
        raise typer.Exit(verdict.code)


@app.command()
def advise(
    run_id: RunArgument = None,
    directory: DirOption = None,
    preload_list: Annotated[
        bool,
        typer.Option(
            "--preload-list",
            help="end with one line: the modules to preload, comma-separated"
            " (STARTTRACE_FORKSERVER_PRELOAD=$(starttrace advise RUN --preload-list | tail -n 1))",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="the findings as JSON")] = False,
    wide: WideOption = False,
) -> None:
    """What to do about a run: its findings (preload, unused forkserver, CUDA before fork, stalled,
    stragglers), each with an action."""
    from starttrace.analysis.findings import preload_modules

    model = _model(_load(run_id, directory))
    modules = preload_modules(model.findings)
    if as_json:
        doc = {"run_id": model.run_id, "status": model.status, "findings": model.findings, "preload": modules}
        sys.stdout.write(strict_json(doc, indent=2) + "\n")
        return
    from starttrace.views.terminal import render_advise

    render_advise(model, console, wide=wide)
    if preload_list:
        if not modules:
            errors.print("starttrace: nothing to preload in this run (no preload finding)")
        console.file.flush()
        sys.stdout.write(",".join(modules) + "\n")  # never wrapped: the last line is the list


@app.command()
def export(
    run_id: RunArgument = None,
    directory: DirOption = None,
    clickhouse: ClickHouseOption = None,
    format: Annotated[
        Format, typer.Option("--format", "-f", help="otlp (send), otlp-json, perfetto or jaeger (write)")
    ] = Format.perfetto,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="file to write (default: stdout)")] = None,
    endpoint: Annotated[
        str | None, typer.Option(help="OTLP/HTTP endpoint (default: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT)")
    ] = None,
    detail: Annotated[
        Detail,
        typer.Option(
            help="full: every span, the summary set marked starttrace.summary=true; summary: non-import"
            " spans and each process's longest imports (what Jaeger and Tempo can hold)"
        ),
    ] = Detail.full,
    summary_imports: Annotated[
        str | None,
        typer.Option(help="imports kept per process in the summary (default: $STARTTRACE_SUMMARY_IMPORTS, else 300)"),
    ] = None,
) -> None:
    """Export a run: send it over OTLP/HTTP, or write OTLP/JSON, Perfetto or Jaeger UI JSON."""
    from starttrace.views.export import ENV_SUMMARY_IMPORTS, export_document, parse_import_budget

    try:
        if summary_imports is not None:
            budget = parse_import_budget(summary_imports, "--summary-imports")
        else:
            budget = parse_import_budget(os.environ.get(ENV_SUMMARY_IMPORTS))
    except ValueError as exc:
        raise _fail(str(exc)) from None
    the_run = _load(run_id, directory, clickhouse)
    if format is Format.otlp:
        from starttrace.views.otlp import ExportError, export_run, traces_endpoint

        url = traces_endpoint(endpoint)
        if not url:
            raise _fail("no endpoint: pass --endpoint or set OTEL_EXPORTER_OTLP_ENDPOINT")
        try:
            sent = export_run(the_run, url, detail=detail.value, import_budget=budget)
        except ExportError as exc:
            raise _fail(str(exc), 1) from None
        errors.print(f"starttrace: sent {sent} spans of run {the_run.run_id} ({detail.value} detail) to {url}")
        return

    document = export_document(the_run, format.value, detail=detail.value, import_budget=budget)
    text = strict_json(document)
    if out is None:
        sys.stdout.write(text + "\n")
    else:
        out.write_text(text, encoding="utf-8")
        errors.print(f"starttrace: wrote {out}")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to bind (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (4318 = the OTLP/HTTP default)")] = 4318,
    db: Annotated[
        Path | None, typer.Option(help="SQLite database (default: ~/.local/state/starttrace/starttrace.db)")
    ] = None,
    journal_dir: Annotated[
        Path | None,
        typer.Option(help="journal root to watch (default: $STARTTRACE_DIR or ~/.local/state/starttrace/runs)"),
    ] = None,
    token: Annotated[
        str | None, typer.Option(envvar="STARTTRACE_TOKEN", help="bearer token required on every endpoint but /healthz")
    ] = None,
    retention: Annotated[str | None, typer.Option(help="drop runs older than this (e.g. 7d, 12h)")] = None,
    no_journal: Annotated[bool, typer.Option("--no-journal", help="do not watch a journal dir (OTLP only)")] = False,
    decode_workers: Annotated[
        int, typer.Option(min=0, help="processes decoding OTLP bodies (0: in the service itself)")
    ] = 1,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(help="another name clients call the service by (Host header); loopback names are always accepted"),
    ] = None,
    clickhouse: ClickHouseOption = None,
) -> None:
    """The starttrace service: OTLP/HTTP receiver, /startup waterfalls, /metrics."""
    from starttrace.service.server import serve as run_server
    from starttrace.sources.clickhouse.client import ClickHouseError
    from starttrace.sources.store import SchemaError

    try:
        run_server(
            host=host,
            port=port,
            db=str(db) if db else None,
            journal_dir=None if no_journal else str(journal_dir or default_root()),
            token=token,
            retention=retention,
            decode_workers=decode_workers,
            allow_hosts=allow_host or [],
            clickhouse=clickhouse,
        )
    except (SchemaError, ValueError, ClickHouseError) as exc:
        raise _fail(str(exc)) from None
    except sqlite3.DatabaseError as exc:  # --db names a file that is not SQLite
        raise _fail(f"{db or 'the store'}: not a starttrace store (SQLite): {exc}") from None


@app.command()
def fleet(
    by: Annotated[
        str,
        typer.Option(help="group by this identity key: service.version, vllm.model, tp, pp, dp, host.name, nodes, ..."),
    ] = "service.version",
    since: Annotated[str | None, typer.Option(help="runs started since: epoch seconds, ISO 8601, or 7d")] = None,
    until: Annotated[str | None, typer.Option(help="runs started until: epoch seconds, ISO 8601, or 1h")] = None,
    service: Annotated[str | None, typer.Option(help="only runs of this service.name")] = None,
    clickhouse: ClickHouseOption = None,
    db: Annotated[
        Path | None, typer.Option(help="the embedded store (default: ~/.local/state/starttrace/starttrace.db)")
    ] = None,
    derive: Annotated[bool, typer.Option(help="first derive the facts of runs that lack them (each run once)")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="the answer as JSON (what GET /fleet returns)")] = False,
) -> None:
    """Fleet startup: p50/p95 of time to ready and each phase per value of --by, the slowest runs,
    and (by service.version) the phases that regressed from one version to the next."""
    from starttrace.service.app import _parse_time, default_db_path
    from starttrace.service.fleet import cli_answer
    from starttrace.sources.clickhouse.client import ClickHouseError

    try:
        since_ns, until_ns = _parse_time(since), _parse_time(until)
        answer = cli_answer(by, since_ns, until_ns, service, clickhouse, db or default_db_path(), derive)
    except (ValueError, ClickHouseError) as exc:
        raise _fail(str(exc)) from None
    except sqlite3.DatabaseError as exc:  # --db names a file that is not SQLite
        raise _fail(f"{db or 'the store'}: not a starttrace store (SQLite): {exc}") from None
    if as_json:
        sys.stdout.write(strict_json(answer, indent=2) + "\n")
        return
    from starttrace.views.terminal_fleet import render_fleet

    render_fleet(answer, console)


@app.command()
def demo(
    directory: DirOption = None,
    workdir: Annotated[Path | None, typer.Option(help="where the tiny model and logs go")] = None,
    tp: Annotated[int, typer.Option(help="tensor parallel size")] = 2,
    method: Annotated[
        str,
        typer.Option(
            help="VLLM_WORKER_MULTIPROC_METHOD: spawn (what vLLM does on CPU anyway) or forkserver"
            " (vLLM then also starts a forkserver in the API server: see the unused_forkserver finding)"
        ),
    ] = "spawn",
) -> None:
    """A traced real vLLM startup on CPU (tiny offline model, TP=2), then its per-rank report."""
    from starttrace.demo import run_demo

    if method not in ("spawn", "forkserver", "fork"):
        raise _fail(f"--method must be spawn, forkserver or fork, not {method!r}")
    code = run_demo(journal_root=_root(directory), workdir=workdir, tp=tp, method=method)
    raise typer.Exit(code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
