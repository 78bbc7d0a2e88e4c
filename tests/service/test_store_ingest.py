"""Fast ingest paths: protobuf spans stored as received (attributes decoded lazily), packed one row per batch."""

from __future__ import annotations

import json
import marshal
import math
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from starttrace.sources import lane_reader
from starttrace.sources import store as store_module
from starttrace.sources.otlp import decode
from starttrace.sources.store import IngestBatch, ProcessBatch, SpanTuple, Store, decode_attrs, span_row


def _span(i: int, end: int, in_progress: bool = False, attrs: dict | None = None) -> SpanTuple:
    a = dict(attrs or {"n": i})
    if in_progress:
        a["starttrace.in_progress"] = True
    return ("ab" * 16, f"{i:016x}", None, f"s{i}", 1000 + i, end, int(in_progress), 0, json.dumps(a), None, None)


def _batch(spans: list[SpanTuple]) -> IngestBatch:
    res = {"starttrace.run_id": "r", "service.instance.id": "lane"}
    return IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)])


def _packed_rows(db: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(db) as conn:
        return [(int(r[0]), int(r[1])) for r in conn.execute("SELECT spans, length(body) FROM span_batches")]


def test_packed_batches_dedupe_and_replace_in_progress(tmp_path: Path) -> None:
    n = 2055
    db = tmp_path / "s.db"
    st = Store(db)
    first = [_span(i, 5000 + i, in_progress=i % 3 == 0) for i in range(n)]
    # in one transaction: everything, then everything again (duplicates land in the same and in
    # other chunks), then the in-progress spans ended, then an older in-progress copy of span 1
    ended = [_span(i, 9000 + i) for i in range(0, n, 3)]
    st._write_batches([_batch(first), _batch(list(reversed(first))), _batch(ended), _batch([_span(1, 7, True)])])
    assert st.count_spans("r") == n
    # one row per batch (the last one held only an in-progress copy of an ended span: nothing kept);
    # only the first counts its spans as new
    assert [r[0] for r in _packed_rows(db)] == [n, 0, 0]
    listed = st.load_rows("r").spans  # type: ignore[union-attr]
    assert [r[1] for r in listed] == [f"{i:016x}" for i in range(n)]  # each span once, at its first place
    rows = {r[1]: r for r in listed}
    for i in range(n):
        row = rows[f"{i:016x}"]
        if i % 3 == 0:
            assert (row[6], row[7]) == (9000 + i, 0)  # end_ns, in_progress: the ended copy won
        else:
            assert (row[6], row[7]) == (5000 + i, 0)  # never replaced by the in-progress copy
    st.close()
    # after a restart the same spans are still stored once
    st2 = Store(db)
    st2.ingest_now(_batch(first[:50] + ended[:10]))
    assert st2.count_spans("r") == n
    assert st2.load_rows("r").spans == listed  # type: ignore[union-attr]
    st2.close()


def test_unreadable_batch_is_reported_and_the_rest_kept(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    st = Store(db)
    st.ingest_now(_batch([_span(i, 5000) for i in range(5)]))
    st.ingest_now(_batch([_span(i, 5000) for i in range(5, 8)]))
    st.ingest_now(_batch([_span(i, 5000) for i in range(8, 10)]))
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE span_batches SET body = x'0badf00d' WHERE seq = 1")  # not marshal data
        conn.execute("UPDATE span_batches SET body = ? WHERE seq = 3", (marshal.dumps([("x",), 2]),))  # wrong shape
    st.close()
    st = Store(db)  # what the file holds (this writer's own live reader read the batches as written)
    rows = st.load_rows("r")
    assert rows is not None and rows.unreadable == 2
    assert [r[1] for r in rows.spans] == [f"{i:016x}" for i in range(5, 8)]
    assert any("could not be read" in p for p in rows.problems)
    run = st.load_run("r")
    assert run is not None and any("could not be read" in p for p in run.problems)
    st.ingest_now(_batch([_span(9, 5000)]))  # the writer goes on
    st.close()


def _reference_lanes(rows: list[tuple[Any, ...]], lane_names: dict[int, str]) -> dict[str, list[SpanTuple]]:
    """The reader's rule with the first-copy map kept for every span (what `_lane_spans` did before
    it trusted the writer's new-span counts): each span once, at its first place, merged."""
    from starttrace.sources.batches import unpack_spans

    lanes: dict[str, list[SpanTuple]] = {}
    seen: dict[int, dict[str, tuple[list[SpanTuple], int]]] = {}
    for _seq, lane_ref, trace_ref, _new, body in sorted(rows):
        out = lanes.setdefault(lane_names[lane_ref], [])
        keys = seen.setdefault(trace_ref, {})
        for sp in unpack_spans(body):
            first = keys.get(sp[1])
            if first is None:
                keys[sp[1]] = (out, len(out))
                out.append(sp)
            else:
                merged = lane_reader.merge_copy(first[0][first[1]], sp)
                if merged is not None:
                    first[0][first[1]] = merged
    return lanes


@pytest.mark.parametrize("seed", range(6))
def test_lanes_read_as_with_a_map_of_every_span(tmp_path: Path, seed: int) -> None:
    """Batches of three lanes and two traces, some repeating spans of other lanes' batches (in
    progress, then ended, or ended twice with other attributes), in random order and sizes: the
    lanes read back are the ones the always-mapped rule gives, although most batches (all new to
    their trace) are only appended."""
    rng = random.Random(seed)
    db = tmp_path / "s.db"
    st = Store(db)
    traces = ["ab" * 16, "cd" * 16]
    sent: list[tuple[str, SpanTuple]] = []
    for _ in range(40):
        lane = rng.choice(["l0", "l1", "l2"])
        trace = rng.choice(traces)
        spans = []
        for _ in range(rng.randint(1, 30)):
            if sent and rng.random() < 0.15:  # a copy of an earlier span, from any lane
                _, old = rng.choice(sent)
                if old[0] != trace:
                    continue
                spans.append((*old[:5], old[5] + rng.randint(0, 2), 0, 0, json.dumps({"v": rng.random()}), None, None))
            else:
                i = rng.getrandbits(48)
                is_open = rng.random() < 0.2
                attrs = json.dumps({"n": i})
                span = (trace, f"{i:016x}", None, f"s{i}", 1000, 2000, int(is_open), 0, attrs, None, None)
                spans.append(span)
                sent.append((lane, span))
        res = {"starttrace.run_id": "r", "service.instance.id": lane}
        st.ingest_now(IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)]))
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT seq, lane, trace, spans, body FROM span_batches").fetchall()
        names = dict(conn.execute("SELECT id, lane_id FROM lanes").fetchall())
    assert any(n < len(marshal.loads(body)) for *_, n, body in rows)  # some batches repeat spans
    assert any(n == len(marshal.loads(body)) for *_, n, body in rows[1:])
    want = {k: [t[1:] for t in v] for k, v in _reference_lanes(rows, names).items()}
    assert st.live_runs == ["r"]
    live = st.load_rows("r")  # read alongside the writer
    assert live is not None and st.live_runs == []
    back = st.load_rows("r")  # read back from the database
    # the run type's spans, as tuples: what the reference kept of each (its trace id aside)
    for got in (live, back):
        assert got is not None
        assert {k: [span_row(s)[1:] for s in v] for k, v in got.lanes.items()} == want
    assert sum(map(len, want.values())) == st.count_spans("r")
    st.close()


