"""The model build's per-span loops in C (`_modelcore.span_nodes`, `link_tree`, `set_durations`,
`hotspot_top`) build exactly what the Python code does (`analysis.lanes._span_nodes`,
`_link_tree`, `_set_durations`, `_hotspot_sums`): every field of every node, the same values of
the same types, the same import hotspots, and the same views."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synth_runs import make_run, protobuf_batches

from starttrace import run as run_module
from starttrace.analysis import critical_path, lanes
from starttrace.analysis import model as model_module
from starttrace.analysis.findings import common
from starttrace.analysis.findings.preload import FastestImports, covered_nodes
from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import RunModel, SpanNode
from starttrace.run import Process, Run, Span
from starttrace.sources import store as S
from starttrace.sources.lazy_attrs import HOT_KEYS, LazyAttrs
from starttrace.sources.otlp import parse_and_decode, span_attrs
from starttrace.views.json import to_json

PHASE, MODULE, SELF_US = HOT_KEYS
NOW = 1_800_000_000_000_000_000
C_WALKS = (
    "c_import_children",
    "c_subtree_modules",
    "c_top_imports",
    "c_covered_nodes",
    "c_pick_walk",
    "c_paid_modules",
    "c_fastest_imports",
)
pytestmark = pytest.mark.skipif(lanes.c_span_nodes is None, reason="starttrace._modelcore is not built here")


def _build(make: Callable[[], Run], c: bool, monkeypatch: pytest.MonkeyPatch, raw_reader: bool = True) -> RunModel:
    with monkeypatch.context() as m:
        if not raw_reader:  # C without the stored bytes' reader: every span through `hot_values`
            m.setattr(run_module, "RAW_HOT_READER", None)
        if not c:
            m.setattr(lanes, "c_span_nodes", None)
            m.setattr(lanes, "c_link_tree", None)
            m.setattr(lanes, "c_hotspot_top", None)
            m.setattr(lanes, "c_lane_positions", None)
            m.setattr(lanes, "c_lane_indexes", None)
            m.setattr(lanes, "c_last_time", None)
            m.setattr(lanes, "c_set_durations", None)
            m.setattr(lanes, "c_phase_intervals", None)
            for name in C_WALKS:
                m.setattr(common, name, None)
            m.setattr(model_module, "c_select", None)
            m.setattr(critical_path, "c_step_candidates", None)
        return build_model(make(), now_ns=NOW)


def _state(n: SpanNode) -> tuple[Any, ...]:
    fields = []
    for name in SpanNode.__slots__:
        value = getattr(n, name, "<unset>")
        if name == "parent_node":
            value = None if value is None else value.id
        elif name in ("children", "imports"):
            value = None if value is None else [c.id for c in value]
        elif name == "attrs":
            value = (type(value).__name__, dict(dict.items(value)) if type(value) is dict else None)
        fields.append((name, type(value).__name__, value))
    return tuple(fields)


def _same(make: Callable[[], Run], monkeypatch: pytest.MonkeyPatch) -> RunModel:
    in_c, in_python = _build(make, True, monkeypatch), _build(make, False, monkeypatch)
    assert [_state(n) for n in in_c.spans] == [_state(n) for n in in_python.spans]
    assert [_state(n) for n in _build(make, True, monkeypatch, raw_reader=False).spans] == [
        _state(n) for n in in_python.spans
    ]
    assert in_c.hotspots == in_python.hotspots and in_c.hotspots
    facts = lambda model: [(list(ln.phases.items()), ln.coverage, ln.gaps) for ln in model.lanes]  # noqa: E731
    assert facts(in_c) == facts(in_python)  # phases in the same order too
    assert in_c.critical_path == in_python.critical_path
    dump = lambda model: json.dumps(to_json(model), sort_keys=True, default=str)  # noqa: E731
    assert dump(in_c) == dump(in_python)
    return in_c


def _stored(run: Any, tmp_path: Path) -> Callable[[], Run]:
    store = S.Store(os.path.join(tmp_path, "s.db"))
    for body in protobuf_batches(run, 512):
        store.ingest_now(parse_and_decode(body, "application/x-protobuf").batch)
    return lambda: store.load_run(run.run_id)  # type: ignore[return-value]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ranks": 4, "imports_per_rank": 300, "seed": 42},
        {"ranks": 3, "imports_per_rank": 200, "seed": 5, "in_progress_rank": 1, "ready": False},
        {"ranks": 3, "imports_per_rank": 100, "seed": 3, "cuda_in_forkserver": True},
        {"ranks": 3, "imports_per_rank": 100, "seed": 7, "start_method": "spawn"},
        {"ranks": 40, "imports_per_rank": 12, "seed": 2},  # more lanes than the C lane cache starts with
    ],
)
def test_stored_runs_build_the_same_nodes(
    kwargs: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _same(_stored(make_run(run_id="r", **kwargs), tmp_path), monkeypatch)
    assert len(model.spans) > 300
    assert any(isinstance(n.attrs, LazyAttrs) for n in model.spans)  # the C common case was taken
    assert any(n.children for n in model.spans) and max(n.depth for n in model.spans) >= 2


def _kv_bytes(**attrs: Any) -> bytes:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

    span = PbSpan(trace_id=b"\1" * 16, span_id=b"\2" * 8, name="x", start_time_unix_nano=1, end_time_unix_nano=2)
    for key, value in attrs.items():
        kind = "string_value" if isinstance(value, str) else "int_value"
        span.attributes.append(KeyValue(key=key, value=AnyValue(**{kind: value})))
    return span.SerializeToString()


class _OwnSpan(Span):
    pass


def _odd_run() -> Run:
    """Every branch of the per-span loop: attrs absent, plain dicts, lazy bytes read or not yet,
    lazy JSON text, a repeated key; phases from the attribute, the name table, the prefixes; bool,
    float and int self times; open, instant and truthy-but-not-bool `in_progress`; parents that
    are the span itself, a cycle, missing, or in another lane."""
    t = 1_700_000_000_000_000_000
    lazy = lambda raw: LazyAttrs(raw, span_attrs)  # noqa: E731
    read = LazyAttrs(_kv_bytes(**{PHASE: "import", MODULE: "read.before"}), span_attrs)
    read.get(MODULE)
    a = [
        Span("p1", None, "process", t, t + 900, {PHASE: "process"}),
        Span("a1", "p1", "import torch", t + 1, t + 500, None),
        Span("a2", "a1", "import torch.nn", t + 2, t + 100, {SELF_US: True}),
        Span("a3", "a1", "preload x", t + 3, t + 50, {SELF_US: 1.5, PHASE: ""}),
        Span("a4", "a4", "cuda.init", t + 4, None, {PHASE: 7}),
        Span("a5", "a6", "c1", t + 5, t + 6, {}, instant=True),
        Span("a6", "a5", "c2", t + 6, t + 7, {MODULE: 3}, in_progress=1),  # type: ignore[arg-type]
        Span("a7", "nowhere", "import lazy", t + 7, t + 9, lazy(_kv_bytes(**{PHASE: "import", SELF_US: 4}))),
        Span("a8", "a7", "import again", t + 8, t + 9, lazy(_kv_bytes(**{PHASE: "a"}) + _kv_bytes(**{PHASE: "b"}))),
        Span("a9", "a7", "import json", t + 8, t + 9, LazyAttrs('{"starttrace.phase": "import"}', json.loads)),
        Span("a10", "", "import read", t + 9, t + 10, read, error="Boom", thread=3),
        Span("a11", "p1", "ready", t + 10, t + 10, {"other": 1}, instant=True),
        Span("a13", "a14", "cycle one", t + 12, t + 20, {}),  # a parent cycle with an import inside
        Span("a14", "a13", "cycle two", t + 12, t + 20, {}),
        Span("a15", "a13", "import cyc", t + 13, t + 14, {}),
        Span("a16", "a15", "import cyc.inner", t + 13, t + 14, {MODULE: "cyc.inner"}),
        _OwnSpan("a12", "p1", "import own", t + 11, t + 12, {}),  # not exactly a Span: read by attribute
    ]
    b = [
        Span("p2", "a1", "process", t + 20, t + 800, {PHASE: "process"}),
        Span("b1", "a2", "import os", t + 21, t + 30, {PHASE: "import", MODULE: "os", SELF_US: 5}),
        Span("b2", "b1", "dist.init", t + 22, t + 23, None, in_progress=True),
        *[Span(f"w{i}", f"w{i - 1}" if i else None, f"wait {i}", t + 24 + i, t + 40, {}) for i in range(5)],
        Span("b7", "w4", "import deep", t + 30, t + 31, {}),  # under five spans that are no imports
    ]
    huge = [  # times beyond 64 bits: the interval arithmetic falls back to Python ints
        Span("p3", "a1", "process", t + 30, 1 << 64, {PHASE: "process"}),
        Span("c1", "p3", "import big", t + 31, (1 << 64) - 5, {PHASE: "import"}),
        Span("c2", "p3", "dist.init", t + 32, t + 40, None),
    ]
    processes = [
        Process("one", 1, 0, None, {"starttrace.role": "api_server"}, "p1", a),
        Process("two", 2, 1, None, {"starttrace.role": "worker", "starttrace.rank": 0}, "p2", b),
        Process("three", 3, 1, None, {"starttrace.role": "worker", "starttrace.rank": 1}, "p3", huge),
    ]
    root = Span("root", None, "startup", t, t + 1000, {PHASE: "startup"})
    return Run("odd", "t" * 32, "root", {}, processes, [], [root])


def test_every_branch_builds_the_same_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _same(_odd_run, monkeypatch)
    by_id = {n.id: n for n in model.spans}
    assert by_id["a2"].self_us is None and by_id["a3"].self_us == 1.5 and by_id["a3"].phase == "forkserver_preload"
    assert by_id["a4"].phase == "cuda_init" and by_id["a4"].parent_node is None  # its own parent
    assert by_id["a7"].self_us == 4 and by_id["a7"].module == "lazy" and by_id["a10"].module == "read.before"
    assert by_id["b1"].parent_node is by_id["a2"] and by_id["b1"] not in by_id["a2"].children  # another lane
    assert by_id["a6"].in_progress == 1 and by_id["a5"].depth == 10_000  # the cycle is bounded
    big = next(ln for ln in model.lanes if ln.id == "three")
    assert big.phases["import"] == (1 << 64) - 5 - (by_id["c1"].start)


def test_a_span_name_that_is_not_a_string_is_refused_in_c() -> None:
    run = _odd_run()
    run.processes[0].spans[1].name = 5  # type: ignore[assignment]
    with pytest.raises(TypeError, match="name must be a str"):
        build_model(run, now_ns=NOW)


def test_the_import_tree_walks_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import_children`, `subtree_modules`, `top_imports`, `covered_nodes`, `paid_modules` (what
    the `preload` findings walk) in C and in Python, on every node of a run with parent cycles."""
    if common.c_top_imports is None:
        pytest.skip("starttrace._modelcore is not built here")

    def walks(python: bool) -> list[Any]:
        model = build_model(_odd_run(), now_ns=NOW)
        with monkeypatch.context() as m:
            if python:
                for name in C_WALKS:
                    m.setattr(common, name, None)
            memo: dict[str, frozenset[str]] = {}
            ids = lambda nodes: [n.id for n in nodes]  # noqa: E731
            out: list[Any] = [ids(common.import_children(n)) for n in model.spans]
            out += [sorted(common.subtree_modules(n, memo)) for n in model.spans]
            for lane in model.lanes:
                out += [ids(common.top_imports(lane)), ids(common.top_imports(lane, lane.start + 12))]
                out.append(ids(covered_nodes(lane, {"cyc.inner", "os", "again"})))
                tops = common.top_imports(lane)
                paid = common.paid_modules(tops)
                assert type(paid) is set
                assert paid == set().union(*(common.subtree_modules(n, {}) for n in tops))  # its definition
                out.append(sorted(paid))
            out.append(sorted(common.paid_modules(model.spans)))  # roots nested in each other: no matter
            fastest = FastestImports(model)
            out.append(fastest.total(["cyc", "cyc.inner"]))
            out.append(sorted((str(k), v) for k, v in (fastest._best or {}).items()))
        return out

    assert walks(python=False) == walks(python=True)
    model = build_model(_odd_run(), now_ns=NOW)
    by_id = {n.id: n for n in model.spans}
    one = model.lanes[by_id["a15"].lane]
    tops = {n.id for n in common.top_imports(one)}
    assert "a7" in tops and "a15" not in tops  # under a parent cycle: enclosed (the walk is bounded)
    assert "b7" in {n.id for n in common.top_imports(model.lanes[by_id["b7"].lane])}
    assert [n.id for n in common.import_children(by_id["a13"])] == ["a15"]
    assert common.subtree_modules(by_id["a15"], {}) == {"cyc", "cyc.inner"}


