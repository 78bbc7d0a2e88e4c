"""Terminal views (rich) of the waterfall model: `starttrace report`, `compare` and `advise`.

Every table is sized to the console before rich sees it: headers are never cut, and a module name
that does not fit is abbreviated from the left at a component boundary (`…openai.api_server`).
`wide=True` (`--wide`) abbreviates nothing and lets tables be as wide as their content.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from starttrace.analysis.compare import Comparison
from starttrace.analysis.critical_path import path_by_lane, path_phases
from starttrace.analysis.findings.compile import compile_facts
from starttrace.analysis.findings.weights import weight_facts
from starttrace.analysis.first_request import first_request_summary
from starttrace.analysis.model import STRUCTURAL_PHASES, RunModel
from starttrace.analysis.nodes import node_rows
from starttrace.run import NOT_PYTHON

ELLIPSIS = "…"
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
Cell = str | Callable[[int], str]  # fixed text, or text made to fit a width


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def abbreviate(name: str, width: int) -> str:
    """`name` in at most `width` characters: whole if it fits, else `…` and as many of its last
    dotted components as fit (a single component too long for the width keeps its end)."""
    if len(name) <= width:
        return name
    if width <= 1:
        return ELLIPSIS[:width]
    parts = name.split(".")
    kept = parts[-1]
    for part in reversed(parts[:-1]):
        if len(part) + 1 + len(kept) + 1 > width:
            break
        kept = f"{part}.{kept}"
    if len(kept) + 1 > width:
        return ELLIPSIS + kept[-(width - 1) :]
    return ELLIPSIS + kept


def _span_name(name: str) -> Callable[[int], str]:
    """A span name fitted to a width: an import's module is abbreviated, other names cut at the end."""

    def fit(width: int) -> str:
        if name.startswith("import ") and len(name) > width:
            return "import " + abbreviate(name[7:], width - 7)
        if len(name) <= width:
            return name
        return abbreviate(name, width) if "." in name else name[: max(0, width - 1)] + ELLIPSIS

    return fit


def _module_with(module: str, suffix: str) -> Callable[[int], str]:
    return lambda width: f"{abbreviate(module, width - len(suffix) - 1)} {suffix}"


@dataclass
class Col:
    header: str
    justify: str = "left"
    flex: bool = False  # the column that gives way (its cells are fitted to the width left)
    cells: list[Cell] = field(default_factory=list)

    def natural(self) -> int:
        widths = [len(c if isinstance(c, str) else c(10_000)) for c in self.cells]
        return max([len(self.header), *widths])


def _row(cols: Sequence[Col], *cells: Cell) -> None:
    for col, cell in zip(cols, cells, strict=True):
        col.cells.append(cell)