def test_live_reader_taken_once_at_its_version(tmp_path: Path) -> None:
    """A run the writer created is read as it is written; the first load at that version takes the
    reader, and every later load (more spans written meanwhile) reads the database."""
    st = Store(tmp_path / "s.db")
    st.ingest_now(_batch([_span(i, 5000, in_progress=i == 2) for i in range(5)]))
    st.ingest_now(_batch([_span(2, 6000), _span(7, 5000)]))  # a copy that ends span 2, and a new span
    assert st.live_runs == ["r"]
    first = st.load_rows("r")
    assert first is not None and st.live_runs == []
    assert [(s.span_id, s.end_ns, s.in_progress) for s in first.lanes["lane"]] == [
        (f"{i:016x}", 6000 if i == 2 else 5000, False) for i in (0, 1, 2, 3, 4, 7)
    ]
    st.ingest_now(_batch([_span(8, 5000)]))
    assert st.live_runs == []  # not a new run: no reader again
    again = st.load_rows("r")
    assert again is not None and [s.span_id for s in again.lanes["lane"]][-1] == f"{8:016x}"
    assert again.spans[:-1] == first.spans
    st.close()


def test_live_readers_bounded_and_dropped_with_their_run(tmp_path: Path) -> None:
    from starttrace.sources.lane_reader import LiveReads

    st = Store(tmp_path / "s.db")
    st._live = LiveReads(max_spans=6)  # a small bound, for the test

    def run(rid: str, n: int) -> IngestBatch:
        res = {"starttrace.run_id": rid, "service.instance.id": "lane"}
        spans = [(f"{ord(rid):032x}", *_span(i, 5000)[1:]) for i in range(n)]
        return IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)])

    st.ingest_now(run("a", 4))
    st.ingest_now(run("b", 4))  # 8 spans held: the oldest reader goes
    assert st.live_runs == ["b"]
    st.ingest_now(run("c", 2))
    assert st.live_runs == ["b", "c"]
    st.delete_runs(["b"])
    assert st.live_runs == ["c"]
    a = st.load_rows("a")  # from the database
    assert a is not None and len(a.lanes["lane"]) == 4
    st.close()


