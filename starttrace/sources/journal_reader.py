"""Source: a run's journals (docs/journal.md) as the run type (`starttrace.run.Run`).

Everything here runs outside traced processes (CLI, exporter, service), so it may use any module.
Times are converted to epoch nanoseconds, parents are resolved across processes, and the
`process` span of every lane ends where its startup ended (its own `ready`, its exit, or the
run's `ready`), so every reader shows the same lanes. The run's span table is built once, at the
end, column by column (`_table`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from starttrace.run import (
    LAUNCHED_BY_KEY,
    MODULE_KEY,
    NOT_PYTHON,
    PHASE_KEY,
    SELF_US_KEY,
    SPAN_SCHEMA,
    Process,
    Run,
    Span,
    as_int64,
    journal_cut,
)
from starttrace.sources.journal_files import (
    CLOCK_PREFIX,
    ReadBudget,
    journal_files,
    journal_lines,
    parse_record,
    read_small,
)
from starttrace.sources.plausible import drop_implausible
from starttrace.tracer.activation import default_journal_root, process_start_monotonic

__all__ = [
    "EmptyRun",
    "Process",
    "ReaderError",
    "Run",
    "RunNotFound",
    "Span",
    "find_run_dir",
    "list_run_dirs",
    "read_run",
]

LAUNCH_SPANS = ("process.fork", "process.launch", "forkserver.start")
READY_SPANS = ("ready", "process.ready")


class ReaderError(Exception):
    """A run cannot be read; the message says why."""


class RunNotFound(ReaderError):
    pass


class EmptyRun(ReaderError):
    pass


def default_root() -> Path:
    """The journal root: STARTTRACE_DIR, else the default the traced processes use."""
    return Path(os.environ.get("STARTTRACE_DIR") or default_journal_root())


def list_run_dirs(root: Path) -> list[Path]:
    """Run folders under `root`, newest first. A folder that cannot be listed is one (`read_run`
    then says why it cannot be read), so that it is named, not silently left out."""
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if _is_run_dir(p)]
    return sorted(runs, key=_created_key, reverse=True)


def _is_run_dir(path: Path) -> bool:
    try:
        if not path.is_dir():
            return False
        return (path / "run.json").exists() or any(journal_files(path))
    except OSError:
        return True  # a folder we may not look into (permissions): named by read_run's error


def _created_key(run_dir: Path) -> tuple[str, float, str]:
    """When a run folder was made: its name's timestamp (YYYYmmdd-HHMMSS-...), else (a job's run id,
    `torchrun-3ccd86412979`, docs/multinode.md) the time of its run.json, in the same form."""
    name = run_dir.name
    if len(name) > 15 and name[8] == "-" and name[:8].isdigit() and name[9:15].isdigit():
        return name[:15], run_dir.stat().st_mtime, name
    try:
        meta = run_dir / "run.json"
        mtime = (meta if meta.exists() else run_dir).stat().st_mtime
    except OSError:
        mtime = 0.0
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(mtime)), mtime, name


def find_run_dir(root: Path, run_id: str | None) -> Path:
    """The folder of `run_id` (a unique prefix is enough), or the newest run when None."""
    if run_id is not None and not run_id.strip():
        raise RunNotFound(f"a run id is required: the one given is empty ({run_id!r}); `starttrace runs` lists them")
    runs = list_run_dirs(root)
    if run_id is None:
        if not runs:
            raise RunNotFound(f"no runs in {root}")
        return runs[0]
    candidate = Path(run_id)
    if candidate.is_dir():
        return candidate
    exact = [p for p in runs if p.name == run_id]
    matches = exact or [p for p in runs if p.name.startswith(run_id)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise RunNotFound(f"unknown run id {run_id!r} (in {root})")
    raise RunNotFound(f"run id {run_id!r} is ambiguous: {', '.join(p.name for p in matches[:5])}")


MAX_EXAMPLES = 3  # malformed lines named one by one per journal; the rest are counted
MAX_WARNINGS = 20  # a process's own `warn` records kept (the first ones, and its last)
MAX_WARNING_CHARS = 1000
MAX_SKIPPED_NOTES = 20


@dataclass
class _ParsedJournal:
    record: dict[str, Any]
    spans: dict[str, Span]
    ends: list[dict[str, Any]]
    attrs: dict[str, Any]
    warnings: list[str]
    problems: list[str]


def _parse_journal(path: Path, budget: ReadBudget | None = None) -> _ParsedJournal | str:
    """Parse one journal, within the run's read `budget`; a string is the reason the whole file
    was skipped. Malformed lines are counted, the first MAX_EXAMPLES named; `warn` records are kept
    up to MAX_WARNINGS (the last one always: a journal cut short says why last)."""
    # Long by design: one pass over a journal's records, one branch per record kind (docs/journal.md); kept in one loop
    # for speed on 100k-record journals.
    try:
        lines = journal_lines(path, budget)  # either version; a version 2 journal's segments joined
    except OSError as exc:
        return f"cannot read {path.name}: {exc}"
    record: dict[str, Any] | None = None
    spans: dict[str, Span] = {}
    ends: list[dict[str, Any]] = []
    attrs: dict[str, Any] = {}
    warnings: list[str] = []
    problems: list[str] = []
    mono = epoch = 0
    malformed = 0
    dropped_warnings = 0
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            item = parse_record(raw)
        except ValueError:
            last = number == len(lines) or (number == len(lines) - 1 and not lines[-1])
            if last:
                problems.append(f"skipped cut last line {number} of {path.name}")
            else:
                malformed += 1
                if malformed <= MAX_EXAMPLES:
                    problems.append(f"skipped malformed line {number} of {path.name}")
            continue
        kind = item.get("k")
        if record is None:
            if kind != "process":
                return f"skipped {path.name}: first record is not a process record"
            record = item
            try:
                mono, epoch = int(item["anchor_mono"]), int(item["anchor_epoch"])
            except (KeyError, TypeError, ValueError):
                return f"skipped {path.name}: process record without a clock anchor"
            continue
        try:
            if kind == "b" or kind == "i":
                start = int(item["t"]) - mono + epoch
                span = Span(
                    span_id=str(item["s"]),
                    parent_id=item.get("p"),
                    name=str(item["n"]),
                    start_ns=start,
                    end_ns=start if kind == "i" else None,
                    attrs=dict(item.get("a") or {}),
                    thread=item.get("th"),
                    instant=kind == "i",
                )
                spans[span.span_id] = span
            elif kind == "e":
                end_id = str(item["s"])
                ends.append(
                    {
                        "s": end_id,
                        "t": int(item["t"]) - mono + epoch if "dt" not in item else spans[end_id].start_ns + item["dt"],
                        "a": item.get("a"),
                        "err": item.get("err"),
                    }
                )
            elif kind == "attrs":
                attrs.update(item.get("a") or {})
            elif kind == "warn":
                if len(warnings) >= MAX_WARNINGS:
                    dropped_warnings += 1
                    warnings.pop()  # the last one stays last (journal_cut reads it)
                warnings.append(str(item.get("msg", ""))[:MAX_WARNING_CHARS])
        except (KeyError, TypeError, ValueError):
            malformed += 1
            if malformed <= MAX_EXAMPLES:
                problems.append(f"skipped malformed record on line {number} of {path.name}")
    if malformed > MAX_EXAMPLES:
        problems.append(f"skipped {malformed - MAX_EXAMPLES} more malformed lines of {path.name} ({malformed} in all)")
    if dropped_warnings:
        problems.append(f"{path.name}: {dropped_warnings} more warn records than the {MAX_WARNINGS} kept")
    if record is None:
        return f"skipped {path.name}: empty journal"
    return _ParsedJournal(record, spans, ends, attrs, warnings, problems)


def _resource(record: dict[str, Any], attrs: dict[str, Any], run_id: str) -> dict[str, Any]:
    resource: dict[str, Any] = {
        "service.name": record.get("service") or "python",
        "service.instance.id": record.get("iid", ""),
        "process.pid": int(record.get("pid", 0)),
        "process.parent_pid": int(record.get("ppid", 0)),
        "process.command_args": [str(a) for a in record.get("argv") or []],
        "process.executable.path": record.get("exe", ""),
        "process.runtime.name": "cpython",
        "process.runtime.version": record.get("python", ""),
        "host.name": record.get("host", ""),
        "starttrace.run_id": run_id,
        "starttrace.start_method": record.get("method", "exec"),
    }
    resource.update(attrs)
    if not resource.get("starttrace.role"):
        resource["starttrace.role"] = "main" if record.get("method") == "root" else "helper"
    return resource


def process_alive(pid: int, created_mono: int, host: str) -> bool | None:
    """Is the journal's process still running (same pid, same creation time)? None: another host."""
    if host and host != os.uname().nodename:
        return None
    started = process_start_monotonic(pid)
    if started is None or started[1] == b"Z":
        return False
    tick = 10**9 // os.sysconf("SC_CLK_TCK")
    return abs(started[0] - created_mono) < 2 * tick + 50_000_000