def _table(console: Console, title: str | None, cols: Sequence[Col], wide: bool = False) -> None:
    """A table fitted to the console: fixed columns at their natural width (never below their
    header), the flexible ones share what is left (at least their header)."""
    widths = [c.natural() for c in cols]
    overhead = 3 * len(cols) - 3
    room = console.width
    flex = [i for i, c in enumerate(cols) if c.flex]
    if not wide and sum(widths) + overhead > room and flex:
        fixed = sum(w for i, w in enumerate(widths) if i not in flex)
        left = max(0, room - overhead - fixed)
        for i in flex:
            widths[i] = max(len(cols[i].header), min(widths[i], left // len(flex)))
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left")
    for c, w in zip(cols, widths, strict=True):
        table.add_column(c.header, justify=c.justify, no_wrap=True, min_width=w, max_width=w, overflow="crop")  # type: ignore[arg-type]
    for row in range(max((len(c.cells) for c in cols), default=0)):
        values = []
        for c, w in zip(cols, widths, strict=True):
            cell = c.cells[row] if row < len(c.cells) else ""
            values.append(Text(cell if isinstance(cell, str) else cell(w)))
        table.add_row(*values)
    if wide:
        console.print(table, width=max(console.width, sum(widths) + overhead), crop=False)
    else:
        console.print(table)


def render_findings(findings: list[dict[str, Any]], console: Console, title: str = "findings") -> None:
    """Numbered findings, most severe first: `[severity] kind: text`, then `-> action`; names whole,
    lines wrapped at spaces."""
    if not findings:
        console.print(Text(f"{title}: none", style="green"))
        return
    console.print(Text(title, style="bold"))
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, justify="right")
    grid.add_column(ratio=1, overflow="fold")
    for i, f in enumerate(findings, 1):
        line = Text()
        line.append(f"[{f['severity']}] {f['kind']}: ", style=SEVERITY_STYLE.get(f["severity"], ""))
        line.append(f["text"])
        grid.add_row(f"{i}.", line)
        if f.get("action"):
            grid.add_row("", Text(f"-> {f['action']}", style="dim"))
    console.print(grid)


def render_report(model: RunModel, console: Console, wide: bool = False) -> None:
    """`starttrace report`: findings first, then processes, phases, open spans, imports, the path."""
    _report_head(model, console)
    _first_token_line(model, console)
    render_findings(model.findings, console)
    _nodes(model, console, wide)
    _processes(model, console, wide)
    _phases(model, console, wide)
    _weights_and_compile(model, console, wide)
    _in_progress(model, console, wide)
    _hotspots(model, console, wide)
    _cuda_line(model, console)
    _critical_path(model, console, wide)


def _report_head(model: RunModel, console: Console) -> None:
    console.print(
        Text.assemble((f"run {model.run_id}", "bold"), f"  service {model.service or '-'}  status {model.status}")
    )
    console.print(
        f"startup {model.startup_s:.3f} s  processes {len(model.lanes)}  spans {model.spans.height}", markup=False
    )
    programs: Counter[str] = Counter()
    for problem in model.problems:
        found = _NOT_PYTHON.search(problem)
        if found:  # expected (uname, lscpu, gcc, ...): one line for all of them, the JSON lists each
            programs[found.group(1)] += 1
            continue
        console.print(Text(f"warning: {problem}", style="yellow"))
    if programs:
        names = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in sorted(programs.items()))
        console.print(
            Text(f"note: {sum(programs.values())} launched children are not Python processes, so not traced: {names}")
        )


def _first_token_line(model: RunModel, console: Console) -> None:
    """Time to first token (the first served request, analysis/first_request.py) and the lazy
    work in it; with `--until first-token`, what the tables below end at."""
    summary = first_request_summary(model)
    if summary is None or summary["time_to_first_token_s"] is None:
        if model.until == "first_token":
            console.print("time to first token: - (no request served)", markup=False)
        return
    line = f"time to first token {summary['time_to_first_token_s']:.3f} s"
    if summary["ready_to_request_s"] is not None:
        line += f"  (request came {summary['ready_to_request_s']:.3f} s after ready"
        line += f", {summary['request_s']:.3f} s to its first token)" if summary["request_s"] is not None else ")"
    if summary["lazy"]:
        line += "  lazy work in it: " + ", ".join(f"{k} {v:.3f} s" for k, v in summary["lazy"].items())
    console.print(line, markup=False)
    if model.until == "first_token":
        console.print("breakdowns and the critical path below end at the first token (--until first-token)")


_NOT_PYTHON = re.compile(rf"has no journal: {re.escape(NOT_PYTHON)} \((.+)\)$")


def _nodes(model: RunModel, console: Console, wide: bool) -> None:
    """Several hosts: one row per node, with its clock's offset and error (docs/multinode.md)."""
    rows = node_rows(model)
    if not rows:
        return
    cols = [Col("node"), Col("ranks"), Col("procs", "right"), Col("offset ms", "right"), Col("± ms", "right")]
    cols += [Col("aligned by"), Col("NTP", flex=True)]
    for row in rows:
        ntp = row["ntp"] or {}
        synced = {True: "synced", False: "NOT synced"}.get(ntp.get("ntp_synced"), "-")
        if isinstance(ntp.get("esterror_us"), (int, float)):
            synced += f" (est. error {ntp['esterror_us'] / 1000:.1f} ms)"
        offset = "-" if row["offset_ns"] is None else f"{row['offset_ns'] / 1e6:+.3f}"
        error = "-" if row["error_ns"] is None else f"{row['error_ns'] / 1e6:.3f}"
        clock = (offset, error, row["method"] or "-", synced)
        _row(cols, row["node"], _ranks_text(row["ranks"]), str(len(row["lanes"])), *clock)
    _table(console, "nodes (offset: its clock minus the first node's, taken off its times)", cols, wide)