def test_decode_attrs_match_dict_json() -> None:
    msg = ExportTraceServiceRequest()
    ss = msg.resource_spans.add().scope_spans.add()
    ss.scope.name = "lib.x"
    sp = ss.spans.add()
    sp.trace_id, sp.span_id, sp.name = b"\x01" * 16, b"\x02" * 8, 'n"\u00e9'
    sp.start_time_unix_nano, sp.end_time_unix_nano = 10, 20
    kinds = [
        ("s", "string_value", 'a"\\\u2603\x00'),
        ("i", "int_value", -(2**63)),
        ("b", "bool_value", False),
        ("d", "double_value", 1.25),
        ("nan", "double_value", math.nan),
        ("k", "string_value", "first"),
        ("k", "int_value", 2),  # repeated key: the last value wins
        ("starttrace.in_progress", "bool_value", True),
    ]
    for key, field, value in kinds:
        kv = sp.attributes.add()
        kv.key = key
        setattr(kv.value, field, value)
    kv = sp.attributes.add()
    kv.key = "arr"
    kv.value.array_value.values.add().string_value = "x"
    kv = sp.attributes.add()
    kv.key = "by"
    kv.value.bytes_value = b"\x00\xff"
    kv = sp.attributes.add()
    kv.key = "unset"
    kv.value.SetInParent()
    d = decode(msg)
    assert (d.accepted, d.rejected) == (1, 0)
    row = d.batch.processes[0].spans[0]
    attrs = decode_attrs(row[8])  # stored as the span's raw protobuf bytes, decoded for the model
    assert attrs.pop("nan") != attrs.get("nan")  # NaN, as json.dumps writes it
    assert attrs == {
        "s": 'a"\\\u2603\x00',
        "i": -(2**63),
        "b": False,
        "d": 1.25,
        "k": 2,
        "starttrace.in_progress": True,
        "arr": ["x"],
        "by": "00ff",
        "unset": None,
        "otel.scope.name": "lib.x",
    }
    assert row[6] == 1 and row[7] == 0  # in progress, not an instant


def test_timestamp_past_int64_rejected_alone() -> None:
    msg = ExportTraceServiceRequest()
    ss = msg.resource_spans.add().scope_spans.add()
    for i, end in enumerate((2**64 - 1, 5)):
        sp = ss.spans.add()
        sp.trace_id, sp.span_id, sp.name = b"\x01" * 16, bytes([i + 1]) * 8, f"s{i}"
        sp.start_time_unix_nano, sp.end_time_unix_nano = 1, end
    d = decode(msg)
    assert (d.accepted, d.rejected) == (1, 1)
    assert "out of range" in d.errors[0]


def test_decode_raw_span_edge_cases() -> None:
    from starttrace.sources.otlp import BadRequest
    from starttrace.sources.otlp import parse_and_decode as _parse_and_decode

    msg = ExportTraceServiceRequest()
    ss = msg.resource_spans.add().scope_spans.add()
    ss.scope.name = "lib.y"
    own = ss.spans.add()  # its own otel.scope.name wins over the scope's
    own.trace_id, own.span_id, own.name = b"\x01" * 16, b"\x03" * 8, "own"
    kv = own.attributes.add()
    kv.key, kv.value.string_value = "otel.scope.name", "mine"
    own.events.add().name = "exception"
    bare = ss.spans.add()  # no attributes: only the scope's name
    bare.trace_id, bare.span_id, bare.name = b"\x01" * 16, b"\x04" * 8, "bare"
    bare.status.code, bare.status.message = 2, "boom"
    prog = ss.spans.add()  # the key's text inside a value is not the key
    prog.trace_id, prog.span_id, prog.name = b"\x01" * 16, b"\x05" * 8, "prog"
    kv = prog.attributes.add()
    kv.key, kv.value.string_value = "note", "starttrace.in_progress"
    d = decode(msg.SerializeToString())
    rows = {r[3]: r for r in d.batch.processes[0].spans}
    assert decode_attrs(rows["own"][8]) == {"otel.scope.name": "mine"}
    assert rows["own"][9] == "exception"
    assert decode_attrs(rows["bare"][8]) == {"otel.scope.name": "lib.y"}
    assert rows["bare"][9] == "boom"
    assert rows["prog"][6] == 0 and decode_attrs(rows["prog"][8])["note"] == "starttrace.in_progress"
    # an invalid nested attribute (bad UTF-8 in a string) still fails the whole request
    body = bytearray(msg.SerializeToString())
    i = body.index(b"mine")
    body[i] = 0xFF
    try:
        _parse_and_decode(bytes(body), "application/x-protobuf")
    except BadRequest:
        pass
    else:
        raise AssertionError("invalid UTF-8 accepted")