def read_run(run_dir: Path) -> Run:
    # Long by design: the reader's steps in order (parse, merge ends, processes, parents, lane ends, self times); each
    # step that is more than a few lines is its own function.
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunNotFound(f"no run at {run_dir}")
    meta: dict[str, Any] = {}
    problems: list[str] = []
    meta_path = run_dir / "run.json"
    try:
        if meta_path.exists() or meta_path.is_symlink():
            meta = json.loads(read_small(meta_path).decode("utf-8") or "{}")
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
    except (ValueError, OSError) as exc:
        meta = {}
        problems.append(f"run.json unreadable: {exc}")
    try:
        paths = journal_files(run_dir)
    except OSError as exc:
        raise ReaderError(f"run {run_dir.name} is unreadable: cannot list its folder ({exc.strerror or exc})") from None
    parsed: list[tuple[Path, _ParsedJournal]] = []
    budget = ReadBudget()
    for path in paths:
        result = _parse_journal(path, budget)
        if isinstance(result, str):
            problems.append(result)
        else:
            parsed.append((path, result))
            problems.extend(result.problems)
    problems.extend(budget.skipped[:MAX_SKIPPED_NOTES])
    if len(budget.skipped) > MAX_SKIPPED_NOTES:
        problems.append(f"{len(budget.skipped) - MAX_SKIPPED_NOTES} more journal files cut or skipped (the run's cap)")
    if not parsed:
        why = "; ".join(problems) if problems else "no journal files"
        raise EmptyRun(f"run {run_dir.name} has no readable journal ({why})")
    run_id = str(meta.get("run_id") or parsed[0][1].record.get("run") or run_dir.name)
    trace_id = str(meta.get("trace_id") or parsed[0][1].record.get("trace") or "")
    root_span_id = str(meta.get("root_span_id") or parsed[0][1].record.get("root_span") or "")

    all_spans: dict[str, Span] = {}
    for _, journal in parsed:
        all_spans.update(journal.spans)
    for _, journal in parsed:
        for end in journal.ends:
            span = all_spans.get(end["s"])
            if span is None or span.instant:
                continue
            if span.end_ns is None or end["t"] < span.end_ns:
                span.end_ns = max(end["t"], span.start_ns)
            if end["a"]:
                span.attrs.update(end["a"])
            if end["err"] is not None:
                span.error = str(end["err"])

    # one root span per node of a multi-node run: each node's root process names its own
    root_ids = dict.fromkeys([root_span_id] + [str(j.record.get("root_span") or "") for _, j in parsed])
    root_spans = sorted((all_spans.pop(i) for i in root_ids if i in all_spans), key=lambda s: s.start_ns)
    owned: list[tuple[Process, list[Span]]] = []  # each process with its spans (sorted by start)
    for path, journal in parsed:
        record = journal.record
        mono, epoch = int(record["anchor_mono"]), int(record["anchor_epoch"])
        resource = _resource(record, journal.attrs, run_id)
        spans = [s for s in journal.spans.values() if s.span_id in all_spans]
        process_span = str(record.get("span", ""))
        exit_span = all_spans.get(process_span)
        exit_code = exit_span.attrs.get("process.exit_code") if exit_span else None
        created_mono = int(record.get("created", record.get("activated", mono)))
        process = Process(
            instance_id=str(record.get("iid", path.stem)),
            pid=int(record.get("pid", 0)),
            ppid=int(record.get("ppid", 0)),
            journal_path=path,
            resource=resource,
            process_span_id=process_span,
            exited=exit_span is not None and exit_span.end_ns is not None,
            exit_code=exit_code if isinstance(exit_code, int) else None,
            warnings=journal.warnings,
            preloaded=[str(m) for m in record.get("preloaded") or []],
            created_ns=created_mono - mono + epoch,
            activated_ns=int(record.get("activated", mono)) - mono + epoch,
            record=record,
        )
        host = str(record.get("host", ""))
        process.alive = False if process.exited else process_alive(process.pid, created_mono, host)
        owned.append((process, sorted(spans, key=lambda s: s.start_ns)))

    _add_clock_states(run_dir, [p for p, _ in owned])
    problems.extend(missing_problems(run_dir, owned))
    _resolve_parents(owned, root_spans, all_spans, {root_span_id, *(s.span_id for s in root_spans)})
    _end_process_lanes(owned, root_spans)
    _import_self_times(owned)
    for span in root_spans:
        span.in_progress = span.end_ns is None
    owned.sort(key=lambda item: item[0].created_ns)
    processes = [p for p, _ in owned]
    service = meta.get("service") if isinstance(meta.get("service"), str) else None
    spans = _table(owned)
    run = Run(run_id, trace_id, root_span_id, meta, processes, problems, root_spans, spans, run_dir, service=service)
    drop_implausible(run)
    return run