def test_select_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """`analysis.model.select` in C and in Python: by phase, by name, both, and the others."""
    if model_module.c_select is None:
        pytest.skip("starttrace._modelcore is not built here")
    spans = build_model(_odd_run(), now_ns=NOW).spans
    asks = [(("import",), ()), (("cuda_init",), ("cuda.init", "ready")), ((), ("process",)), (("nothing",), ())]

    def picks() -> list[list[str]]:
        out = [[n.id for n in model_module.select(spans, phases, names)] for phases, names in asks]
        return out + [[n.id for n in model_module.select(spans, phases, names, keep=False)] for phases, names in asks]

    in_c = picks()
    with monkeypatch.context() as m:
        m.setattr(model_module, "c_select", None)
        assert picks() == in_c
    assert in_c[3] == [] and len(in_c[7]) == len(spans) and "a4" in in_c[1] and "a11" in in_c[1]


def test_step_candidates_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The critical path's candidates per lane (by end, the longest first among equal ends, then in
    lane order) in C and in Python, on a stored run and on one with ties and huge times."""
    if critical_path.c_step_candidates is None:
        pytest.skip("starttrace._modelcore is not built here")
    stored = _stored(make_run(run_id="r", ranks=3, imports_per_rank=300, seed=9), tmp_path)
    for make in (stored, _odd_run):
        model = build_model(make(), now_ns=NOW)
        in_c = critical_path._candidates(model.lanes)
        with monkeypatch.context() as m:
            m.setattr(critical_path, "c_step_candidates", None)
            in_python = critical_path._candidates(model.lanes)
        assert [[n.id for n in lane] for lane in in_c[0]] == [[n.id for n in lane] for lane in in_python[0]]
        assert in_c[1] == in_python[1] and sum(map(len, in_c[1])) > 5


def _python_top(nodes: list[SpanNode], limit: int) -> list[tuple[Any, ...]]:
    """What `import_hotspots` keeps of the Python sums (every module at least as long as the
    limit-th longest), as sorted tuples."""
    acc = lanes._hotspot_sums(nodes)
    cums = sorted((a[0] for a in acc.values()), reverse=True)
    cut = cums[limit - 1] if 0 < limit < len(cums) else min(cums, default=0)
    if limit <= 0:
        return []
    return sorted((mod, a[0], a[1], frozenset(a[2]), a[3]) for mod, a in acc.items() if a[0] >= cut)


def _c_top(nodes: list[SpanNode], limit: int, lane_count: int) -> list[tuple[Any, ...]] | None:
    top = lanes.c_hotspot_top(nodes, SpanNode, "import", limit, lane_count)
    return None if top is None else sorted((mod, a[0], a[1], frozenset(a[2]), a[3]) for mod, a in top)


def test_hotspot_top_matches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`_modelcore.hotspot_top` (sums in C integers, the cut at the limit-th longest module) keeps
    what the Python sums and cut keep: at every limit, with ties at the cut, float and int self
    times, lanes past 64; it hands back None (the Python sums then run) where a value is not a
    plain int64 or a lane is not an index of the run."""
    if lanes.c_hotspot_top is None:
        pytest.skip("starttrace._modelcore is not built here")
    model = build_model(_stored(make_run(run_id="r", ranks=4, imports_per_rank=300, seed=11), tmp_path)(), now_ns=NOW)
    imports = [n for n in model.spans if n.phase == "import"]
    for i, n in enumerate(imports):
        n.duration = n.duration // 50_000_000 * 50_000_000  # many modules tie at the cut
        n.lane = (i * 37) % 130  # lanes past one 64-bit word
        if i % 7 == 0:
            n.self_us = 1.5 + i
        elif i % 11 == 0:
            n.self_us = i
    cums = sorted({n.duration for n in imports})
    assert len(cums) < len(imports) // 4  # ties
    for limit in (0, 1, 2, 3, 17, 100, 299, 10_000):
        assert _c_top(model.spans, limit, 130) == _python_top(model.spans, limit), limit
    assert _c_top(model.spans, 5, 130) and len(_c_top(model.spans, 5, 130) or []) >= 5
    assert _c_top(model.spans, 5, 129) is None  # a lane index past the lanes
    imports[3].duration = 1 << 70
    assert _c_top(model.spans, 5, 130) is None
    imports[3].duration = 5
    imports[4].self_us = "x"  # type: ignore[assignment]
    assert _c_top(model.spans, 5, 130) is None
    imports[4].self_us = float("nan")
    assert _c_top(model.spans, 5, 130) is None
    imports[4].self_us = None
    # import_hotspots itself: the same rows with and without the C cut
    for n in model.spans:
        n.lane = n.lane % len(model.lanes)
    in_c = lanes.import_hotspots(model, 20)
    monkeypatch.setattr(lanes, "c_hotspot_top", None)
    assert lanes.import_hotspots(model, 20) == in_c and len(in_c) == 20


