"""The model's liveness rules (analysis/liveness.py) on hand-made runs: dead processes end as
`killed` or `lost` at their last record, only live processes are `stalled`, and the CLI's
`run_status` agrees with the model's status."""

from __future__ import annotations

import polars as pl

from starttrace.analysis.lanes import build_model
from starttrace.analysis.liveness import run_status
from starttrace.run import Process, Run, Span, spans_table

S = 10**9
T0 = 1_796_269_000 * S


def _proc(
    pid: int, *, alive: bool | None, exited: bool = False, warnings: list[str] | None = None
) -> tuple[Process, list[Span]]:
    """A worker with an open import (`import slow<pid>`), a done one and its process span."""
    own = Span(f"p{pid}", "root", "process", T0, T0 + 5 * S if exited else None, {"starttrace.phase": "process"})
    work = Span(f"w{pid}", own.span_id, f"import slow{pid}", T0 + S, None, {"starttrace.phase": "import"})
    done = Span(f"d{pid}", own.span_id, "import fast", T0, T0 + 2 * S, {"starttrace.phase": "import"})
    res = {"starttrace.role": "worker", "process.pid": pid, "starttrace.start_method": "spawn"}
    process = Process(f"i{pid}", pid, 1, None, res, own.span_id, exited=exited, alive=alive, warnings=warnings or [])
    return process, [done, own, work]


def _run(*procs: tuple[Process, list[Span]]) -> Run:
    startup = Span("root", None, "startup", T0, None, {"starttrace.phase": "startup"})
    rows = [(p.instance_id, s) for p, spans in procs for s in spans]
    return Run("r", "t" * 32, "root", {}, [p for p, _ in procs], [], [startup], spans_table(rows))


def test_dead_processes_end_killed_at_their_last_record_and_are_not_stalled() -> None:
    run = _run(_proc(10, alive=False), _proc(11, alive=False))
    model = build_model(run, now_ns=T0 + 3600 * S, stall_s=1)
    assert model.status == "killed" == run_status(run)
    assert not [f for f in model.findings if f["kind"] == "stalled"]
    slow = model.nodes(model.spans.filter(pl.col("name").str.starts_with("import slow")))
    assert len(slow) == 2
    assert all(n.end == T0 + 2 * S and not n.in_progress and n.error.startswith("killed") for n in slow)
    assert model.t_end - model.t0 == 2 * S  # not an hour: the last record, not now


def test_only_the_live_process_is_stalled() -> None:
    run = _run(_proc(10, alive=False), _proc(11, alive=True), _proc(12, alive=None, exited=True))
    model = build_model(run, now_ns=T0 + 3600 * S, stall_s=1)
    assert model.status == "running" == run_status(run)
    stalled = [f for f in model.findings if f["kind"] == "stalled"]
    assert [f["stalled_pid"] for f in stalled] == [11]


def test_a_journal_cut_short_is_lost_even_while_its_process_lives() -> None:
    cut = ["cannot extend journal /x/1-a.1.journal: [Errno 28] No space left on device"]
    run = _run(_proc(10, alive=True, warnings=cut))
    model = build_model(run, now_ns=T0 + 3600 * S, stall_s=1)
    assert not [f for f in model.findings if f["kind"] == "stalled"]
    assert any(w.startswith("lost") for w in model.lanes[0].warnings)
    assert model.status == "running" == run_status(run)  # alive: the run goes on, untraced
    gone = _run(_proc(10, alive=False, warnings=cut))
    assert build_model(gone, now_ns=T0 + 3600 * S).status == "lost" == run_status(gone)
