"""Export detail levels (analysis/detail.py) on synthetic runs: the summary set keeps every
non-import span, per process the longest imports within the budget, never orphans a span (ties
and children longer than their parent included), and accounts for what it dropped."""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict

import pytest
from run_spans import all_spans, spans_of
from synth_runs import make_run, to_run

from starttrace.analysis.detail import (
    DROPPED_COUNT_ATTR,
    DROPPED_SECONDS_ATTR,
    SUMMARY_ATTR,
    apply_detail,
    is_import,
    summary_selection,
)
from starttrace.run import Process, Run, Span, spans_table
from starttrace.views.export import detail_from_env, parse_import_budget

MS = 1_000_000


def _by_id(run: Run) -> dict[str, Span]:
    return {s.span_id: s for _, s in all_spans(run)}


def _dur(span: Span) -> int:
    return (span.end_ns or span.start_ns) - span.start_ns


def assert_no_orphans(run: Run, kept: set[str] | frozenset[str]) -> None:
    spans = _by_id(run)
    for span_id in kept:
        parent = spans[span_id].parent_id
        assert parent is None or parent not in spans or parent in kept, (spans[span_id].name, "orphaned")


def _forced(run: Run) -> set[str]:
    """Import spans kept whatever the budget: open ones and ancestors of non-import spans."""
    spans = _by_id(run)
    out: set[str] = set()
    for _, span in all_spans(run):
        if is_import(span) and not span.open:
            continue
        node = spans.get(span.parent_id or "")
        while node is not None:
            if is_import(node):
                out.add(node.span_id)
            node = spans.get(node.parent_id or "")
        if is_import(span):
            out.add(span.span_id)
    return out


@pytest.fixture(scope="module")
def big_run() -> Run:
    return to_run(make_run(ranks=4, imports_per_rank=2000, run_id="detail", seed=3))


@pytest.mark.parametrize("budget", [0, 1, 7, 50, 300, 5000])
def test_summary_keeps_non_imports_and_no_orphans(big_run: Run, budget: int) -> None:
    selection = summary_selection(big_run, budget)
    for _, span in all_spans(big_run):
        if not is_import(span):
            assert span.span_id in selection.kept, span.name
    assert_no_orphans(big_run, selection.kept)
    assert selection.dropped == big_run.span_count() - len(selection.kept)


@pytest.mark.parametrize("budget", [1, 7, 50, 300])
def test_budget_per_process_and_longest_first(big_run: Run, budget: int) -> None:
    selection = summary_selection(big_run, budget)
    forced = _forced(big_run)
    for process in big_run.processes:
        imports = [s for s in spans_of(big_run, process) if is_import(s)]
        kept = [s for s in imports if s.span_id in selection.kept]
        forced_here = [s for s in imports if s.span_id in forced]
        assert len(kept) <= max(budget, len(forced_here)), process.label()
        assert len(kept) == min(len(imports), max(budget, len(forced_here))), process.label()
        chosen = [s for s in kept if s.span_id not in forced]
        dropped = [s for s in imports if s.span_id not in selection.kept]
        if chosen and dropped:
            assert max(map(_dur, dropped)) <= min(map(_dur, chosen)), process.label()


def test_accounting_sums_right(big_run: Run) -> None:
    selection = summary_selection(big_run, 20)
    spans = _by_id(big_run)
    extra = selection.extra
    assert sum(e[DROPPED_COUNT_ATTR] for e in extra.values()) == selection.dropped > 0
    assert set(extra) <= selection.kept
    # seconds: the dropped subtrees that hang directly under a kept span, once each
    heads: dict[str, int] = defaultdict(int)
    for _, span in all_spans(big_run):
        if span.span_id not in selection.kept and span.parent_id in selection.kept:
            heads[span.parent_id] += _dur(span)  # type: ignore[index]
    for span_id, attrs in extra.items():
        assert attrs[DROPPED_SECONDS_ATTR] == pytest.approx(heads[span_id] / 1e9, abs=1e-6), spans[span_id].name
    assert sum(heads.values()) > 0


def _tiny_run(spans: list[Span]) -> Run:
    process = Process("p1", 10, 1, None, {"starttrace.role": "main"}, "proc")
    return Run("tiny", "ab" * 16, "", {}, [process], [], [], spans_table(("p1", s) for s in spans))


def _imp(sid: str, parent: str | None, start: int, end: int) -> Span:
    return Span(sid, parent, f"import m{sid}", start, end, {"starttrace.phase": "import"})


def test_accounting_on_a_known_tree() -> None:
    spans = [
        Span("proc", None, "process", 0, 100 * MS, {"starttrace.phase": "process"}),
        _imp("p", "proc", 0, 50 * MS),  # kept (longest)
        _imp("a", "p", 1 * MS, 6 * MS),  # dropped, with its child a1
        _imp("a1", "a", 2 * MS, 3 * MS),
        _imp("b", "p", 10 * MS, 13 * MS),  # dropped
        _imp("q", "proc", 60 * MS, 70 * MS),  # kept (second longest)
        _imp("c", "proc", 80 * MS, 81 * MS),  # dropped, directly under the process span
    ]
    run = _tiny_run(spans)
    selection = summary_selection(run, 2)
    assert selection.kept == {"proc", "p", "q"}
    assert selection.extra["p"] == {DROPPED_COUNT_ATTR: 3, DROPPED_SECONDS_ATTR: 0.008}
    assert selection.extra["proc"] == {DROPPED_COUNT_ATTR: 1, DROPPED_SECONDS_ATTR: 0.001}
    assert "q" not in selection.extra