def test_split_imports_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """`analysis.model.split_imports` (what a first answer always sends, and the imports long enough
    to be candidates) in C and in Python, per lane of a run with open, instant and huge spans."""
    if model_module.c_split_imports is None:
        pytest.skip("starttrace._modelcore is not built here")
    model = build_model(_odd_run(), now_ns=NOW)

    def splits() -> list[Any]:
        out = []
        for lane in model.lanes:
            for min_ns in (0, 1, 2, 10, 1 << 70):
                always, longer = model_module.split_imports(lane.spans, min_ns)
                out.append(([n.id for n in always], [n.id for n in longer]))
        return out

    in_c = splits()
    monkeypatch.setattr(model_module, "c_split_imports", None)
    assert splits() == in_c
    assert any(a and b for a, b in in_c) and any(not b for _, b in in_c)


def test_nodes_in_start_order_with_ties_and_odd_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """`span_nodes` hands the nodes back sorted by start (stable: ties keep the lanes' order), on C
    integers; a start it does not take (negative here) leaves the sort to Python: the same order."""

    def odd_start() -> Run:
        run = _odd_run()
        run.processes[1].spans[0].start_ns = -5
        return run

    for make in (_odd_run, odd_start):
        model = _same(make, monkeypatch)
        starts = [n.start for n in model.spans]
        assert starts == sorted(starts)
    by_id = {n.id: n for n in _same(_odd_run, monkeypatch).spans}
    order = [n.id for n in _same(_odd_run, monkeypatch).spans]
    assert by_id["a8"].start == by_id["a9"].start and order.index("a8") < order.index("a9")


