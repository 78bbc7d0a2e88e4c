"""The page's data at any size: the first answer of `GET /startup/{run}` holds the spans of the
first zoom level (a big run: part of them, within its budget), the rest comes lane by lane and
window by window; the first answer is prebuilt after ingest and kept in the store, so a restarted
service answers it without building the model."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
from fastapi.testclient import TestClient
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
from st_service_helpers import flush
from synth_runs import make_run, protobuf_batches, to_protobuf

from starttrace.analysis.lanes import build_model
from starttrace.run import Process, Run, Span, spans_table
from starttrace.service.model_cache import FIRST_VIEW, ModelCache
from starttrace.sources.store import Store
from starttrace.views.json import to_json
from starttrace.views.startup_json import FIRST_ROWS, PAGE_FIELDS, first_payload, lane_detail

PB = {"Content-Type": "application/x-protobuf"}


def _post(client: TestClient, run: Any, batch: int = 4096) -> None:
    for body in protobuf_batches(run, batch):
        assert client.post("/v1/traces", content=body, headers=PB).status_code == 200
    flush(client)


def test_small_run_is_sent_whole(client: TestClient) -> None:
    run = make_run(ranks=2, imports_per_rank=40, run_id="small", seed=2)
    _post(client, run)
    doc = client.get("/startup/small").json()
    assert doc["span_fields"] == PAGE_FIELDS and doc["first_answer"]["complete"]
    rows = [r for lane in doc["lanes"] for r in lane["spans"]]
    assert len(rows) == run.span_count
    for lane in doc["lanes"]:
        assert lane["complete"] and lane["detail_min_us"] == 0
        assert [r[9] for r in lane["spans"]] == list(range(len(lane["spans"])))  # pos = index when whole


def test_big_run_first_answer_and_lazy_detail(make_client: Callable[..., TestClient]) -> None:
    client = make_client(prebuild_idle_s=None)
    run = make_run(ranks=4, imports_per_rank=8000, run_id="big", seed=5)
    _post(client, run)
    r = client.get("/startup/big")
    doc = r.json()
    first = doc["first_answer"]
    assert not first["complete"] and first["of_spans"] == run.span_count
    assert first["spans"] <= FIRST_ROWS and len(r.content) < 2_000_000
    assert "findings" in doc and doc["phases"]
    full = client.get("/startup/big?spans=all").json()  # every span, as before
    assert sum(len(ln["spans"]) for ln in full["lanes"]) == run.span_count
    for lane, whole in zip(doc["lanes"], full["lanes"], strict=True):
        by_pos = {r[9]: r for r in lane["spans"]}
        for row in lane["spans"]:  # nothing in the first answer lost its parent
            assert row[1] == -1 or row[1] in by_pos, row[2]
        shown = {r[0] for r in lane["spans"]}
        for row in whole["spans"]:
            end = row[5] if row[5] is not None else row[4]
            if row[3] != "import" or end - row[4] >= lane["detail_min_us"]:
                assert row[0] in shown, (lane["label"], row[2])  # every span the first zoom shows
        assert lane["complete"] == (len(lane["spans"]) == len(whole["spans"]))
    worker = next(i for i, ln in enumerate(doc["lanes"]) if ln["role"] == "worker")
    assert not doc["lanes"][worker]["complete"]
    # a whole lane
    lane = client.get(f"/startup/big/lanes/{worker}/spans").json()
    assert lane["complete"] and len(lane["spans"]) == doc["lanes"][worker]["span_count"]
    assert [r[:9] for r in lane["spans"]] == full["lanes"][worker]["spans"] and lane["version"] == doc["version"]
    # a zoom window: spans overlapping it, at least min_us long
    mid = int(doc["duration_s"] * 1e6) // 2
    window = {"start_us": mid, "end_us": mid + 50_000, "min_us": 100}
    part = client.get(f"/startup/big/lanes/{worker}/spans", params=window).json()
    assert 0 < len(part["spans"]) < len(lane["spans"]) and not part["complete"]
    for row in part["spans"]:
        end = row[5] if row[5] is not None else row[4]
        assert end >= mid and row[4] <= mid + 50_000
        assert end - row[4] >= 100 or row[7] & 3
    expected = [
        r
        for r in lane["spans"]
        if (r[5] or r[4]) >= mid and r[4] <= mid + 50_000 and ((r[5] or r[4]) - r[4] >= 100 or r[7] & 3)
    ]
    assert part["spans"] == expected
    limited = client.get(f"/startup/big/lanes/{worker}/spans", params={"limit": 10}).json()
    assert len(limited["spans"]) == 10 and limited["truncated"]
    assert client.get("/startup/big/lanes/99/spans").status_code == 404
    assert client.get("/startup/nope/lanes/0/spans").json()["error"] == "run not found"
    assert client.get(f"/startup/big/lanes/{worker}/spans", params={"min_us": -1}).status_code == 422


def test_first_answer_survives_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "st.db"
    store = Store(db)
    cache = ModelCache(store, live_ttl_s=1.0, idle_s=None)
    store.on_runs_written = cache.note_written
    run = make_run(ranks=2, imports_per_rank=30, run_id="kept", seed=3)
    from starttrace.sources.otlp import decode

    store.ingest_now(decode(to_protobuf(run).SerializeToString()).batch)
    body = cache.first_bytes("kept")
    assert body is not None
    assert store.load_view("kept", FIRST_VIEW) == (store.run_version("kept"), body)
    store.close()
    # a restarted service: a new store on the same file, nothing in memory
    again = Store(db)
    fresh = ModelCache(again, live_ttl_s=1.0, idle_s=None)
    assert fresh.first_bytes("kept") == body
    assert fresh._models == {}, "answered from the store, no model built"
    assert fresh.head("kept")["run_id"] == "kept"
    # new spans: a new version; the saved answer no longer applies
    more = make_run(ranks=3, imports_per_rank=30, run_id="kept", seed=3)
    again.ingest_now(decode(to_protobuf(more).SerializeToString()).batch)
    assert fresh.first_bytes("kept") != body
    assert "kept" in fresh._models
    assert again.save_view("kept", FIRST_VIEW, 1, b"{}") is False  # an old version is not kept
    again.delete_runs(["kept"])
    assert again.load_view("kept", FIRST_VIEW) is None
    again.close()


def test_model_is_prebuilt_when_ingest_goes_idle(make_client: Callable[..., TestClient]) -> None:
    client = make_client(prebuild_idle_s=0.05)
    cache = client.app.state.cache  # type: ignore[attr-defined]
    run = make_run(ranks=2, imports_per_rank=50, run_id="pre", seed=4)
    _post(client, run)
    deadline = time.monotonic() + 30
    while (cache.pending or "pre" not in cache._first) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "pre" in cache._models and "pre" in cache._first and cache.prebuilt >= 1
    assert client.app.state.store.load_view("pre", FIRST_VIEW) is not None  # type: ignore[attr-defined]
    model = cache._models["pre"][2]
    assert client.get("/startup/pre").status_code == 200
    assert cache._models["pre"][2] is model, "the request used the prebuilt model"
    assert client.get("/healthz").json()["models_pending"] == 0


def test_html_page_from_the_first_answer(client: TestClient) -> None:
    run = make_run(ranks=2, imports_per_rank=20, run_id="page", seed=6)
    _post(client, run)
    html = client.get("/startup/page", headers={"Accept": "text/html"}).text
    assert 'data-lane-url="/startup/page/lanes/{lane}/spans"' in html
    assert "worker" in html and 'id="rank-table"' in html


def _row_run() -> Run:
    """One process: a root, imports (one whose module is not its name), an error without attributes,
    a span in progress, an instant; one span's attributes as OTLP bytes, the others as JSON text."""
    ms = 1_000_000
    t = 1_700_000_000_000_000_000
    imp = {"starttrace.phase": "import", "starttrace.import.module": "a", "code.file.path": "/a.py"}
    spans = [
        Span("p", None, "process", t, t + 100 * ms, {"starttrace.phase": "process"}),
        Span("i1", "p", "import a", t + ms, t + 30 * ms, imp),
        Span("i2", "i1", "import a.b", t + 2 * ms, t + 9 * ms, dict(imp, **{"starttrace.import.module": "other"})),
        Span("e", "p", "cuda.init", t + 40 * ms, t + 41 * ms, error="no GPU"),
        Span("o", "p", "vllm.load", t + 50 * ms, None, {"starttrace.in_progress": True}, in_progress=True),
        Span("r", "p", "ready", t + 60 * ms, t + 60 * ms, {"starttrace.phase": "ready"}, instant=True),
    ]
    table = spans_table([("L", s) for s in spans])
    pb = OtlpSpan(
        attributes=[
            KeyValue(key=k, value=AnyValue(string_value=v))
            for k, v in (
                ("starttrace.phase", "import"),
                ("starttrace.import.module", "other"),
                ("code.file.path", "/a/b.py"),
            )
        ]
    )
    table = table.with_columns(
        pl.when(pl.col("span_id") == "i2").then(pl.lit(pb.SerializeToString())).otherwise(None).alias("attrs_pb"),
        pl.when(pl.col("span_id") == "i2").then(None).otherwise(pl.col("attrs")).alias("attrs"),
    )
    res = {"service.instance.id": "L", "process.pid": 7, "process.parent_pid": 1, "starttrace.role": "main"}
    return Run("rows", "t" * 32, "", {}, [Process("L", 7, 1, None, res, "p", exited=None)], [], [], spans=table)