def test_ties_keep_ancestors() -> None:
    """A chain of imports of the same duration, and siblings tied with them: the budget cuts in
    the middle of the ties, and still no kept span loses its parent."""
    spans = [Span("proc", None, "process", 0, 100 * MS, {"starttrace.phase": "process"})]
    parent = "proc"
    for depth in range(6):  # six nested imports, all [10, 20] ms
        sid = f"n{depth}"
        spans.append(_imp(sid, parent, 10 * MS, 20 * MS))
        parent = sid
    for i in range(6):  # siblings of the same length, elsewhere in the tree
        spans.append(_imp(f"s{i}", "proc", (30 + 11 * i) * MS, (40 + 11 * i) * MS))
    # span ids that sort before the chain's, and starts that do not help the parent
    spans.reverse()
    run = _tiny_run(spans)
    for budget in range(0, 13):
        selection = summary_selection(run, budget)
        assert_no_orphans(run, selection.kept)
        assert len(selection.kept) - 1 == budget


def test_child_longer_than_parent_is_not_orphaned() -> None:
    """Bad input (a child clipped wrong, clocks that disagree): the child is the longest, so it
    comes first, and it is taken with its parent or not at all."""
    spans = [
        Span("proc", None, "process", 0, 100 * MS, {"starttrace.phase": "process"}),
        _imp("short-parent", "proc", 10 * MS, 11 * MS),
        _imp("long-child", "short-parent", 10 * MS, 60 * MS),
        _imp("other", "proc", 70 * MS, 75 * MS),
    ]
    run = _tiny_run(spans)
    one = summary_selection(run, 1)
    assert one.kept == {"proc", "other"}  # the child does not fit with its parent in 1
    two = summary_selection(run, 2)
    assert two.kept == {"proc", "short-parent", "long-child"}
    for selection in (one, two):
        assert_no_orphans(run, selection.kept)


def test_forced_ancestors_and_open_imports() -> None:
    """`cuda.init` inside an import keeps that import; an import still open is kept; both count
    against the budget."""
    spans = [
        Span("proc", None, "process", 0, 100 * MS, {"starttrace.phase": "process"}),
        _imp("cuda-import", "proc", 0, 2 * MS),
        Span("cuda", "cuda-import", "cuda.init", 1 * MS, 2 * MS, {"starttrace.phase": "cuda_init"}),
        Span("open", "proc", "import hanging", 50 * MS, None, {"starttrace.phase": "import"}, in_progress=True),
        _imp("long", "proc", 10 * MS, 40 * MS),
    ]
    run = _tiny_run(spans)
    assert summary_selection(run, 0).kept == {"proc", "cuda-import", "cuda", "open"}
    assert summary_selection(run, 2).kept == {"proc", "cuda-import", "cuda", "open"}
    assert summary_selection(run, 3).kept == {"proc", "cuda-import", "cuda", "open", "long"}


def test_apply_detail_full_marks_summary_keeps_only(big_run: Run) -> None:
    before = copy.deepcopy(big_run)
    selection = summary_selection(big_run, 30)
    full = apply_detail(big_run, "full", 30)
    summary = apply_detail(big_run, "summary", 30)
    assert big_run.spans.equals(before.spans), "the run passed in is not changed"
    assert dataclasses.replace(big_run, spans=before.spans) == before
    assert full.span_count() == big_run.span_count()
    marked = {s.span_id for _, s in all_spans(full) if s.attrs.get(SUMMARY_ATTR) is True}
    assert marked == selection.kept
    assert all(SUMMARY_ATTR not in s.attrs for _, s in all_spans(full) if s.span_id not in marked)
    assert {s.span_id for _, s in all_spans(summary)} == selection.kept
    assert all(s.attrs[SUMMARY_ATTR] is True for _, s in all_spans(summary))
    assert len(summary.processes) == len(big_run.processes)
    for span_id, attrs in selection.extra.items():
        assert _by_id(summary)[span_id].attrs[DROPPED_COUNT_ATTR] == attrs[DROPPED_COUNT_ATTR]
        assert _by_id(full)[span_id].attrs[DROPPED_SECONDS_ATTR] == attrs[DROPPED_SECONDS_ATTR]


def test_bad_settings_are_refused() -> None:
    run = to_run(make_run(ranks=1, imports_per_rank=10))
    with pytest.raises(ValueError, match="unknown detail 'tiny'"):
        apply_detail(run, "tiny")
    with pytest.raises(ValueError, match=">= 0"):
        summary_selection(run, -1)
    assert detail_from_env({}) == ("full", 300)
    assert detail_from_env({"STARTTRACE_OTLP_DETAIL": "Summary", "STARTTRACE_SUMMARY_IMPORTS": "12"}) == (
        "summary",
        12,
    )
    with pytest.raises(ValueError, match="STARTTRACE_OTLP_DETAIL='some'"):
        detail_from_env({"STARTTRACE_OTLP_DETAIL": "some"})
    with pytest.raises(ValueError, match="STARTTRACE_SUMMARY_IMPORTS='many'"):
        detail_from_env({"STARTTRACE_SUMMARY_IMPORTS": "many"})
    with pytest.raises(ValueError, match="must be >= 0"):
        parse_import_budget("-3")
