"""Fast ingest paths: protobuf decoding straight to JSON attribute text, chunked multi-row upserts."""

from __future__ import annotations

import json
import math
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from starttrace.service import store as store_mod
from starttrace.service.otlp_receiver import decode
from starttrace.service.store import IngestBatch, ProcessBatch, SpanTuple, Store


def _span(i: int, end: int, in_progress: bool = False, attrs: dict | None = None) -> SpanTuple:
    a = dict(attrs or {"n": i})
    if in_progress:
        a["starttrace.in_progress"] = True
    return ("ab" * 16, f"{i:016x}", None, f"s{i}", 1000 + i, end, int(in_progress), 0, json.dumps(a), None, None)


def _batch(spans: list[SpanTuple]) -> IngestBatch:
    res = {"starttrace.run_id": "r", "service.instance.id": "lane"}
    return IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)])


def test_chunked_upsert_dedupes_and_replaces_in_progress(tmp_path: Path) -> None:
    n = store_mod.SPAN_CHUNK_ROWS * 2 + 7  # several full chunks and a partial one
    db = tmp_path / "s.db"
    st = Store(db)
    first = [_span(i, 5000 + i, in_progress=i % 3 == 0) for i in range(n)]
    # in one transaction: everything, then everything again (duplicates land in the same and in
    # other chunks), then the in-progress spans ended, then an older in-progress copy of span 1
    ended = [_span(i, 9000 + i) for i in range(0, n, 3)]
    st._write_batches([_batch(first), _batch(list(reversed(first))), _batch(ended), _batch([_span(1, 7, True)])])
    assert st.count_spans("r") == n
    rows = {r[1]: r for r in st.load_run("r").spans}  # type: ignore[union-attr]
    assert len(rows) == n
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
    st2.close()


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
    attrs = json.loads(row[8])
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