# one encoder (json.dumps(default=...) makes one per call); compact: the text is what the store keeps
_encode = json.JSONEncoder(default=str, separators=(",", ":")).encode
_I64 = (-(2**63), 2**63 - 1)


def _table(owned: list[tuple[Process, list[Span]]]) -> pl.DataFrame:
    """The processes' spans as the run's span table (`run.SPAN_SCHEMA`), built column by column
    (the values `run.spans_table` gives span by span)."""
    spans = [span for _, own in owned for span in own]
    lanes = [p.instance_id for p, own in owned for _ in own]
    attrs = [s.attrs for s in spans]
    lo, hi = _I64
    starts = [s.start_ns for s in spans]
    ends = [s.end_ns for s in spans]
    if not all(lo <= t <= hi for t in starts):
        starts = [as_int64(t) for t in starts]
    if not all(t is None or lo <= t <= hi for t in ends):
        ends = [t if t is None else as_int64(t) for t in ends]
    cols: dict[str, Any] = {
        "lane": lanes,
        "span_id": [s.span_id for s in spans],
        "parent_id": [s.parent_id for s in spans],
        "name": [s.name for s in spans],
        "start": starts,
        "end": ends,
        "in_progress": [s.in_progress or s.end_ns is None for s in spans],
        "instant": [s.instant for s in spans],
        "error": [s.error for s in spans],
        "thread": [t if type(t) is int and lo <= t <= hi else None for t in (s.thread for s in spans)],
        "phase": [v if type(v) is str and v else None for v in (a.get(PHASE_KEY) for a in attrs)],
        "module": [v if type(v) is str else None for v in (a.get(MODULE_KEY) for a in attrs)],
        "self_us": [float(v) if type(v) in (int, float) else None for v in (a.get(SELF_US_KEY) for a in attrs)],
        "launched_by": [v if type(v) is str and v else None for v in (a.get(LAUNCHED_BY_KEY) for a in attrs)],
        "attrs": [_encode(a) if a else None for a in attrs],
        "attrs_pb": [None] * len(spans),
    }
    return pl.DataFrame(cols, schema=SPAN_SCHEMA)