def test_idle_checkpoint(tmp_path: Path) -> None:
    st = Store(tmp_path / "c.db")
    st.start()
    proc = ProcessBatch(source="otlp", resource={"starttrace.run_id": "r"}, spans=[_span(1, 5)])
    st.submit(IngestBatch(processes=[proc]))
    assert st.flush()
    assert st._unchecked_spans > 0
    deadline = time.time() + 5
    while st._unchecked_spans and time.time() < deadline:
        time.sleep(0.05)
    assert st._unchecked_spans == 0  # checkpointed once ingest went idle
    assert st.count_spans("r") == 1
    st.close()


def test_idle_checkpoint_waits_while_a_model_is_built(tmp_path: Path) -> None:
    """`deferring_checkpoints` (held by the model cache while it loads and builds a run) keeps the
    idle checkpoint from running next to the request; it runs once the build is done."""
    st = Store(tmp_path / "c.db")
    st.start()
    with st.deferring_checkpoints():
        proc = ProcessBatch(source="otlp", resource={"starttrace.run_id": "r"}, spans=[_span(1, 5)])
        st.submit(IngestBatch(processes=[proc]))
        assert st.flush()
        time.sleep(store_module.CHECKPOINT_IDLE_S * 3)
        assert st._unchecked_spans > 0  # idle, but not checkpointed
        assert st.count_spans("r") == 1  # reads go on
    deadline = time.time() + 5
    while st._unchecked_spans and time.time() < deadline:
        time.sleep(0.05)
    assert st._unchecked_spans == 0
    st.close()


