"""Terminal views (rich) of the waterfall model: `starttrace report`, `compare` and `advise`.

Every table is sized to the console before rich sees it: headers are never cut, and a module name
that does not fit is abbreviated from the left at a component boundary (`…openai.api_server`).
`wide=True` (`--wide`) abbreviates nothing and lets tables be as wide as their content.
"""

from __future__ import annotations

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
from starttrace.analysis.folding import fold_groups, real_problems, untraced_programs
from starttrace.analysis.model import STRUCTURAL_PHASES, RunModel
from starttrace.analysis.nodes import node_rows
from starttrace.analysis.plan import plan
from starttrace.views.html import phase_color

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


def render_findings(
    findings: list[dict[str, Any]], console: Console, title: str = "findings", compact: bool = False
) -> None:
    """Numbered findings: `[severity] kind (saves N s): text`, then `-> action`; names
    whole, lines wrapped at spaces. `compact`: text and action at most COMPACT_LINES lines each."""
    if not findings:
        console.print(Text(f"{title}: none", style="green"))
        return
    console.print(Text(title, style="bold"))
    room = max(20, console.width - 4)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, justify="right")
    grid.add_column(ratio=1, overflow="fold")
    for i, f in enumerate(findings, 1):
        line = Text()
        saves = f" (saves {f['saving_s']:.1f} s)" if f.get("saving_s") else ""
        line.append(f"[{f['severity']}] {f['kind']}{saves}: ", style=SEVERITY_STYLE.get(f["severity"], ""))
        text = f["text"]
        if compact:
            text = _clip(line.plain + text, room, COMPACT_LINES)[len(line.plain) :]
        line.append(text)
        grid.add_row(f"{i}.", line)
        if f.get("action"):
            action = f"-> {f['action']}"
            grid.add_row("", Text(_clip(action, room, COMPACT_LINES) if compact else action, style="dim"))
    console.print(grid)


COMPACT_LINES = 2
CLIPPED = "... (--full)"  # the end of a finding's text cut in the compact list (`report --full` has it whole)


def _clip(text: str, width: int, lines: int) -> str:
    """`text` cut (at a space, with CLIPPED) to what `lines` lines of `width` hold when wrapped at spaces."""
    words = text.split(" ")
    out: list[str] = []
    row = ""
    for word in words:
        candidate = f"{row} {word}" if row else word
        if len(candidate) <= width or not row:
            row = candidate
            continue
        out.append(row)
        row = word
        if len(out) == lines:
            last = out[-1]
            while len(last) + 1 + len(CLIPPED) > width and " " in last:
                last = last.rsplit(" ", 1)[0]
            out[-1] = last + " " + CLIPPED
            return " ".join(out)
    out.append(row)
    return " ".join(out)


def render_report(model: RunModel, console: Console, wide: bool = False, full: bool = False) -> None:
    """`starttrace report`: the summary first (time to ready, its phases along the critical path as
    one bar, the plan, the findings ranked by what they save), then the processes (short helpers
    folded), their breakdowns (the phases that matter, the rest as `other`), compile, the path.
    `full=True` (`--full`) lists every helper, every part, phase, hotspot and step."""
    _report_head(model, console, full)
    _first_token_line(model, console)
    _summary_bar(model, console)
    _plan_lines(model, console)
    render_findings(_by_saving(model.findings), console, compact=not (full or wide))
    _nodes(model, console, wide)
    _processes(model, console, wide, full)
    _phases(model, console, wide, full)
    _weights_and_compile(model, console, wide, full)
    _in_progress(model, console, wide)
    if full:
        _hotspots(model, console, wide)
    _cuda_line(model, console)
    _critical_path(model, console, wide, full)


def short_labels(model: RunModel) -> dict[int, str]:
    """Lane labels for the default report's narrow tables: `rank 0`, `api_server`, `helper 8093`
    (the pid where a role without ranks has several lanes)."""
    roles = Counter(lane.role for lane in model.lanes if lane.rank is None)
    out = {}
    for lane in model.lanes:
        role = lane.role or "process"
        if lane.rank is not None:
            out[lane.index] = f"rank {lane.rank}" if lane.role == "worker" else f"{role} rank {lane.rank}"
        elif roles[lane.role] > 1 and lane.pid is not None:
            out[lane.index] = f"{role} {lane.pid}"
        else:
            out[lane.index] = role
        if lane.node:
            out[lane.index] = f"{lane.node} {out[lane.index]}"
    return out


