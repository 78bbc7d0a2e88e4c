"""The store's span columns: OTLP spans stored as received plus their column attributes read once,
packed one Arrow IPC stream per batch, read back as one table with every span once."""

from __future__ import annotations

import json
import math
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from starttrace.run import SPAN_SCHEMA, column_values, decode_attrs
from starttrace.run.otlp_attrs import span_attrs
from starttrace.sources import store as store_module
from starttrace.sources.batches import unpack_spans
from starttrace.sources.otlp import decode
from starttrace.sources.store import IngestBatch, ProcessBatch, SpanTuple, Store

_TUPLE_COLS = ["span_id", "parent_id", "name", "start", "end", "in_progress", "instant", "attrs", "error", "thread"]


def _span(i: int, end: int, in_progress: bool = False, attrs: dict | None = None) -> SpanTuple:
    a = dict(attrs or {"n": i})
    if in_progress:
        a["starttrace.in_progress"] = True
    return ("ab" * 16, f"{i:016x}", None, f"s{i}", 1000 + i, end, int(in_progress), 0, json.dumps(a), None, None)


def _batch(spans: list[SpanTuple]) -> IngestBatch:
    res = {"starttrace.run_id": "r", "service.instance.id": "lane"}
    return IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)])


def _rows(frame: pl.DataFrame) -> dict[str, dict[str, Any]]:
    return {r["span_id"]: r for r in frame.iter_rows(named=True)}


