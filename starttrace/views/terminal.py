"""Terminal views (rich) of the waterfall model: `starttrace report` and `starttrace compare`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from starttrace.analysis.compare import Comparison
from starttrace.analysis.model import STRUCTURAL_PHASES, RunModel


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _process_name(command: str | None) -> str | None:
    """A short name for a process: the script or module it runs."""
    if not command:
        return None
    parts = command.split()
    for i, part in enumerate(parts):
        if part == "-m" and i + 1 < len(parts):
            return parts[i + 1][:28]
        if part == "-c":
            return parts[0].rsplit("/", 1)[-1][:24] + " -c"
    for part in parts[1:]:
        if not part.startswith("-"):
            return part.rsplit("/", 1)[-1][:28]
    return parts[0].rsplit("/", 1)[-1][:28]


def render_report(model: RunModel, console: Console) -> None:
    head = Text()
    head.append(f"run {model.run_id}", style="bold")
    head.append(f"  service {model.service or '-'}  status {model.status}")
    head.append(f"  startup {model.startup_s:.3f} s  processes {len(model.lanes)}  spans {len(model.spans)}")
    console.print(head)
    for problem in model.problems:
        console.print(Text(f"warning: {problem}", style="yellow"))

    table = Table(title="processes", show_lines=False)
    table.add_column("process", no_wrap=True, max_width=28)
    table.add_column("role", no_wrap=True)
    table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("pid", justify="right", no_wrap=True)
    table.add_column("ready s", justify="right", no_wrap=True)
    table.add_column("import s", justify="right", no_wrap=True)
    table.add_column("cover", justify="right", no_wrap=True)
    table.add_column("top 5 imports (s)", ratio=1, overflow="fold")
    for lane in model.lanes:
        tops = ", ".join(f"{m} {d / 1e9:.3f}" for m, d in lane.top_imports)
        table.add_row(
            Text(_process_name(lane.command) or lane.id),
            Text(lane.role or "-"),
            "-" if lane.rank is None else str(lane.rank),
            "-" if lane.pid is None else str(lane.pid),
            _s(model.seconds(lane.ready_ns)),
            f"{lane.import_ns / 1e9:.3f}",
            "-" if lane.coverage is None else f"{lane.coverage * 100:.0f}%",
            Text(tops),
        )
    console.print(table)

    if model.phases:
        phases = [p for p in model.phases if p not in ("ready",)]
        # as many phase columns as the console has room for, the costliest first (all of them
        # are in `report --json` and on the web page)
        totals = {ph: sum(lane.phases.get(ph, 0) for lane in model.lanes) for ph in phases}
        room = max(3, (console.width - 24) // 11)
        shown = sorted(phases, key=lambda ph: -totals[ph])[:room]
        hidden = len(phases) - len(shown)
        phases = [ph for ph in phases if ph in shown]
        title = "seconds per phase" + (f" (the {len(phases)} costliest; {hidden} more in --json)" if hidden else "")
        pt = Table(title=title)
        pt.add_column("process", no_wrap=True)
        for ph in phases:
            pt.add_column(ph, justify="right", no_wrap=True, overflow="ellipsis")
        for lane in model.lanes:
            pt.add_row(Text(lane.label), *[_s(lane.phases[ph] / 1e9) if ph in lane.phases else "" for ph in phases])
        console.print(pt)

    open_spans = [
        (lane, n)
        for lane in model.lanes
        for n in lane.in_progress
        if n is not lane.process_span and n.phase not in STRUCTURAL_PHASES
    ]
    if open_spans:
        ot = Table(title="in progress")
        ot.add_column("process")
        ot.add_column("span")
        ot.add_column("open for s", justify="right")
        for lane, n in sorted(open_spans, key=lambda x: x[1].start - x[1].eff_end)[:20]:
            ot.add_row(Text(lane.label), Text(n.name), f"{(n.eff_end - n.start) / 1e9:.3f}")
        console.print(ot)

    if model.hotspots:
        ht = Table(title="import hotspots")
        for col in ("module", "cumulative s", "self s", "processes", "ranks paid"):
            ht.add_column(col, justify="left" if col == "module" else "right")
        for h in model.hotspots[:15]:
            ht.add_row(
                Text(h["module"]),
                f"{h['cumulative_s']:.3f}",
                f"{h['self_s']:.3f}",
                str(h["processes"]),
                str(h["ranks_paid"]),
            )
        console.print(ht)

    if model.preload_advice:
        at = Table(title="preload advice")
        for col in ("module", "ranks", "saving per rank s", "advice"):
            at.add_column(col)
        for a in model.preload_advice[:10]:
            at.add_row(Text(a["module"]), str(a["ranks"]), f"{a['saving_per_rank_s']:.3f}", Text(a["advice"]))
        console.print(at)

    audit = model.cuda_audit
    if audit.get("issues"):
        for issue in audit["issues"]:
            chain = " -> ".join(issue["chain"]) or "(flagged by the process)"
            console.print(Text(f"CUDA audit: {issue['label']}: {issue['kind']}: {chain}", style="red"))
    elif audit:
        console.print(Text("CUDA audit: clean", style="green"))

    if model.critical_path:
        cp = Table(title="critical path to ready")
        for col in ("process", "span", "start s", "seconds"):
            cp.add_column(col, justify="right" if col in ("start s", "seconds") else "left")
        steps = sorted(model.critical_path, key=lambda st: st.start - st.end)[:15]
        for st in sorted(steps, key=lambda st: st.start):
            cp.add_row(
                Text(model.lanes[st.lane].label),
                Text(st.name + ("" if st.kind == "span" else f" ({st.kind})")),
                _s(model.seconds(st.start)),
                f"{(st.end - st.start) / 1e9:.3f}",
            )
        console.print(cp)


def render_compare(cmp: Comparison, console: Console) -> None:
    s = cmp.summary
    console.print(
        Text(
            f"A {cmp.a}  vs  B {cmp.b}: startup {s['startup_s']['a']:.3f} s -> {s['startup_s']['b']:.3f} s "
            f"({s['startup_s']['delta']:+.3f} s)",
            style="bold",
        )
    )
    for note in cmp.notes:
        console.print(Text(note))
    pt = Table(title="phases (summed over processes)")
    for col in ("phase", "A s", "B s", "delta s"):
        pt.add_column(col, justify="left" if col == "phase" else "right")
    for p in cmp.phases:
        pt.add_row(Text(p["phase"]), _s(p["a"]), _s(p["b"]), _signed(p["delta"]))
    console.print(pt)
    rt = Table(title="per rank")
    for col in ("process", "ready A s", "ready B s", "delta s", "import A s", "import B s"):
        rt.add_column(col, justify="left" if col == "process" else "right")
    for r in cmp.ranks:
        rt.add_row(
            Text(r["key"]),
            _s(r["time_to_ready_s"]["a"]),
            _s(r["time_to_ready_s"]["b"]),
            _signed(r["time_to_ready_s"]["delta"]),
            _s(r["import_s"]["a"]),
            _s(r["import_s"]["b"]),
        )
    console.print(rt)
    mt = Table(title="modules (largest changes)")
    for col in ("module", "A s", "B s", "delta s", "ranks A", "ranks B"):
        mt.add_column(col, justify="left" if col == "module" else "right")
    for m in cmp.modules[:20]:
        mt.add_row(
            Text(m["module"]),
            _s(m["a"]),
            _s(m["b"]),
            _signed(m["delta"]),
            str(m["ranks_paid_a"]),
            str(m["ranks_paid_b"]),
        )
    console.print(mt)