def test_the_shared_empty_peeked_dict_stays_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `LazyAttrs` shares one empty `_peeked` until a key is read in place: building models
    (C and Python) and reading hot, other and absent keys gives each instance its own dict and
    leaves the shared one empty."""
    make = _stored(make_run(run_id="r", ranks=2, imports_per_rank=50, seed=4), tmp_path)
    _same(make, monkeypatch)  # every build, C and Python, and their views
    model = build_model(make(), now_ns=NOW)
    lazy = [n.attrs for n in model.spans if isinstance(n.attrs, LazyAttrs)]
    shared = sum(a._peeked is LazyAttrs._nothing_peeked for a in lazy)
    assert len(lazy) > 50 and shared >= 0.8 * len(lazy), shared  # the build kept nothing on them (findings read a few)
    phases = [a.get(PHASE) for a in lazy]
    assert all(a._peeked is not LazyAttrs._nothing_peeked for a in lazy)
    assert all(a.get("no.such.key") is None for a in lazy)
    assert phases == [dict(a).get(PHASE) for a in lazy] and "import" in phases
    assert LazyAttrs._nothing_peeked == {}


def test_leaves_share_one_empty_children_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every leaf's `children` is SpanNode.NO_CHILDREN, in C and in Python; a parent has a list of
    its own, and the shared one stays empty after every build."""
    make = _stored(make_run(run_id="r", ranks=2, imports_per_rank=80, seed=9), tmp_path)
    for in_c in (True, False):
        model = _build(make, in_c, monkeypatch)
        leaves = [n for n in model.spans if not n.children]
        parents = [n for n in model.spans if n.children]
        assert len(leaves) > 50 and len(parents) > 5
        assert all(n.children is SpanNode.NO_CHILDREN for n in leaves)
        assert len({id(n.children) for n in parents}) == len(parents)
        assert all(c.parent_node is n for n in parents for c in n.children)
        assert SpanNode.NO_CHILDREN == []
