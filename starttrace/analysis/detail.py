"""Export detail levels: which spans of a run a trace backend gets.

A real vLLM TP=2 start records 21-26k spans (about 9 MB of OTLP protobuf): past Tempo's default
per-trace limit and past what the Jaeger UI draws. `summary` is the part of a run a backend can
hold:

- every span that is not an import (`process`, `ready`, `vllm.*`, `cuda.init`, `dist.init`, ...);
- imports still in progress (where a process hangs);
- of the other imports, per process, the longest `import_budget` (default 300). Not a fixed duration
  threshold: how many imports last 1 ms differs by machine, a budget does not;
- the ancestors of every kept span, so nothing kept is orphaned. A child is never longer than its
  parent, so the longest-N set holds its ancestors anyway; candidates are ranked by
  (-duration, depth, start, id), so a parent wins a tie with its child, and each candidate is taken
  together with its missing ancestors, or not at all, when they do not fit the budget. Imports
  kept whatever the budget (open ones, and the ancestors of kept non-import spans, e.g. the import
  that ran `cuda.init`) count against it first.
- Dropped imports stay accounted for on the nearest kept ancestor: `DROPPED_COUNT_ATTR` (how many
  import spans were dropped below it, nested ones included) and `DROPPED_SECONDS_ATTR` (the
  seconds of the dropped subtrees that hang directly under it).

`full` keeps every span and marks the summary set with `SUMMARY_ATTR = true` (the kept parents
carry the same accounting attributes), so a Collector can send full detail to the starttrace
service and only the marked spans to Jaeger and Tempo (deploy/otel-collector.yaml).

Pure functions over the run type: no I/O, no environment (views/export.py reads the settings).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from starttrace.analysis.phases import phase_of
from starttrace.run import Process, Run, Span

SUMMARY_ATTR = "starttrace.summary"
DROPPED_COUNT_ATTR = "starttrace.summary.dropped_imports"
DROPPED_SECONDS_ATTR = "starttrace.summary.dropped_import_s"
DETAILS = ("full", "summary")
DEFAULT_DETAIL = "full"
DEFAULT_IMPORT_BUDGET = 300
_MAX_DEPTH = 100_000  # parent chains are walked at most this far (guards cycles in bad input)


@dataclass(frozen=True)
class Selection:
    """The summary set of a run: span ids kept, and the attributes added to the kept spans."""

    kept: frozenset[str]
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)  # span id -> accounting attributes
    dropped: int = 0  # import spans left out of the summary set


def is_import(span: Span) -> bool:
    return phase_of(span.name, span.attrs) == "import"


def _duration(span: Span) -> int:
    return max(0, (span.end_ns if span.end_ns is not None else span.start_ns) - span.start_ns)


class _Tree:
    """Parents by span id over the whole run (a process span's parent lives in another process)."""

    def __init__(self, run: Run) -> None:
        self.spans: dict[str, Span] = {}
        for _, span in run.all_spans():
            self.spans.setdefault(span.span_id, span)
        self._depth: dict[str, int] = {}

    def parent(self, span: Span) -> Span | None:
        if not span.parent_id or span.parent_id == span.span_id:
            return None
        return self.spans.get(span.parent_id)

    def depth(self, span: Span) -> int:
        """Ancestors of `span` in the run (0: a root); a cycle in bad input counts as a root."""
        chain: list[Span] = []
        seen: set[str] = set()
        node: Span | None = span
        while node is not None and node.span_id not in self._depth and node.span_id not in seen:
            seen.add(node.span_id)
            chain.append(node)
            node = self.parent(node)
        base = self._depth[node.span_id] if node is not None and node.span_id in self._depth else -1
        for item in reversed(chain):
            base += 1
            self._depth[item.span_id] = base
        return self._depth[span.span_id]

    def missing_ancestors(self, span: Span, kept: set[str]) -> list[Span]:
        """The ancestors of `span` not in `kept`, up to the first kept one."""
        out: list[Span] = []
        seen = {span.span_id}
        node = self.parent(span)
        while node is not None and node.span_id not in kept and node.span_id not in seen:
            seen.add(node.span_id)
            out.append(node)
            node = self.parent(node)
        return out


def summary_selection(run: Run, import_budget: int = DEFAULT_IMPORT_BUDGET) -> Selection:
    """The summary set of `run` (see the module text)."""
    if import_budget < 0:
        raise ValueError(f"the import budget must be >= 0, not {import_budget}")
    tree = _Tree(run)
    kept: set[str] = set()
    owner: dict[str, int] = {}  # span id -> index of its process (the budget it counts against)
    for index, process in enumerate(run.processes):
        for span in process.spans:
            owner.setdefault(span.span_id, index)
    used = [0] * len(run.processes)  # imports kept per process whatever the budget
    for _, span in run.all_spans():
        if not is_import(span):
            kept.add(span.span_id)
        elif span.open:
            kept.add(span.span_id)
            if span.span_id in owner:
                used[owner[span.span_id]] += 1
    for span_id in list(kept):  # ancestors of what is kept whatever the budget
        for ancestor in tree.missing_ancestors(tree.spans[span_id], kept):
            kept.add(ancestor.span_id)
            if ancestor.span_id in owner:
                used[owner[ancestor.span_id]] += 1
    for index, process in enumerate(run.processes):
        _fill_budget(process, tree, kept, import_budget - used[index])
    extra, dropped = _accounting(run, tree, kept)
    return Selection(frozenset(kept), extra, dropped)


def _fill_budget(process: Process, tree: _Tree, kept: set[str], budget: int) -> None:
    """Keep the process's longest imports (each with its missing ancestors) while they fit."""
    if budget <= 0:
        return
    candidates = [s for s in process.spans if s.span_id not in kept and is_import(s)]
    candidates.sort(key=lambda s: (-_duration(s), tree.depth(s), s.start_ns, s.span_id))
    for span in candidates:
        if span.span_id in kept:
            continue  # taken already as the ancestor of a shorter one (bad input: child longer)
        chain = tree.missing_ancestors(span, kept)
        if 1 + len(chain) > budget:
            continue
        kept.add(span.span_id)
        kept.update(a.span_id for a in chain)
        budget -= 1 + len(chain)
        if budget == 0:
            return


def _accounting(run: Run, tree: _Tree, kept: set[str]) -> tuple[dict[str, dict[str, Any]], int]:
    """Per kept span: how many imports below it were dropped, and the seconds of the dropped
    subtrees directly under it (they are siblings, so their seconds do not overlap on one thread).
    A dropped span without a kept ancestor (its parent is not in the run) is accounted on its
    process's `process` span, else on the run's root span."""
    counts: dict[str, int] = {}
    seconds: dict[str, int] = {}
    nearest: dict[str, str | None] = {}  # dropped span id -> the kept span it is accounted on
    root = run.root_spans[0].span_id if run.root_spans else None
    dropped = 0
    for process, span in run.all_spans():
        if span.span_id in kept:
            continue
        dropped += 1
        fallback = process.process_span_id if process is not None and process.process_span_id in kept else root
        target = _nearest_kept(span, tree, kept, nearest, fallback)
        if target is None:
            continue
        counts[target] = counts.get(target, 0) + 1
        parent = tree.parent(span)
        if parent is None or parent.span_id in kept:  # the head of a dropped subtree
            seconds[target] = seconds.get(target, 0) + _duration(span)
    extra = {
        sid: {DROPPED_COUNT_ATTR: n, DROPPED_SECONDS_ATTR: round(seconds.get(sid, 0) / 1e9, 6)}
        for sid, n in counts.items()
    }
    return extra, dropped


def _nearest_kept(
    span: Span, tree: _Tree, kept: set[str], nearest: dict[str, str | None], fallback: str | None
) -> str | None:
    chain: list[str] = []
    node: Span | None = span
    target = fallback
    while node is not None and len(chain) < _MAX_DEPTH:
        if node.span_id in nearest:
            target = nearest[node.span_id]
            break
        chain.append(node.span_id)
        parent = tree.parent(node)
        if parent is not None and parent.span_id in kept:
            target = parent.span_id
            break
        node = parent
    for span_id in chain:
        nearest[span_id] = target
    return target


def apply_detail(run: Run, detail: str = DEFAULT_DETAIL, import_budget: int = DEFAULT_IMPORT_BUDGET) -> Run:
    """The run as exported at `detail`: `full` (every span, the summary set marked) or `summary`
    (the summary set only). The run passed in is not changed."""
    if detail not in DETAILS:
        raise ValueError(f"unknown detail {detail!r}; one of {', '.join(DETAILS)}")
    selection = summary_selection(run, import_budget)
    keep_all = detail == "full"

    def spans(items: list[Span]) -> list[Span]:
        out = []
        for span in items:
            if span.span_id in selection.kept:
                attrs = {**span.attrs, SUMMARY_ATTR: True, **selection.extra.get(span.span_id, {})}
                out.append(dataclasses.replace(span, attrs=attrs))
            elif keep_all:
                out.append(span)
        return out

    processes = [dataclasses.replace(p, spans=spans(p.spans)) for p in run.processes]
    return dataclasses.replace(run, processes=processes, root_spans=spans(run.root_spans))