def _ranks_text(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def _processes(model: RunModel, console: Console, wide: bool) -> None:
    many = wide or console.width >= 140
    cols = [
        Col("node" if any(lane.node for lane in model.lanes) else "process"),
        Col("start"),
        Col("ready s", "right"),
        Col("import s", "right"),
        Col("cover", "right"),
        Col("top 5 imports (s)" if many else "top import (s)", flex=True),
    ]
    for lane in model.lanes:
        if lane.after_ready:
            continue  # one line under the breakdown table
        tops = lane.top_imports if many else lane.top_imports[:1]
        if many:
            top: Cell = ", ".join(f"{m} {d / 1e9:.3f}" for m, d in tops)
        else:
            top = _module_with(tops[0][0], f"{tops[0][1] / 1e9:.3f}") if tops else ""
        label = f"{lane.node}  {lane.label}" if lane.node else lane.label
        ready, imports = _s(model.seconds(lane.ready_ns)), f"{lane.import_ns / 1e9:.3f}"
        coverage = "-" if lane.coverage is None else f"{lane.coverage * 100:.0f}%"
        _row(cols, label, lane.start_method or "-", ready, imports, coverage, top)
    _table(console, "processes", cols, wide)


def _phases(model: RunModel, console: Console, wide: bool) -> None:
    """Each process's exclusive breakdown of its time to ready (the parts add up to it); the
    processes that started after the run was ready on one line."""
    lanes = [lane for lane in model.lanes if lane.breakdown]
    if not lanes:
        return
    totals: Counter[str] = Counter()
    for lane in lanes:
        totals.update(lane.breakdown)
    # as many columns as the console has room for, the costliest first (all of them are in
    # `report --json` and on the web page)
    label_w = max(len(lane.label) for lane in lanes)
    room = console.width - label_w - 10
    shown: list[str] = []
    for label in sorted(totals, key=lambda k: (-totals[k], k)):
        need = max(len(label), 7) + 3
        if not wide and room - need < 0:
            continue
        room -= need
        shown.append(label)
    hidden = len(totals) - len(shown)
    title = "where each process's time to ready went (s; exclusive: the parts add up to its total)" + (
        f" ({hidden} more parts in --json)" if hidden else ""
    )
    cols = [Col("process"), Col("total", "right")] + [Col(label, "right") for label in shown]
    for lane in lanes:
        parts = [lane.breakdown.get(label) for label in shown]
        _row(cols, lane.label, _s((lane.end - lane.start) / 1e9), *(_s(ns / 1e9) if ns else "" for ns in parts))
    _table(console, title, cols, wide)
    later = [lane for lane in model.lanes if lane.after_ready]
    if later:
        roles = sorted({lane.role or "process" for lane in later})
        pids = ", ".join(str(lane.pid) for lane in later[:8]) + (", ..." if len(later) > 8 else "")
        console.print(
            f"after ready: {len(later)} more process(es) ({', '.join(roles)}; pids {pids}), not part of time to ready"
        )
    by_phase = path_phases(model)
    if by_phase:
        cols = [Col("phase", flex=True), Col("seconds", "right"), Col("share", "right")]
        total = sum(by_phase.values()) or 1
        for label, ns in by_phase.items():
            _row(cols, label, f"{ns / 1e9:.3f}", f"{ns / total:.0%}")
        _table(console, "time to ready by phase", cols, wide)


def _weights_and_compile(model: RunModel, console: Console, wide: bool) -> None:
    """Per process that read weight files or compiled graphs: files, GB, GB/s, filesystem; graphs,
    compile-cache hits and misses, its compile seconds and the cache directory."""
    weights = {f["lane"]: f for f in weight_facts(model)}
    compiled = {row["lane"]: row for row in compile_facts(model).to_dicts()}
    if not weights and not compiled:
        return
    heads = ("files", "GB", "load s", "GB/s", "fs", "graphs", "hit", "miss", "compile s")
    cols = [Col("process")] + [Col(h, "right") for h in heads] + [Col("compile cache", flex=True)]
    for index in sorted(set(weights) | set(compiled)):
        w, c = weights.get(index), compiled.get(index)
        _row(
            cols,
            model.lanes[index].label,
            str(w["files"]) if w else "",
            f"{w['bytes'] / 1e9:.3f}" if w else "",
            _s(w["seconds"]) if w else "",
            f"{w['gbps']:.2f}" if w and w["gbps"] is not None else "",
            ",".join(w["fs_types"]) if w else "",
            str(c["graphs"]) if c else "",
            str(c["hits"]) if c else "",
            str(c["misses"]) if c else "",
            _s(model.lanes[index].breakdown.get("compile", 0) / 1e9) if c else "",
            ", ".join(c["cache_dirs"]) if c else "",
        )
    _table(console, "weights and compile", cols, wide)


def _in_progress(model: RunModel, console: Console, wide: bool) -> None:
    open_spans = [
        (lane, n)
        for lane in model.lanes
        for n in lane.in_progress
        if n is not lane.process_span and n.phase not in STRUCTURAL_PHASES
    ]
    if not open_spans:
        return
    cols = [Col("process"), Col("span", flex=True), Col("open for s", "right")]
    for lane, n in sorted(open_spans, key=lambda x: x[1].start - x[1].eff_end)[:20]:
        _row(cols, lane.label, _span_name(n.name), f"{(n.eff_end - n.start) / 1e9:.3f}")
    _table(console, "in progress", cols, wide)


def _hotspots(model: RunModel, console: Console, wide: bool) -> None:
    if not model.hotspots:
        return
    cols = [Col("module", flex=True)] + [Col(h, "right") for h in ("cumulative s", "self s", "procs", "ranks")]
    for h in model.hotspots[:15]:
        cells = (f"{h['cumulative_s']:.3f}", f"{h['self_s']:.3f}", str(h["processes"]), str(h["ranks_paid"]))
        _row(cols, _fit_module(h["module"]), *cells)
    _table(console, "import hotspots (ranks: how many ranks paid for it)", cols, wide)


def _fit_module(module: str) -> Callable[[int], str]:
    return lambda width: abbreviate(module, width)


def _cuda_line(model: RunModel, console: Console) -> None:
    audit = model.cuda_audit
    if audit and not audit.get("issues"):
        console.print(Text("CUDA audit: clean", style="green"))  # issues are findings (cuda_before_fork)


def _critical_path(model: RunModel, console: Console, wide: bool) -> None:
    if not model.critical_path:
        return
    cols = [Col("process"), Col("span", flex=True), Col("start s", "right"), Col("seconds", "right")]
    steps = sorted(model.critical_path, key=lambda st: st.start - st.end)[:15]
    for st in sorted(steps, key=lambda st: st.start):
        suffix = "" if st.kind == "span" else f" ({st.kind})"
        name = _with_suffix(st.name, suffix)
        _row(cols, model.lanes[st.lane].label, name, _s(model.seconds(st.start)), f"{(st.end - st.start) / 1e9:.3f}")
    _table(console, "critical path to ready", cols, wide)
    shares = path_by_lane(model.critical_path)
    if len(shares) > 1:
        total = sum(ns for _, ns in shares) or 1
        cols = [Col("process", flex=True), Col("seconds", "right"), Col("share", "right")]
        for lane, ns in shares[:8]:
            _row(cols, model.lanes[lane].label, f"{ns / 1e9:.3f}", f"{ns / total:.0%}")
        _table(console, "critical path per process", cols, wide)


def _with_suffix(name: str, suffix: str) -> Callable[[int], str]:
    fit = _span_name(name)
    return lambda width: fit(width - len(suffix)) + suffix


def render_compare(cmp: Comparison, console: Console, wide: bool = False) -> None:
    s = cmp.summary
    console.print(Text(f"A {cmp.a}  vs  B {cmp.b}", style="bold"))
    startup = s["startup_s"]
    console.print(
        Text(f"startup {startup['a']:.3f} s -> {startup['b']:.3f} s ({startup['delta']:+.3f} s)", style="bold")
    )
    _first_token_compare(cmp, console)
    for note in cmp.notes:
        console.print(Text(note))
    render_causes(cmp, console, wide)
    _preload_check(cmp, console, wide)
    _compile_check(cmp, console)
    until = "first token" if s.get("until") == "first_token" else "ready"
    _delta_table(console, f"time to {until} by phase, along the critical path", cmp.ready_by_phase, wide)
    _delta_table(console, "exclusive breakdown, summed over processes", cmp.phases, wide)
    _compare_nodes(cmp, console, wide)
    _compare_ranks(cmp, console, wide)
    _compare_modules(cmp, console, wide)


def _first_token_compare(cmp: Comparison, console: Console) -> None:
    ttft = cmp.summary.get("time_to_first_token_s") or {}
    if ttft.get("a") is None and ttft.get("b") is None:
        return
    a, b, delta = (
        ("-" if v is None else f"{v:{fmt}}")
        for v, fmt in ((ttft.get("a"), ".3f"), (ttft.get("b"), ".3f"), (ttft.get("delta"), "+.3f"))
    )
    console.print(f"time to first token {a} s -> {b} s ({delta} s)", markup=False)
def render_causes(cmp: Comparison, console: Console, wide: bool = False) -> None:
    """Why time to ready changed: the causes, ranked (analysis/causes.py), and the unexplained rest."""
    if not cmp.causes:
        return
    cols = [Col("cause", flex=True), Col("A", flex=True), Col("B", flex=True), Col("seconds", "right")]
    for c in cmp.causes:
        seconds = "(not one phase)" if c["seconds"] is None else _signed(c["seconds"])
        was, now = ("" if v is None else str(v) for v in (c["from"], c["to"]))
        _row(cols, c["key"], was, now, seconds)
        for d in c.get("detail", [])[:3]:
            _row(cols, f"  {d['key']}", _s(d["from"]), _s(d["to"]), f"({_signed(d['seconds'])})")
    if cmp.unexplained_s is not None:
        _row(cols, "unexplained", "", "", _signed(cmp.unexplained_s))
    _table(console, "why time to ready changed (causes, along the critical path)", cols, wide)


def _delta_table(console: Console, title: str, rows: list[dict[str, Any]], wide: bool) -> None:
    if not rows:
        return
    cols = [Col("phase", flex=True), Col("A s", "right"), Col("B s", "right"), Col("delta s", "right")]
    for p in rows:
        _row(cols, p["phase"], _s(p["a"]), _s(p["b"]), _signed(p["delta"]))
    _table(console, title, cols, wide)


def _compile_check(cmp: Comparison, console: Console) -> None:
    """A's cold_compile findings: the saving predicted, and the one B realised."""
    for c in cmp.compile_checks:
        realised = c["realised_saving_s"]
        got = "no matching process in B" if realised is None else f"realised {realised:.3f} s"
        console.print(
            Text(
                f"cold compile ({c['key']}): A missed the compile cache {c['misses_a']} time(s), B "
                f"{c['misses_b']}; compile {_s(c['compile_s']['a'])} s -> {_s(c['compile_s']['b'])} s; "
                f"predicted saving {c['predicted_saving_s']:.3f} s, {got}"
            )
        )


def _compare_nodes(cmp: Comparison, console: Console, wide: bool) -> None:
    """Runs of several hosts: per node (matched by position), its ranks and when it was ready."""
    if not cmp.nodes:
        return
    heads = ("ranks A", "ranks B", "ready A s", "ready B s", "delta s")
    cols = [Col("node (A / B)", flex=True)] + [Col(h, "right") for h in heads]
    for row in cmp.nodes:
        ready = row["time_to_ready_s"]
        node = f"{row['node']}: {row['host_a'] or '-'} / {row['host_b'] or '-'}"
        ranks = (_ranks_text(row["ranks_a"]), _ranks_text(row["ranks_b"]))
        _row(cols, node, *ranks, _s(ready["a"]), _s(ready["b"]), _signed(ready["delta"]))
    _table(console, "per node", cols, wide)


def _compare_ranks(cmp: Comparison, console: Console, wide: bool) -> None:
    heads = ("ready A s", "ready B s", "delta s", "import A s", "import B s")
    cols = [Col("process", flex=True)] + [Col(h, "right") for h in heads]
    for r in cmp.ranks:
        ready, imports = r["time_to_ready_s"], r["import_s"]
        times = (_s(ready["a"]), _s(ready["b"]), _signed(ready["delta"]))
        _row(cols, r["key"], *times, _s(imports["a"]), _s(imports["b"]))
    _table(console, "per rank", cols, wide)


def _compare_modules(cmp: Comparison, console: Console, wide: bool) -> None:
    heads = ("A s", "B s", "delta s", "ranks A", "ranks B")
    cols = [Col("module", flex=True)] + [Col(h, "right") for h in heads]
    for m in cmp.modules[:20]:
        values = (_s(m["a"]), _s(m["b"]), _signed(m["delta"]), str(m["ranks_paid_a"]), str(m["ranks_paid_b"]))
        _row(cols, _fit_module(m["module"]), *values)
    _table(console, "modules (largest changes)", cols, wide)


def _preload_check(cmp: Comparison, console: Console, wide: bool) -> None:
    """Predicted (A's preload findings) against realised (B) savings, per rank and on time to ready."""
    for check in cmp.preload_checks:
        applied = "applied" if check["applied"] else "NOT applied"
        console.print(
            Text(
                f"preload advice of A ({len(check['modules'])} modules, {check['start_method']}): {applied} in B",
                style="bold",
            )
        )
        for line in check["notes"]:
            console.print(Text(line))
        cols = [Col("rank", flex=True)] + [Col(h, "right") for h in ("predicted s", "realised s", "left in B s")]
        for r in check["ranks"]:
            _row(cols, r["key"], _s(r["predicted_s"]), _s(r["realised_s"]), _s(r["still_imported_s"]))
        ttr = check["time_to_ready"]
        _row(cols, "time to ready", _s(-ttr["predicted_change_s"]), _s(-ttr["realised_change_s"]), "")
        _table(console, "saving, predicted (A) vs realised (B)", cols, wide)
        console.print(Text(f"time to ready: the prediction is an estimate ({ttr['basis']})", style="dim"))


def render_advise(model: RunModel, console: Console, wide: bool = False) -> None:
    """`starttrace advise`: the findings, then each preload list with its per-module seconds."""
    console.print(Text(f"run {model.run_id}  status {model.status}  startup {model.startup_s:.3f} s", style="bold"))
    render_findings(model.findings, console)
    for f in model.findings:
        if f["kind"] != "preload":
            continue
        for r in f["refused"]:
            console.print(Text(f"refused {r['module']}: {r['reason']}", style="red"))
        if not f["modules_detail"]:
            continue
        cols = [Col("module", flex=True), Col("ranks", "right"), Col("s per rank", "right")]
        for d in f["modules_detail"]:
            _row(cols, _fit_module(d["module"]), str(d["ranks"]), f"{d['seconds_per_rank']:.3f}")
        small = f["small_modules"]
        if small["count"]:
            _row(cols, f"({small['count']} more under 0.1 ms)", "", f"{small['seconds_per_rank']:.3f}")
        who = f"forkserver pid {f['forkserver_pid']}" if f["forkserver_pid"] else f"ranks of pid {f['launcher_pid']}"
        _table(console, f"preload list for {who}", cols, wide)
