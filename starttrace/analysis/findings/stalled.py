"""`stalled` findings (live runs): a process stuck in one span, and the processes that wait for it.

Only live processes are named: a lane that exited, or whose process is gone (its pid dead or
another process: `analysis/liveness.py`), is never stalled, whatever it left open.

A lane is stalled when its innermost open span (the deepest one still open, not its `process`
span, not an idle loop) has been open at least `stall_s` seconds (STARTTRACE_STALL_S, default 60)
and is not itself a wait. Waiters are lanes whose innermost open span is a wait: `dist.init`, a
barrier or collective, a `wait_for_*`. With waiters but no stalled lane, the waiters are the
finding: what they wait for is not traced (not started, exited, or on another host).
"""

from __future__ import annotations

from typing import Any

from starttrace.analysis.findings.common import finding, is_wait, s, short_name
from starttrace.analysis.model import STRUCTURAL_PHASES, Lane, RunModel, SpanNode

DEFAULT_STALL_S = 60.0


def _innermost(lane: Lane) -> SpanNode | None:
    if lane.ready_ns is not None or lane.exited:  # only a live process can be stalled (analysis/liveness.py)
        return None
    open_spans = [
        n
        for n in lane.in_progress
        if n is not lane.process_span and n.phase not in STRUCTURAL_PHASES and n.phase != "idle"
    ]
    return max(open_spans, key=lambda n: (n.depth, n.start)) if open_spans else None


def _open_s(n: SpanNode) -> float:
    return max(0, n.eff_end - n.start) / 1e9


def _where(n: SpanNode) -> str:
    return f"`{n.name}`"


def stalled_findings(model: RunModel, stall_s: float = DEFAULT_STALL_S) -> list[dict[str, Any]]:
    if not model.live:
        return []
    inner = [(lane, n) for lane in model.lanes if (n := _innermost(lane)) is not None]
    waiters = [(lane, n) for lane, n in inner if is_wait(n)]
    stuck = [(lane, n) for lane, n in inner if not is_wait(n) and _open_s(n) >= stall_s]
    waiting = "; ".join(f"{short_name(ln)} has waited {s(_open_s(n))} in {n.name}" for ln, n in waiters)
    out = []
    for lane, n in sorted(stuck, key=lambda x: -_open_s(x[1])):
        text = f"{short_name(lane)} has been in {_where(n)} for {s(_open_s(n))}"
        if waiting:
            text = f"{waiting}; {text}"
        out.append(
            finding(
                "stalled",
                "error",
                [lane] + [ln for ln, _ in waiters],
                _open_s(n),
                text,
                f"look at what pid {lane.pid} is doing (py-spy dump --pid {lane.pid}); "
                + ("the waiters go on once it gets there" if waiters else "nothing traced waits for it yet"),
                span=n.name,
                phase=n.phase,
                stalled_pid=lane.pid,
                waiters=[
                    {"pid": ln.pid, "label": ln.label, "span": w.name, "open_s": round(_open_s(w), 6)}
                    for ln, w in waiters
                ],
            )
        )
    long_waits = [(ln, n) for ln, n in waiters if _open_s(n) >= stall_s]
    if not stuck and long_waits:
        gone = [ln for ln in model.lanes if ln.exited and ln.exit_code not in (0, None)]
        text = f"{waiting}; no traced process is busy: what they wait for has not started, has exited"
        text += " or runs on a host not traced"
        if gone:
            text += "; exited with an error: " + ", ".join(f"{ln.label} (exit {ln.exit_code})" for ln in gone)
        out.append(
            finding(
                "stalled",
                "error",
                [ln for ln, _ in long_waits],
                max(_open_s(n) for _, n in long_waits),
                text,
                "check that every rank was started with the same rendezvous (address, port, world size)",
                span=long_waits[0][1].name,
                phase=long_waits[0][1].phase,
                stalled_pid=None,
                waiters=[
                    {"pid": ln.pid, "label": ln.label, "span": w.name, "open_s": round(_open_s(w), 6)}
                    for ln, w in waiters
                ],
            )
        )
    return out