def _packed_rows(db: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(db) as conn:
        return [(int(r[0]), int(r[1])) for r in conn.execute("SELECT spans, rows FROM span_batches ORDER BY seq")]


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
    assert _packed_rows(db) == [(n, n), (0, n), (0, len(ended))]
    rows = st.load_rows("r")
    assert rows is not None and rows.spans.schema == pl.Schema(SPAN_SCHEMA)
    listed = rows.spans
    assert listed["span_id"].to_list() == [f"{i:016x}" for i in range(n)]  # each span once, at its first place
    got = _rows(listed)
    for i in range(n):
        row = got[f"{i:016x}"]
        if i % 3 == 0:
            assert (row["end"], row["in_progress"]) == (9000 + i, False)  # the ended copy won
        else:
            assert (row["end"], row["in_progress"]) == (5000 + i, False)  # never replaced by the in-progress copy
    st.close()
    # after a restart the same spans are still stored once
    st2 = Store(db)
    st2.ingest_now(_batch(first[:50] + ended[:10]))
    assert st2.count_spans("r") == n
    again = st2.load_rows("r")
    assert again is not None and again.spans.equals(listed)
    st2.close()


def test_unreadable_batch_is_reported_and_the_rest_kept(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    st = Store(db)
    st.ingest_now(_batch([_span(i, 5000) for i in range(5)]))
    st.ingest_now(_batch([_span(i, 5000) for i in range(5, 8)]))
    st.ingest_now(_batch([_span(i, 5000) for i in range(8, 10)]))
    other = pl.DataFrame({"x": [1, 2]})
    from starttrace.sources.batches import write_packed

    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE span_batches SET body = x'0badf00d' WHERE seq = 1")  # not a stream
        conn.execute("UPDATE span_batches SET body = ? WHERE seq = 3", (write_packed(other),))  # other columns
    st.close()
    st = Store(db)
    rows = st.load_rows("r")
    assert rows is not None and rows.unreadable == 2
    assert rows.spans["span_id"].to_list() == [f"{i:016x}" for i in range(5, 8)]
    assert any("could not be read" in p for p in rows.problems)
    run = st.load_run("r")
    assert run is not None and any("could not be read" in p for p in run.problems)
    st.ingest_now(_batch([_span(9, 5000)]))  # the writer goes on
    st.close()


def _merge_copy(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """The merge rule, one copy at a time (what the store's reader did span by span before)."""
    if old["in_progress"] or (not new["in_progress"] and (old["attrs"] != new["attrs"] or old["end"] != new["end"])):
        return {**new, "lane": old["lane"], "start": old["start"], "instant": old["instant"], "thread": old["thread"]}
    return None


def _reference(batches: list[tuple[str, int, pl.DataFrame]]) -> pl.DataFrame:
    """Batches (lane, trace, spans) in arrival order, folded copy by copy: each span (a process's
    span id) once, at its first place, merged."""
    out: list[dict[str, Any]] = []
    seen: dict[tuple[int, str, str], int] = {}
    for lane, trace, frame in batches:
        for row in frame.iter_rows(named=True):
            row = {**row, "lane": lane}
            at = seen.get((trace, lane, row["span_id"]))
            if at is None:
                seen[trace, lane, row["span_id"]] = len(out)
                out.append(row)
            else:
                merged = _merge_copy(out[at], row)
                if merged is not None:
                    out[at] = merged
    return pl.DataFrame(out, schema=SPAN_SCHEMA)


@pytest.mark.parametrize("fresh_spans", [store_module.FRESH_SPANS, 150, 0], ids=["fresh", "some-fresh", "stored"])
@pytest.mark.parametrize("seed", range(8))
def test_spans_read_as_folded_copy_by_copy(tmp_path: Path, seed: int, fresh_spans: int) -> None:
    """Batches of three lanes and two traces, some repeating spans of earlier batches (in
    progress, then ended, or ended twice with other attributes or the same; a span id another lane
    sent is a span of its own), in random order and
    sizes: the table read back (one table operation for the repeats) is the copy-by-copy fold;
    whether the batches are read from the store's blobs, from the tables the writer kept of the
    newest ones (`_FreshBatches`), or from both."""
    rng = random.Random(seed)
    db = tmp_path / "s.db"
    st = Store(db)
    st._fresh.max_spans = fresh_spans
    traces = ["ab" * 16, "cd" * 16]
    sent: list[SpanTuple] = []
    for _ in range(40):
        lane = rng.choice(["l0", "l1", "l2"])
        trace = rng.choice(traces)
        spans = []
        for _ in range(rng.randint(1, 30)):
            if sent and rng.random() < 0.2:  # a copy of an earlier span, from any lane
                old = rng.choice(sent)
                if old[0] != trace:
                    continue
                attrs = rng.choice([old[8], json.dumps({"v": rng.randint(0, 2)})])
                is_open = int(rng.random() < 0.3)
                copy = (*old[:3], f"n{rng.randint(0, 9)}", old[4] + 1, old[5] + rng.randint(0, 1), is_open, 1, attrs,
                        rng.choice([None, "E"]), 7)  # fmt: skip
                spans.append(copy)
            else:
                i = rng.getrandbits(48)
                is_open = rng.random() < 0.3
                attrs = json.dumps({"n": i, "starttrace.phase": rng.choice(["import", "x"])})
                span = (trace, f"{i:016x}", None, f"s{i}", 1000, 2000, int(is_open), 0, attrs, None, None)
                spans.append(span)
                sent.append(span)
        res = {"starttrace.run_id": "r", "service.instance.id": lane}
        st.ingest_now(IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)]))
    with sqlite3.connect(db) as conn:
        stored = conn.execute(
            "SELECT l.lane_id, b.trace, b.spans, b.body FROM span_batches b JOIN lanes l ON l.id = b.lane"
            " ORDER BY b.seq"
        ).fetchall()
    batches = [(lane, trace, unpack_spans(body)) for lane, trace, _, body in stored]
    assert any(n < f.height for (_, _, n, _), (_, _, f) in zip(stored, batches, strict=True))  # some repeat spans
    want = _reference(batches)
    with sqlite3.connect(db) as conn:
        rows_now = conn.execute("SELECT seq, lane, trace, spans, rows FROM span_batches").fetchall()
    fresh = st._fresh.get(rows_now)
    assert (len(fresh) == len(stored)) if fresh_spans > 1000 else (len(fresh) < len(stored))
    assert bool(fresh) == (fresh_spans > 0)
    for _ in range(2):  # read twice: a read leaves the tables it took as they were
        got = st.load_rows("r")
        assert got is not None
        assert got.spans.equals(want)
    assert want.height == st.count_spans("r")
    st.close()