def test_span_rows_from_the_table() -> None:
    """Each span row: parent by position, times in µs from t0, flags, and only the attributes the
    row does not already say (not the phase; not an import's module when its name says it)."""
    model = build_model(_row_run(), now_ns=1_700_000_000_200_000_000)
    rows = to_json(model)["lanes"][0]["spans"]
    assert rows == [
        ["p", -1, "process", "process", 0, 100_000, 0, 0, None],
        ["i1", 0, "import a", "import", 1_000, 30_000, 1, 0, {"code.file.path": "/a.py"}],
        [
            "i2",
            1,
            "import a.b",
            "import",
            2_000,
            9_000,
            2,
            0,
            {"starttrace.import.module": "other", "code.file.path": "/a/b.py"},
        ],
        ["e", 0, "cuda.init", "cuda_init", 40_000, 41_000, 1, 4, {"error": "no GPU"}],
        ["o", 0, "vllm.load", "other", 50_000, None, 1, 1, None],
        ["r", 0, "ready", "ready", 60_000, 60_000, 1, 2, None],
    ]
    # the page's rows: the same, with each span's position; a window of one lane
    first = first_payload(model)["lanes"][0]
    assert (
        first["complete"]
        and [r[:-1] for r in first["spans"]] == rows
        and [r[-1] for r in first["spans"]] == list(range(6))
    )
    detail = lane_detail(model, 0, start_us=35_000, end_us=55_000, min_us=0)
    assert detail is not None and [r[0] for r in detail["spans"]] == ["p", "e", "o"] and not detail["complete"]
    # a budget of 4 rows: the spans that are not imports (4) fill it, the imports wait for the detail
    small = first_payload(model, rows=4, whole_run=0)
    assert [r[0] for r in small["lanes"][0]["spans"]] == ["p", "e", "o", "r"]
    assert small["lanes"][0]["detail_min_us"] == 29_000 + 1  # the longest import left out: 29 ms, rounded up
    # one row more: the longest import, not its child
    assert [r[0] for r in first_payload(model, rows=5, whole_run=0)["lanes"][0]["spans"]] == ["p", "i1", "e", "o", "r"]