@pytest.fixture(params=["c", "python"])
def rows_to_spans(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Rows become spans in C (`_modelcore.spans_from_rows`) and in Python."""
    if request.param == "c":
        if lane_reader.c_spans_from_rows is None:
            pytest.skip("starttrace._modelcore is not built here")
    else:
        monkeypatch.setattr(lane_reader, "c_spans_from_rows", None)
    return str(request.param)


def test_rows_become_the_same_spans_in_c_and_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every field of every span, and its attributes (bytes read lazily, JSON text, none at all)."""
    from starttrace.sources.store import run_from_rows

    if lane_reader.c_spans_from_rows is None:
        pytest.skip("starttrace._modelcore is not built here")
    st = Store(tmp_path / "s.db")
    text = [_span(1, 2000, attrs={"starttrace.launched_by": "00000000000000aa"}), _span(2, 2000, in_progress=True)]
    text.append(("ab" * 16, f"{7:016x}", f"{1:016x}", "bare", 1500, None, 1, 1, None, "Err", 5))
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for key, value in (("starttrace.run_id", "r"), ("service.instance.id", "proto")):
        rs.resource.attributes.add(key=key).value.string_value = value
    for i in range(3):
        sp = rs.scope_spans.add().spans.add(
            trace_id=b"\xab" * 16, span_id=bytes([0] * 7 + [9 + i]), name=f"import m{i}", start_time_unix_nano=5 + i,
            end_time_unix_nano=9 + i,
        )  # fmt: skip
        sp.attributes.add(key="starttrace.phase").value.string_value = "import"
    st.ingest_now(IngestBatch(processes=[ProcessBatch(source="otlp", resource={"starttrace.run_id": "r",
                  "service.instance.id": "text"}, spans=text)]))  # fmt: skip
    st.ingest_now(decode(req.SerializeToString()).batch)
    rows = st.load_rows("r")
    assert rows is not None

    def spans() -> list[tuple[object, ...]]:
        out = []
        for p in run_from_rows(rows).processes:
            for sp in p.spans:
                fields = [getattr(sp, f) for f in type(sp).__slots__ if f != "attrs"]
                out.append(
                    (type(sp), type(sp.attrs), fields, dict(sp.attrs), [(lk.span_id, lk.attrs) for lk in sp.links])
                )
        return out

    in_c = spans()
    with monkeypatch.context() as m:
        m.setattr(lane_reader, "c_spans_from_rows", None)
        assert spans() == in_c
    assert len(in_c) == 6 and {t[1].__name__ for t in in_c} == {"LazyAttrs", "dict"}
    st.close()


def test_launched_by_links_found_per_lane(tmp_path: Path, rows_to_spans: str) -> None:
    """`starttrace.launched_by` becomes a link wherever it is, whether the attributes are JSON text
    or OTLP bytes; the store searches each stored batch once, and only the spans of batches that
    hold the key are looked at."""
    from starttrace.sources.store import run_from_rows

    st = Store(tmp_path / "s.db")

    def lane(name: str, spans: list[SpanTuple]) -> ProcessBatch:
        res = {"starttrace.run_id": "r", "service.instance.id": name}
        return ProcessBatch(source="otlp", resource=res, spans=spans)

    child = [_span(1, 2000, attrs={"starttrace.launched_by": "00000000000000aa"}), _span(2, 2000)]
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for key, value in (("starttrace.run_id", "r"), ("service.instance.id", "proto")):
        rs.resource.attributes.add(key=key).value.string_value = value
    sp = rs.scope_spans.add().spans.add(
        trace_id=b"\xab" * 16, span_id=b"\0" * 7 + b"\x09", name="p", start_time_unix_nano=5, end_time_unix_nano=9
    )
    sp.attributes.add(key="starttrace.launched_by").value.string_value = "00000000000000bb"
    st.ingest_now(IngestBatch(processes=[lane("child", child), lane("other", [_span(3, 2000)])]))
    st.ingest_now(decode(req.SerializeToString()).batch)
    rows = st.load_rows("r")
    assert rows is not None
    links = {s.span_id: [lk.span_id for lk in s.links] for p in run_from_rows(rows).processes for s in p.spans}
    assert links == {
        f"{1:016x}": ["00000000000000aa"],
        f"{2:016x}": [],
        f"{3:016x}": [],
        "0000000000000009": ["00000000000000bb"],
    }
    st.close()


def test_launched_by_in_a_copy_from_another_lane(tmp_path: Path, rows_to_spans: str) -> None:
    """A span first stored in progress in one lane, then ended in another lane's batch with a
    `starttrace.launched_by`: the merged span keeps its first place and gets the link."""
    from starttrace.sources.store import run_from_rows

    st = Store(tmp_path / "s.db")

    def lane(name: str, spans: list[SpanTuple]) -> IngestBatch:
        res = {"starttrace.run_id": "r", "service.instance.id": name}
        return IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)])

    st.ingest_now(lane("first", [_span(1, 2000, in_progress=True)]))
    st.ingest_now(lane("later", [_span(1, 3000, attrs={"starttrace.launched_by": "00000000000000aa"})]))
    rows = st.load_rows("r")
    assert rows is not None
    spans = {p.instance_id: p.spans for p in run_from_rows(rows).processes}
    assert [(s.span_id, s.end_ns, [lk.span_id for lk in s.links]) for s in spans["first"]] == [
        (f"{1:016x}", 3000, ["00000000000000aa"])
    ]
    st.close()


def test_run_roots_are_startup_spans_whose_parent_is_not_in_the_run(tmp_path: Path) -> None:
    """A `startup` span is a root of the run when it has no parent, or a parent outside the run
    (a TRACEPARENT from a launcher); one under a span of the run stays in its lane."""
    st = Store(tmp_path / "s.db")

    def span(sid: str, parent: str | None, name: str) -> SpanTuple:
        return ("ab" * 16, sid, parent, name, 1000, 2000, 0, 0, "{}", None, None)

    lanes = {
        "a": [span("a" * 16, None, "startup"), span("a1" * 8, "a" * 16, "work")],
        "b": [span("b" * 16, "f" * 16, "startup"), span("b1" * 8, "b" * 16, "work")],  # parent outside
        "c": [span("c" * 16, "a1" * 8, "startup"), span("c1" * 8, "c" * 16, "work")],  # parent in lane a
    }
    for lane, spans in lanes.items():
        res = {"starttrace.run_id": "r", "service.instance.id": lane}
        st.ingest_now(IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)]))
    run = st.load_run("r")
    assert run is not None
    assert sorted(s.span_id for s in run.root_spans) == ["a" * 16, "b" * 16]
    by_lane = {p.instance_id: [s.span_id for s in p.spans] for p in run.processes}
    assert by_lane["c"] == ["c" * 16, "c1" * 8] and by_lane["a"] == ["a1" * 8] and by_lane["b"] == ["b1" * 8]
    st.close()