def _own_span(process: Process, spans: list[Span]) -> Span | None:
    return next((span for span in spans if span.span_id == process.process_span_id), None)


# a run folder's file system with less free than a journal's first segment: "the disk is full"
_FULL_DISK_BYTES = 256 * 1024
_PYTHON = re.compile(r"(^|/)(python|pypy)[0-9.]*[a-z]?$")
_STARTING_NS = 5 * 10**9  # a child alive this soon after its launch may not have opened its journal yet


def missing_problems(run_dir: Path, owned: list[tuple[Process, list[Span]]]) -> list[str]:
    """What the run lacks, for its `problems`: every journal cut short (its own warning), and every
    child a traced process launched (`starttrace.child_pid` of a launch, fork or forkserver start)
    that has no journal, with the reason where the evidence gives one: the disk was full, it was
    killed (by signal N) or exited before tracing started in it, it is not a Python process."""
    out: list[str] = []
    processes = [p for p, _ in owned]
    for p in processes:
        cut = journal_cut(p.warnings)
        if cut is not None:
            out.append(f"journal of {p.label()} cut short: {cut}")
    here = os.uname().nodename
    have = {(p.host, p.pid) for p in processes}
    exits: dict[tuple[str, int], int] = {}  # (host, pid) -> exit code a wait of the parent saw
    launched: dict[tuple[str, int], tuple[Process, Span]] = {}
    for p, spans in owned:
        for span in spans:
            child = span.attrs.get("starttrace.child_pid")
            if not isinstance(child, int) or isinstance(child, bool) or child <= 0:
                continue
            code = span.attrs.get("process.exit_code")
            if isinstance(code, int) and not isinstance(code, bool):
                exits[(p.host, child)] = code
            if span.name in LAUNCH_SPANS and (p.host, child) not in have:
                launched.setdefault((p.host, child), (p, span))
    if not launched:
        return out
    full = False
    with contextlib.suppress(OSError):
        st = os.statvfs(run_dir)
        full = st.f_bavail * st.f_frsize < _FULL_DISK_BYTES
    full = full or any("No space left" in w or "ENOSPC" in w for p in processes for w in p.warnings)
    for (host, pid), (parent, span) in sorted(launched.items(), key=lambda kv: kv[1][1].start_ns):
        command = str(span.attrs.get("process.command") or "")
        first = command.split(" ", 1)[0]
        code = exits.get((host, pid))
        if full:
            why = "the disk is full: no journal could be created"
        elif span.name == "process.launch" and first and not _PYTHON.search(first) and "python" not in first:
            why = f"{NOT_PYTHON} ({first})"
        elif code is not None and code < 0:
            why = f"killed by signal {-code} before tracing started in it"
        elif code is not None:
            why = f"exited with code {code} before tracing started in it (or tracing is off in it)"
        elif host and host != here:
            why = "no journal from its host"
        elif process_start_monotonic(pid) is None:
            why = "gone before tracing started in it (killed, or not a Python process)"
        elif time.time_ns() - (span.end_ns or span.start_ns) < _STARTING_NS:
            continue  # launched a moment ago: its tracing may still be starting
        else:
            why = "running but not traced (tracing off in it, or not a Python process)"
        what = f" `{command[:80]}`" if command else ""
        out.append(f"pid {pid} launched by {parent.label()} ({span.name}{what}) has no journal: {why}")
    return out


