"""The fleet answer in the terminal (`starttrace fleet`): groups with p50/p95 of time to ready and
of each phase, regressions between versions, the slowest runs. Names from span data are printed as
text (no rich markup is read from them)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


def _s(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def render_fleet(answer: dict[str, Any], console: Console) -> None:
    key = answer["key"]
    console.print(Text(f"fleet startup by {key}: {answer['runs']} run(s) with facts ({answer.get('source', '')})"))
    if answer.get("pending"):
        console.print(
            Text(f"{answer['pending']} more run(s) in range pending: their facts are not derived yet", style="yellow")
        )
    phases = sorted({p for g in answer["groups"] for p in g["phases"]})
    table = Table(title="p50 / p95 seconds", title_justify="left")
    table.add_column(Text(key))
    for column in ("runs", "ready", *map(Text, phases)):
        table.add_column(column, justify="right")
    for g in answer["groups"]:
        ttr = g["time_to_ready_s"]
        cells = [Text(g["value"] or "(none)"), str(g["runs"]), f"{_s(ttr['p50'])} / {_s(ttr['p95'])}"]
        for ph in phases:
            q = g["phases"].get(ph)
            cells.append(f"{_s(q['p50'])} / {_s(q['p95'])}" if q else "")
        table.add_row(*cells)
    console.print(table)
    if answer["regressions"]:
        reg = Table(
            title="regressions (p50 grew from one version to the next, within one start kind)", title_justify="left"
        )
        for col in ("phase", "from", "to", "start kind", "p50 change"):
            reg.add_column(col, justify="right" if col == "p50 change" else "left")
        for r in answer["regressions"]:
            kind = ", ".join(f"{k}={v}" for k, v in (r.get("kind") or {}).items())
            reg.add_row(Text(r["phase"]), Text(r["from"]), Text(r["to"]), Text(kind), f"+{r['p50_delta_s']:.2f} s")
        console.print(reg)
    render_mix(answer.get("mix") or [], console)
    if answer["slowest"]:
        slow = Table(title="slowest runs", title_justify="left")
        for col in ("run", key, "time to ready"):
            slow.add_column(Text(col), justify="right" if col == "time to ready" else "left")
        for r in answer["slowest"]:
            slow.add_row(Text(r["run_id"]), Text(r["value"]), f"{r['time_to_ready_s']:.2f} s")
        console.print(slow)


def render_mix(mix: list[dict[str, Any]], console: Console) -> None:
    """Start-kind shares that changed between versions (`compile_cache=cold` 20 % -> 80 %)."""
    if not mix:
        return
    table = Table(title="start-kind mix (shares that changed between versions)", title_justify="left")
    for col in ("from", "to", "start kind", "share before", "share after"):
        table.add_column(col, justify="right" if col.startswith("share") else "left")
    for m in mix:
        table.add_row(
            Text(m["from"]),
            Text(m["to"]),
            Text(f"{m['key']}={m['value']}"),
            f"{m['share_from'] * 100:.0f} %",
            f"{m['share_to'] * 100:.0f} %",
        )
    console.print(table)