def test_every_column_round_trips(tmp_path: Path) -> None:
    """What a source hands the store comes back column by column: OTLP spans (the column
    attributes read at decode, the attribute entries' raw bytes kept) and journal spans (JSON text)."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for key, value in (("starttrace.run_id", "r"), ("service.instance.id", "proto")):
        rs.resource.attributes.add(key=key).value.string_value = value
    ss = rs.scope_spans.add()
    a = ss.spans.add(trace_id=b"\xab" * 16, span_id=b"\0" * 7 + b"\x01", name="import m", start_time_unix_nano=5,
                     end_time_unix_nano=9)  # fmt: skip
    a.attributes.add(key="starttrace.phase").value.string_value = "import"
    a.attributes.add(key="starttrace.import.module").value.string_value = "m"
    a.attributes.add(key="starttrace.import.self_us").value.int_value = 12
    a.attributes.add(key="code.file.path").value.string_value = "/m.py"
    b = ss.spans.add(trace_id=b"\xab" * 16, span_id=b"\0" * 7 + b"\x02", parent_span_id=b"\0" * 7 + b"\x01",
                     name="process", start_time_unix_nano=6, end_time_unix_nano=6)  # fmt: skip
    b.attributes.add(key="starttrace.launched_by").value.string_value = "00000000000000aa"
    b.attributes.add(key="starttrace.in_progress").value.bool_value = True
    b.status.code, b.status.message = 2, "boom"
    journal = [
        ("ab" * 16, "00000000000000j1", None, "cuda.init", 100, None, 1, 0,
         json.dumps({"starttrace.phase": "cuda_init", "starttrace.import.self_us": 1.5}), None, 42),
        ("ab" * 16, "00000000000000j2", "00000000000000j1", "mark", 2**70, 2**70, 0, 1, None, "Err", 2**65),
    ]  # fmt: skip
    st = Store(tmp_path / "s.db")
    st.ingest_now(decode(req.SerializeToString()).batch)
    res = {"starttrace.run_id": "r", "service.instance.id": "journal"}
    st.ingest_now(IngestBatch(processes=[ProcessBatch(source="journal", resource=res, spans=journal)]))
    # the journal watcher's form: the column attributes read by the journal reader, handed on as they are
    read = [("ab" * 16, "00000000000000k1", None, "import y", 7, 8, 0, 0, '{"a":1}', None, 3, "import", "y", 2.0, None)]
    res = {"starttrace.run_id": "r", "service.instance.id": "read"}
    st.ingest_now(IngestBatch(processes=[ProcessBatch(source="journal", resource=res, spans=read)]))
    rows = st.load_rows("r")
    assert rows is not None
    got = _rows(rows.spans)
    attrs_only = type(a)()
    attrs_only.attributes.extend(a.attributes)
    raw_a = attrs_only.SerializeToString()
    assert {k: v for k, v in got["0000000000000001"].items() if k != "attrs_pb"} == {
        "lane": "proto", "span_id": "0000000000000001", "parent_id": None, "name": "import m", "start": 5, "end": 9,
        "in_progress": False, "instant": False, "error": None, "thread": None, "phase": "import", "module": "m",
        "self_us": 12.0, "launched_by": None, "attrs": None,
    }  # fmt: skip
    assert got["0000000000000001"]["attrs_pb"] == raw_a  # its attribute entries as received (its scope has no name)
    assert decode_attrs(None, got["0000000000000001"]["attrs_pb"])["code.file.path"] == "/m.py"
    assert {k: got["0000000000000002"][k] for k in ("parent_id", "in_progress", "instant", "error", "launched_by")} == {
        "parent_id": "0000000000000001", "in_progress": True, "instant": False, "error": "boom",
        "launched_by": "00000000000000aa",
    }  # fmt: skip
    j1, j2 = got["00000000000000j1"], got["00000000000000j2"]
    assert (j1["lane"], j1["end"], j1["in_progress"], j1["thread"], j1["phase"], j1["self_us"], j1["module"]) == (
        "journal",
        None,
        True,
        42,
        "cuda_init",
        1.5,
        None,
    )
    assert json.loads(j1["attrs"]) == json.loads(journal[0][8]) and j1["attrs_pb"] is None
    k1 = got["00000000000000k1"]
    assert (k1["in_progress"], k1["instant"], k1["phase"], k1["module"], k1["self_us"], k1["attrs"]) == (
        False, False, "import", "y", 2.0, '{"a":1}'
    )  # fmt: skip
    # times past int64 are clamped (as the journal reader's table does), a thread id past it is left out
    assert (j2["start"], j2["instant"], j2["error"], j2["thread"], j2["attrs"]) == (2**63 - 1, True, "Err", None, None)
    st.close()


def test_decoded_columns_follow_the_attribute_rule() -> None:
    """The column attributes read at decode are what `run.column_values` reads of the decoded
    attributes, whatever their kinds: repeated keys (the last wins), other types, empty strings."""
    cases: list[list[tuple[str, str, Any]]] = [
        [],
        [("starttrace.phase", "string_value", "import"), ("starttrace.phase", "string_value", "compile")],
        [("starttrace.phase", "string_value", ""), ("starttrace.import.module", "string_value", "")],
        [("starttrace.phase", "int_value", 3), ("starttrace.import.module", "bool_value", True)],
        [("starttrace.import.self_us", "double_value", 2.5), ("starttrace.launched_by", "string_value", "")],
        [("starttrace.import.self_us", "bool_value", True), ("starttrace.launched_by", "int_value", 7)],
        [("starttrace.import.self_us", "string_value", "9"), ("starttrace.launched_by", "string_value", "ab")],
        [("starttrace.import.self_us", "int_value", -4), ("starttrace.phase", "string_value", "x")],
    ]
    msg = ExportTraceServiceRequest()
    ss = msg.resource_spans.add().scope_spans.add()
    for i, attrs in enumerate(cases):
        sp = ss.spans.add(trace_id=b"\x01" * 16, span_id=bytes([0] * 7 + [i + 1]), name=f"s{i}")
        for key, field, value in attrs:
            kv = sp.attributes.add()
            kv.key = key
            setattr(kv.value, field, value)
    d = decode(msg)
    assert d.accepted == len(cases)
    for row in d.batch.processes[0].spans:
        assert tuple(row[11:15]) == column_values(span_attrs(row[8])), row[3]


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
    attrs = decode_attrs(None, row[8])  # stored as the span's raw protobuf bytes, decoded for the rows that ask
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
    assert decode_attrs(None, rows["own"][8]) == {"otel.scope.name": "mine"}
    assert rows["own"][9] == "exception"
    assert decode_attrs(None, rows["bare"][8]) == {"otel.scope.name": "lib.y"}
    assert rows["bare"][9] == "boom"
    assert rows["prog"][6] == 0 and decode_attrs(None, rows["prog"][8])["note"] == "starttrace.in_progress"
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


def test_launched_by_is_a_column_from_text_or_bytes(tmp_path: Path) -> None:
    """`starttrace.launched_by` is a column whether the attributes are JSON text or OTLP bytes."""
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
    run = st.load_run("r")
    assert run is not None
    assert dict(run.spans.select("span_id", "launched_by").iter_rows()) == {
        f"{1:016x}": "00000000000000aa",
        f"{2:016x}": None,
        f"{3:016x}": None,
        "0000000000000009": "00000000000000bb",
    }
    st.close()


def test_a_span_id_from_another_lane_is_a_span_of_its_own(tmp_path: Path) -> None:
    """A span id stored in progress in one lane, then ended in another lane's batch with a
    `starttrace.launched_by`: a span is identified by process and span id (issue 38), so these are
    two spans, each in its lane, the later one with the column; the first stays in progress."""
    st = Store(tmp_path / "s.db")

    def lane(name: str, spans: list[SpanTuple]) -> IngestBatch:
        res = {"starttrace.run_id": "r", "service.instance.id": name}
        return IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)])

    st.ingest_now(lane("first", [_span(1, 2000, in_progress=True)]))
    st.ingest_now(lane("later", [_span(1, 3000, attrs={"starttrace.launched_by": "00000000000000aa"})]))
    run = st.load_run("r")
    assert run is not None
    assert sorted(run.spans.select("lane", "span_id", "end", "in_progress", "launched_by").rows()) == [
        ("first", f"{1:016x}", 2000, True, None),
        ("later", f"{1:016x}", 3000, False, "00000000000000aa"),
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
    by_lane = {p.instance_id: run.spans_of(p)["span_id"].to_list() for p in run.processes}
    assert by_lane["c"] == ["c" * 16, "c1" * 8] and by_lane["a"] == ["a1" * 8] and by_lane["b"] == ["b1" * 8]
    st.close()


def test_run_table_lane_by_lane_by_start(tmp_path: Path) -> None:
    """The run's table: lanes in the processes' order (by creation: the `process` span's start,
    else the first span's), each lane's rows by start, then arrival; a lane without a process row
    is a process of its own."""
    st = Store(tmp_path / "s.db")

    def span(sid: str, name: str, start: int) -> SpanTuple:
        return ("ab" * 16, sid, None, name, start, start + 10, 0, 0, None, None, None)

    lanes = {
        "late": [span("l2" * 8, "b", 900), span("l1" * 8, "process", 500), span("l3" * 8, "a", 900)],
        "early": [span("e1" * 8, "x", 300), span("e2" * 8, "y", 100)],
    }
    for lane, spans in lanes.items():
        res = {"starttrace.run_id": "r", "service.instance.id": lane, "process.pid": 7}
        st.ingest_now(IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)]))
    run = st.load_run("r")
    assert run is not None
    assert [(p.instance_id, p.created_ns, p.process_span_id, p.pid) for p in run.processes] == [
        ("early", 100, "", 7),
        ("late", 500, "l1" * 8, 7),
    ]
    assert run.spans.select("lane", "span_id").rows() == [
        ("early", "e2" * 8), ("early", "e1" * 8), ("late", "l1" * 8), ("late", "l2" * 8), ("late", "l3" * 8)
    ]  # fmt: skip
    st.close()


def test_implausible_spans_left_out_and_named(tmp_path: Path) -> None:
    """A span at 1970 (start_time_unix_nano=0) is dropped from the run and named in its problems."""
    st = Store(tmp_path / "s.db")
    t = 1_700_000_000 * 10**9

    def span(sid: str, start: int, end: int | None) -> SpanTuple:
        return ("ab" * 16, sid, None, "work", start, end, int(end is None), 0, None, None, None)

    spans = [span("a" * 16, t, t + 5), span("b" * 16, 0, 10), span("c" * 16, t, t + 10**18), span("d" * 16, t, None)]
    res = {"starttrace.run_id": "r", "service.instance.id": "x", "starttrace.role": "worker"}
    st.ingest_now(IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)]))
    run = st.load_run("r")
    assert run is not None
    assert run.spans["span_id"].to_list() == ["a" * 16, "d" * 16]
    assert len(run.problems) == 1 and run.problems[0].startswith("worker pid 0: 2 spans with implausible times")
    assert "1970-01-01T00:00:00Z" in run.problems[0]
    st.close()


def test_deleted_run_leaves_no_fresh_table_behind(tmp_path: Path) -> None:
    """SQLite gives a new batch the seq of the newest deleted one: the tables the writer kept go
    with a delete, so a run written after it reads its own spans (and reads them again: a read
    leaves the table it takes as it was)."""
    st = Store(tmp_path / "s.db")
    st.ingest_now(_batch([_span(i, 5000) for i in range(5)]))
    st.delete_runs(["r"])
    assert not st._fresh._frames and not st._fresh._unread
    st.ingest_now(_batch([_span(i, 5000) for i in range(100, 103)]))
    for _ in range(2):  # one batch, its table taken as it is: a read leaves it as it was
        rows = st.load_rows("r")
        assert rows is not None
        assert rows.spans["span_id"].to_list() == [f"{i:016x}" for i in range(100, 103)]
    st.close()


def test_fresh_tables_failing_are_reported_once_and_the_blobs_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = Store(tmp_path / "s.db")
    real = store_module.read_packed
    calls = {"n": 0}

    def failing(bodies: Any, rows: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= 2:  # the writer's tables, twice: the store's own read of the blobs comes after
            raise MemoryError("no room")
        return real(bodies, rows)

    monkeypatch.setattr(store_module, "read_packed", failing)
    monkeypatch.setattr(store_module, "FRESH_READ_SPANS", 1)
    st.ingest_now(_batch([_span(i, 5000) for i in range(5)]))
    st.ingest_now(_batch([_span(i, 5000) for i in range(5, 8)]))
    rows = st.load_rows("r")
    assert rows is not None and rows.spans.height == 8
    assert [e for e in st.errors if "fresh" in e] == ["fresh batches not kept: MemoryError: no room"]
    st.close()


def test_a_seq_reused_by_another_writer_is_read_from_its_blob(tmp_path: Path) -> None:
    """Another process deletes the run and writes a batch under the same seq: the table this
    store kept of the old batch (other rows) is not taken."""
    st = Store(tmp_path / "s.db")
    st.ingest_now(_batch([_span(i, 5000) for i in range(5)]))
    assert st.load_rows("r") is not None and st._fresh._frames
    other = Store(tmp_path / "s.db")
    other.delete_runs(["r"])
    other.ingest_now(_batch([_span(i, 5000) for i in range(100, 103)]))
    other.close()
    rows = st.load_rows("r")
    assert rows is not None
    assert rows.spans["span_id"].to_list() == [f"{i:016x}" for i in range(100, 103)]
    st.close()


@pytest.mark.parametrize("starts", [(5, 1_750_000_000 * 10**9, 1_750_000_001 * 10**9), (5, 7, 9)])
def test_a_packed_table_is_what_its_tuples_pack_to(starts: tuple[int, ...]) -> None:
    """`pack_frame` (a table: the journal watcher) gives what `pack_by_trace` gives for the same
    spans as tuples: ids, open ids (no end, or in progress), the time range (a start before 2000
    does not move the first time while a plausible one exists), and the stored columns."""
    from starttrace.sources.batches import pack_by_trace, pack_frame, span_frame

    trace = "ab" * 16
    ends = (None, starts[1] + 50, None)
    tuples = [
        (trace, f"{i:016x}", None, f"s{i}", start, end, int(i == 1), 0, json.dumps({"n": i}), None, None,
         "import", f"m{i}", 1.5, None)
        for i, (start, end) in enumerate(zip(starts, ends, strict=True))
    ]  # fmt: skip
    (old,) = pack_by_trace(tuples)
    new = pack_frame(trace, span_frame(tuples))
    assert (new.span_ids, new.open_ids, new.first_ns, new.last_ns) == (
        old.span_ids, old.open_ids, old.first_ns, old.last_ns,
    )  # fmt: skip
    assert new.open_ids == [f"{i:016x}" for i in range(3)]
    assert unpack_spans(new.body).equals(unpack_spans(old.body))