def _add_clock_states(run_dir: Path, processes: list[Process]) -> None:
    """The kernel's NTP state per host, from the run folder's clock files (a root's helper wrote
    them: `starttrace.clocksync.record`), on every process of that host's kernel."""
    states: dict[str, dict[str, Any]] = {}  # kernel boot id -> NTP attributes
    for path in sorted(run_dir.glob(f"{CLOCK_PREFIX}*.json")):
        try:
            body = json.loads(read_small(path))
            boot, attrs = str(body["domain"]).partition("/")[0], body["attrs"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(attrs, dict):
            states.setdefault(boot, {}).update(attrs)
    for process in processes if states else ():
        for key, value in states.get(process.clock_domain.partition("/")[0], {}).items():
            process.resource.setdefault(key, value)


def _resolve_parents(
    owned: list[tuple[Process, list[Span]]], root_spans: list[Span], all_spans: dict[str, Span], root_ids: set[str]
) -> None:
    launches: dict[tuple[str, int], list[Span]] = {}
    own_spans = {id(p): _own_span(p, spans) for p, spans in owned}
    for process, spans in owned:
        for span in spans:
            child = span.attrs.get("starttrace.child_pid")
            if span.name in LAUNCH_SPANS and isinstance(child, int):
                launches.setdefault((process.clock_domain, child), []).append(span)
    by_pid = {(p.clock_domain, p.pid): p for p, _ in owned}  # pids repeat across hosts
    fallback_root = root_spans[0].span_id if root_spans else None
    node_roots = {  # the root span of each host's (clock domain's) tree
        p.clock_domain: own.parent_id
        for p, _ in owned
        if (own := own_spans[id(p)]) is not None
        and own.parent_id in root_ids
        and p.resource.get("starttrace.start_method") == "root"
    }
    for process, spans in owned:
        own = own_spans[id(process)]
        if own is None:
            continue
        candidates = launches.get((process.clock_domain, process.pid), [])
        forks = [s for s in candidates if s.name == "process.fork"]
        requests = [s for s in candidates if s.name != "process.fork"]
        if own.parent_id not in all_spans and own.parent_id not in root_ids:
            parent_process = by_pid.get((process.clock_domain, process.ppid))
            if forks:
                own.parent_id = forks[0].span_id
            elif requests:
                own.parent_id = requests[0].span_id
            elif parent_process is not None and parent_process is not process:
                own.parent_id = parent_process.process_span_id
            else:
                own.parent_id = node_roots.get(process.clock_domain, fallback_root)
        # A forkserver child hangs under the forkserver's fork; the requester's launch is a link
        # (the table's `launched_by` column).
        launch = next((s for s in requests if s.span_id != own.parent_id and s.name == "process.launch"), None)
        if launch is not None:
            own.attrs["starttrace.launched_by"] = launch.span_id
        ids = {s.span_id for s in spans}
        for span in spans:
            if span is own:
                continue
            if span.parent_id not in ids and span.parent_id not in all_spans and span.parent_id not in root_ids:
                span.parent_id = own.span_id


def _end_process_lanes(owned: list[tuple[Process, list[Span]]], root_spans: list[Span]) -> None:
    run_ready = None
    for _, spans in owned:
        for span in spans:
            if span.name == "ready":
                run_ready = span.start_ns if run_ready is None else min(run_ready, span.start_ns)
    for root in root_spans if run_ready is not None else []:  # every node's root ends at the run's ready
        if root.end_ns is None or root.end_ns > run_ready:
            root.end_ns = max(run_ready, root.start_ns)
    for process, spans in owned:
        own = _own_span(process, spans)
        if own is None:
            continue
        ready = min((s.start_ns for s in spans if s.name in READY_SPANS), default=None)
        if ready is not None:
            own.end_ns = ready
            own.attrs["starttrace.ended_by"] = "ready"
        elif own.end_ns is not None:
            own.attrs.setdefault("starttrace.ended_by", "exit")
        elif run_ready is not None and own.start_ns <= run_ready:
            own.end_ns = max(run_ready, own.start_ns)
            own.attrs["starttrace.ended_by"] = "run_ready"


def _import_self_times(owned: list[tuple[Process, list[Span]]]) -> None:
    for _, spans in owned:
        children: dict[str, int] = {}
        for span in spans:
            if span.parent_id and span.end_ns is not None:
                children[span.parent_id] = children.get(span.parent_id, 0) + (span.end_ns - span.start_ns)
        for span in spans:
            if span.end_ns is not None and span.attrs.get("starttrace.phase") == "import":
                own = span.end_ns - span.start_ns - children.get(span.span_id, 0)
                probes = span.attrs.get("starttrace.import.probe_ns")  # starttrace's own time, not the module's
                if isinstance(probes, int) and not isinstance(probes, bool):
                    own -= probes
                span.attrs["starttrace.import.self_us"] = max(0, own) // 1000
