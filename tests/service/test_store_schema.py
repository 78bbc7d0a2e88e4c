"""The store's schema version: a version-4 file (batches as marshal blobs of tuples) is converted to
span columns in place, a version-2 or -3 file (one row per span) is upgraded in place, the span ids
the writer keeps in memory are read back after a restart and after being forgotten."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from starttrace.run import decode_attrs
from starttrace.sources import store as store_mod
from starttrace.sources.store import IngestBatch, ProcessBatch, SpanTuple, Store


def _span(i: int, end: int, in_progress: bool = False, trace: str = "ab" * 16) -> SpanTuple:
    attrs = json.dumps({"n": i, "end": end})
    return (trace, f"{i:016x}", None, f"s{i}", 1000 + i, end, int(in_progress), 0, attrs, None, None)


def _batch(spans: list[SpanTuple], run_id: str = "r") -> IngestBatch:
    res = {"starttrace.run_id": run_id, "service.instance.id": "lane"}
    return IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)])


_V3_SPANS = """
CREATE TABLE spans (
    seq INTEGER PRIMARY KEY, span_id TEXT NOT NULL, trace INTEGER NOT NULL, lane INTEGER NOT NULL,
    parent_id TEXT, name TEXT NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER, in_progress INTEGER NOT NULL,
    instant INTEGER NOT NULL, attrs BLOB, error TEXT, thread INTEGER
);
CREATE INDEX spans_lane ON spans(lane);
"""


def _as_old_file(db: Path, version: int) -> None:
    """Rewrite a store file as a version-3 (or version-2: a unique span index) store left it: one row
    per span in `spans`, no `span_batches`."""
    with sqlite3.connect(db) as conn:
        batches = conn.execute("SELECT lane, trace, body FROM span_batches ORDER BY seq").fetchall()
        conn.executescript("DROP TABLE span_batches;" + _V3_SPANS)
        if version == 2:
            conn.execute("CREATE UNIQUE INDEX spans_key ON spans(span_id, trace)")
        else:
            conn.execute("CREATE INDEX spans_trace ON spans(trace)")
        cols = ["span_id", "parent_id", "name", "start", "end", "in_progress", "instant", "attrs", "error", "thread"]
        for lane, trace, body in batches:
            for sp in store_mod.unpack_spans(body).select(cols).iter_rows():
                conn.execute(
                    "INSERT INTO spans(span_id, trace, lane, parent_id, name, start_ns, end_ns, in_progress, instant,"
                    " attrs, error, thread) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (sp[0], trace, lane, *sp[1:5], int(sp[5]), int(sp[6]), *sp[7:]),
                )
        conn.execute(f"PRAGMA user_version={0 if version == 2 else 3}")


def _tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


@pytest.mark.parametrize("version", [2, 3])
def test_old_file_is_upgraded_in_place(tmp_path: Path, version: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(store_mod, "UPGRADE_BATCH_SPANS", 4)  # rows packed while the old table is read
    db = tmp_path / "s.db"
    st = Store(db)
    st.ingest_now(_batch([_span(i, 5000, in_progress=i == 3) for i in range(10)]))
    before = st.load_rows("r").spans  # type: ignore[union-attr]
    st.close()
    _as_old_file(db, version)
    assert "spans" in _tables(db) and "span_batches" not in _tables(db)
    st = Store(db)
    assert "spans" not in _tables(db) and "span_batches" in _tables(db)
    with sqlite3.connect(db) as conn:
        assert [r[0] for r in conn.execute("SELECT spans FROM span_batches ORDER BY seq")] == [4, 4, 2]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == store_mod.SCHEMA_VERSION
    assert st.load_rows("r").spans.equals(before)  # type: ignore[union-attr]
    assert st.count_spans("r") == 10
    # the spans stored before are known: sent again they are stored once, the open one replaced
    st.ingest_now(_batch([_span(i, 9000, in_progress=i == 4) for i in range(12)]))
    assert st.count_spans("r") == 12
    rows = {r[0]: r[1:] for r in st.load_rows("r").spans.select("span_id", "end", "in_progress").rows()}  # type: ignore[union-attr]
    assert rows[f"{3:016x}"] == (9000, False)  # the in-progress copy was replaced by the ended one
    assert rows[f"{4:016x}"] == (5000, False)  # an ended span is never replaced by an open copy
    st.close()


def test_file_without_lanes_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE spans (span_id TEXT, trace_id TEXT, name TEXT)")
    before = db.read_bytes()
    with pytest.raises(store_mod.SchemaError):
        Store(db)
    assert db.read_bytes() == before


def test_forgotten_traces_are_read_back(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(store_mod, "MAX_KEPT_KEYS", 5)
    st = Store(tmp_path / "s.db")
    st.ingest_now(_batch([_span(i, 5000, in_progress=True, trace="01" * 16) for i in range(8)], "a"))
    st.ingest_now(_batch([_span(i, 5000, trace="02" * 16) for i in range(8)], "b"))  # forgets trace 01
    st.ingest_now(_batch([_span(i, 7000, trace="01" * 16) for i in range(8)], "a"))
    assert st.count_spans("a") == 8 and st.count_spans("b") == 8
    ends = set(st.load_rows("a").spans["end"])  # type: ignore[union-attr]
    assert ends == {7000}
    # deleted runs leave no span ids behind in memory
    st.delete_runs(["b"])
    st.ingest_now(_batch([_span(i, 5000, trace="02" * 16) for i in range(3)], "b"))
    assert st.count_spans("b") == 3
    st.close()


V4_FILE = Path(__file__).parent / "data" / "store_v4.db"  # written by the store before span columns (marshal blobs)
T = 1_700_000_000 * 10**9


def test_version_4_file_is_converted_to_span_columns(tmp_path: Path) -> None:
    """A file the previous store wrote (tests/service/data/store_v4.db: an OTLP lane with a span in
    progress ended by a later batch, a journal lane with JSON attributes) opens as version 5, each
    batch rewritten as span columns, and reads as the previous store read it."""
    db = tmp_path / "v4.db"
    shutil.copy(V4_FILE, db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 4
    st = Store(db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == store_mod.SCHEMA_VERSION
        assert conn.execute("SELECT spans, rows FROM span_batches ORDER BY seq").fetchall() == [(6, 6), (0, 1), (2, 2)]
    run = st.load_run("old")
    assert run is not None and not run.problems and not run.root_spans
    assert [(p.instance_id, p.pid, p.created_ns, p.process_span_id) for p in run.processes] == [
        ("proto", 11, T, "0000000000000001"),
        ("j", 12, T + 50, "00000000000000j1"),
    ]
    cols = ["lane", "span_id", "parent_id", "name", "start", "end", "in_progress", "thread", "phase", "module",
            "self_us", "launched_by"]  # fmt: skip
    one = "0000000000000001"
    assert run.spans.select(cols).rows() == [
        ("proto", one, None, "process", T, T + 900, False, None, "process", None, None, "00000000000000aa"),
        *[
            ("proto", f"{i:016x}", one, f"import m{i}", T + 10 * i, T + 10 * i + 5, False, None, "import", f"m{i}",
             1.5 * i, None)
            for i in range(2, 6)
        ],
        ("proto", "0000000000000009", one, "cuda.init", T + 100, T + 400, False, None, "cuda_init", None, None, None),
        ("j", "00000000000000j1", None, "process", T + 50, T + 800, False, 77, "process", None, None, None),
        ("j", "00000000000000j2", "00000000000000j1", "import x", T + 60, None, True, 77, "import", "x", 3.0, None),
    ]  # fmt: skip
    rows = {r["span_id"]: r for r in run.spans.iter_rows(named=True)}
    assert decode_attrs(rows[one]["attrs"], rows[one]["attrs_pb"]) == {
        "starttrace.phase": "process",
        "starttrace.launched_by": "00000000000000aa",
        "otel.scope.name": "lib.z",
    }
    assert rows[one]["attrs"] is None and rows["00000000000000j1"]["attrs_pb"] is None
    assert json.loads(rows["00000000000000j1"]["attrs"]) == {"starttrace.phase": "process"}
    # the converted file's span ids are known to the writer: sent again, nothing new
    st.ingest_now(
        IngestBatch(
            processes=[
                ProcessBatch(
                    source="journal",
                    resource={},
                    spans=[
                        (
                            "ab" * 16,
                            "00000000000000j2",
                            "00000000000000j1",
                            "import x",
                            T + 60,
                            T + 70,
                            0,
                            0,
                            None,
                            None,
                            77,
                        )
                    ],
                    run_id="old",
                    lane_id="j",
                )
            ]
        )
    )
    assert st.count_spans("old") == 8
    again = st.load_run("old")
    assert again is not None
    assert again.spans.filter(pl.col("span_id") == "00000000000000j2").select("end", "in_progress").row(0) == (
        T + 70,
        False,
    )
    st.close()
    Store(db).close()  # opened again: nothing left to convert