def _by_saving(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings that save time first, the most first; the others after, in their order."""
    saving = sorted((f for f in findings if f.get("saving_s")), key=lambda f: -f["saving_s"])
    return saving + [f for f in findings if not f.get("saving_s")]


def _summary_bar(model: RunModel, console: Console) -> None:
    """Time to ready by phase along the critical path, as one bar the console's width, and its key:
    each phase of at least 2 % by name, the rest as `other`."""
    by_phase = path_phases(model)
    total = sum(by_phase.values())
    if not total:
        return
    parts = [(label, ns) for label, ns in by_phase.items() if ns / total >= 0.02]
    rest = total - sum(ns for _, ns in parts)
    if rest > 0:
        parts.append(("other", rest))
    width = max(10, console.width)
    cells = _apportion([ns for _, ns in parts], width)
    bar = Text()
    key = Text()
    for (label, ns), n in zip(parts, cells, strict=True):
        style = f"on {phase_color(label)}" if phase_color(label).startswith("#") else "reverse"
        bar.append((label[0] * n) if n else "", style=style)
        if key:
            key.append("  ")
        key.append(label[0], style=style)
        key.append(f" {label} {ns / 1e9:.1f} s")
    console.print(Text("time to ready by phase, along the critical path", style="bold"))
    console.print(bar, no_wrap=True, crop=True)
    console.print(key)


def _apportion(values: list[int], width: int) -> list[int]:
    """`width` cells shared in proportion to `values` (largest remainders), each at least 1."""
    total = sum(values) or 1
    raw = [v * width / total for v in values]
    cells = [max(1, int(r)) for r in raw]
    while sum(cells) > width and max(cells) > 1:
        cells[cells.index(max(cells))] -= 1
    order = sorted(range(len(raw)), key=lambda i: -(raw[i] - int(raw[i])))
    for i in order:
        if sum(cells) >= width:
            break
        cells[i] += 1
    return cells


def _plan_lines(model: RunModel, console: Console) -> None:
    got = plan(model)
    if not got["findings"]:
        return
    console.print(
        Text.assemble(
            ("plan: ", "bold"),
            f"every finding's action applied: ready in {got['predicted_ready_s']:.1f} s, not "
            f"{got['ready_s']:.1f} s (-{got['saving_s']:.1f} s; the critical path replayed, "
            f"not the {got['sum_of_savings_s']:.1f} s of savings summed)",
        )
    )


def _report_head(model: RunModel, console: Console, full: bool = False) -> None:
    console.print(
        Text.assemble((f"run {model.run_id}", "bold"), f"  service {model.service or '-'}  status {model.status}")
    )
    folded = sum(g["count"] for g in fold_groups(model))
    helpers = f" ({folded} helpers folded)" if folded and not full else ""
    console.print(
        Text.assemble(
            ("time to ready ", "bold"),
            (f"{model.startup_s:.1f} s", "bold"),
            f"  processes {len(model.lanes)}{helpers}  spans {model.spans.height:,}",
        )
    )
    for problem in real_problems(model):
        console.print(Text(f"warning: {problem}", style="yellow"))
    programs = untraced_programs(model)
    if programs:  # expected (uname, lscpu, gcc, ...): one line for all of them, the JSON lists each
        names = ", ".join(f"{p['program']} x{p['count']}" if p["count"] > 1 else p["program"] for p in programs)
        console.print(
            Text(f"note: {sum(p['count'] for p in programs)} children not Python, so not traced (expected): {names}")
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


def _processes(model: RunModel, console: Console, wide: bool, full: bool = False) -> None:
    many = wide or console.width >= 140
    cols = [
        Col("node" if any(lane.node for lane in model.lanes) else "process"),
        Col("start"),
        Col("ready s", "right"),
        Col("import s", "right"),
        Col("cover", "right"),
        Col("top 5 imports (s)" if many else "top import (s)", flex=True),
    ]
    groups = [] if full else fold_groups(model)
    folded = {i for g in groups for i in g["lanes"]}
    for lane in model.lanes:
        if lane.after_ready or lane.index in folded:
            continue  # after ready: one line under the breakdown table; folded: one line per group below
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
    short = short_labels(model)
    for g in groups:
        under = f"under {short[g['parent']]}: " if g["parent"] is not None else ""
        console.print(Text(f"  {under}{g['text']}", style="dim"))


def _phases(model: RunModel, console: Console, wide: bool, full: bool = False) -> None:
    """Each process's exclusive breakdown of its time to ready (the parts add up to it); the
    processes that started after the run was ready on one line. By default the short helpers are
    left out and the parts that matter have a column (each at least MATTERS of some process's
    time, the costliest first, as many as fit), the rest is `other`; `full`: every part that fits."""
    folded = set() if full else {i for g in fold_groups(model) for i in g["lanes"]}
    lanes = [lane for lane in model.lanes if lane.breakdown and lane.index not in folded]
    if not lanes:
        return
    totals: Counter[str] = Counter()
    for lane in lanes:
        totals.update(lane.breakdown)
    matters = {
        label for lane in lanes for label, ns in lane.breakdown.items() if ns >= MATTERS * max(1, lane.end - lane.start)
    }
    name = {lane.index: lane.label for lane in lanes} if full or wide else short_labels(model)
    label_w = max(len(name[lane.index]) for lane in lanes)
    room = console.width - label_w - 12 - (0 if full else 9)
    shown: list[str] = []
    for label in sorted(totals, key=lambda k: (-totals[k], k)):
        need = max(len(label), 7) + 3
        if (not full and label not in matters) or (not wide and room - need < 0):
            continue
        room -= need
        shown.append(label)
    hidden = len(totals) - len(shown)
    other = not full and hidden > 0
    title = "where each process's time to ready went (s, exclusive: parts add up)"
    if full and hidden:
        title += f" ({hidden} more parts in --json)"
    cols = [Col("process"), Col("total", "right")] + [Col(label, "right") for label in shown]
    if other:
        cols.append(Col("other", "right"))
    for lane in lanes:
        parts = [lane.breakdown.get(label) for label in shown]
        cells = [_s(ns / 1e9) if ns else "" for ns in parts]
        if other:
            rest = sum(ns for label, ns in lane.breakdown.items() if label not in shown)
            cells.append(_s(rest / 1e9) if rest else "")
        _row(cols, name[lane.index], _s((lane.end - lane.start) / 1e9), *cells)
    _table(console, title, cols, wide)
    later = [lane for lane in model.lanes if lane.after_ready]
    if later:
        roles = sorted({lane.role or "process" for lane in later})
        pids = ", ".join(str(lane.pid) for lane in later[:8]) + (", ..." if len(later) > 8 else "")
        console.print(
            f"after ready: {len(later)} more process(es) ({', '.join(roles)}; pids {pids}), not part of time to ready"
        )
    by_phase = path_phases(model)
    if by_phase and full:  # by default the summary's bar says it
        cols = [Col("phase", flex=True), Col("seconds", "right"), Col("share", "right")]
        total = sum(by_phase.values()) or 1
        for label, ns in by_phase.items():
            _row(cols, label, f"{ns / 1e9:.3f}", f"{ns / total:.0%}")
        _table(console, "time to ready by phase", cols, wide)


MATTERS = 0.05  # a part of a process's breakdown that has a column by default


def _weights_and_compile(model: RunModel, console: Console, wide: bool, full: bool = False) -> None:
    """Per process that read weight files: files, GB, GB/s, filesystem (by default only when a
    slow_weights finding names them); per process that compiled: graphs, compile-cache hits and
    misses, its compile seconds (and with `full` or `wide` the cache directory)."""
    weights = {f["lane"]: f for f in weight_facts(model)}
    compiled = {row["lane"]: row for row in compile_facts(model).to_dicts()}
    if weights and (full or wide or any(f["kind"] == "slow_weights" for f in model.findings)):
        cols = [Col("process")] + [Col(h, "right") for h in ("files", "GB", "load s", "GB/s")] + [Col("fs", flex=True)]
        for index in sorted(weights):
            w = weights[index]
            gbps = f"{w['gbps']:.2f}" if w["gbps"] is not None else ""
            fs = ",".join(w["fs_types"])
            _row(cols, model.lanes[index].label, str(w["files"]), f"{w['bytes'] / 1e9:.3f}", _s(w["seconds"]), gbps, fs)
        _table(console, "weights", cols, wide)
    if compiled:
        heads = ("graphs", "hit", "miss", "compile s")
        cols = [Col("process")] + [Col(h, "right") for h in heads]
        dirs = full or wide
        name = {lane.index: lane.label for lane in model.lanes} if dirs else short_labels(model)
        if dirs:
            cols.append(Col("compile cache", flex=True))
        for index in sorted(compiled):
            c = compiled[index]
            cells = [str(c["graphs"]), str(c["hits"]), str(c["misses"])]
            cells.append(_s(model.lanes[index].breakdown.get("compile", 0) / 1e9))
            if dirs:
                cells.append(", ".join(c["cache_dirs"]))
            _row(cols, name[index], *cells)
        _table(console, "compile", cols, wide)


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


def _critical_path(model: RunModel, console: Console, wide: bool, full: bool = False) -> None:
    """The path's longest steps in time order (by default the PATH_STEPS longest; `full`: every
    step of at least 1 ms), then the processes it went through."""
    if not model.critical_path:
        return
    cols = [Col("process"), Col("span", flex=True), Col("start s", "right"), Col("seconds", "right")]
    if full:
        steps = [st for st in model.critical_path if st.end - st.start >= 1_000_000]
    else:
        steps = sorted(model.critical_path, key=lambda st: st.start - st.end)[:PATH_STEPS]
    for st in sorted(steps, key=lambda st: st.start):
        suffix = "" if st.kind == "span" else f" ({st.kind})"
        name = _with_suffix(st.name, suffix)
        _row(cols, model.lanes[st.lane].label, name, _s(model.seconds(st.start)), f"{(st.end - st.start) / 1e9:.3f}")
    title = "critical path to ready" + ("" if full else f" (its {len(steps)} longest steps; --full: all)")
    _table(console, title, cols, wide)
    shares = path_by_lane(model.critical_path)
    if len(shares) > 1:
        total = sum(ns for _, ns in shares) or 1
        if not full:  # one line: who holds the path
            short = short_labels(model)
            text = ", ".join(f"{short[lane]} {ns / total:.0%}" for lane, ns in shares[:4])
            console.print(Text(f"on the path: {text}", style="dim"))
            return
        cols = [Col("process", flex=True), Col("seconds", "right"), Col("share", "right")]
        for lane, ns in shares[:8]:
            _row(cols, model.lanes[lane].label, f"{ns / 1e9:.3f}", f"{ns / total:.0%}")
        _table(console, "critical path per process", cols, wide)


PATH_STEPS = 5


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
    _plan_check(cmp, console, wide)
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


def _plan_check(cmp: Comparison, console: Console, wide: bool) -> None:
    """A's plan against B: per finding of A that saves time, the saving it predicted and the one B
    realised (the critical-path time A spent in the finding's stretches minus B's in the same)."""
    check = cmp.plan
    if not check or not check.get("findings"):
        return
    cols = [Col("A's finding", flex=True)] + [Col(h, "right") for h in ("predicted s", "realised s", "acted on")]
    for row in check["findings"]:
        acted = "yes" if row["acted_on"] else "no"
        _row(cols, row["kind"], _s(row["predicted_saving_s"]), _s(row["realised_saving_s"]), acted)
    _row(cols, "time to ready", _s(check["predicted_saving_s"]), _s(check["realised_saving_s"]), "")
    _table(console, "A's plan: saving predicted (A) vs realised (B)", cols, wide)
    ready = check["ready_s"]
    console.print(
        Text(
            f"A predicted {check['predicted_ready_s']:.1f} s with every action applied; B was ready in "
            f"{ready['b']:.1f} s",
            style="dim",
        )
    )


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
        applied = "applied" if check["applied"] else "NOT fully applied" if check.get("tried") else "not tried"
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
