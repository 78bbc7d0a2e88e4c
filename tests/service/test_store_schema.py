"""The store's schema version: a version-2 file (unique span index) is upgraded in place, the
span ids the writer keeps in memory are read back after a restart and after being forgotten."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from starttrace.sources import store as store_mod
from starttrace.sources.store import IngestBatch, ProcessBatch, SpanTuple, Store


def _span(i: int, end: int, in_progress: bool = False, trace: str = "ab" * 16) -> SpanTuple:
    attrs = json.dumps({"n": i, "end": end})
    return (trace, f"{i:016x}", None, f"s{i}", 1000 + i, end, int(in_progress), 0, attrs, None, None)


def _batch(spans: list[SpanTuple], run_id: str = "r") -> IngestBatch:
    res = {"starttrace.run_id": run_id, "service.instance.id": "lane"}
    return IngestBatch(processes=[ProcessBatch(source="otlp", resource=res, spans=spans)])


def _indexes(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'spans'")
        return {r[0] for r in rows}


def test_version_2_file_is_upgraded_in_place(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    st = Store(db)
    st.ingest_now(_batch([_span(i, 5000, in_progress=i == 3) for i in range(10)]))
    st.close()
    with sqlite3.connect(db) as conn:  # what a version-2 store left behind
        conn.execute("DROP INDEX spans_trace")
        conn.execute("CREATE UNIQUE INDEX spans_key ON spans(span_id, trace)")
        conn.execute("PRAGMA user_version=0")
    st = Store(db)
    assert _indexes(db) == {"spans_trace", "spans_lane"}
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == store_mod.SCHEMA_VERSION
    # the spans stored before are known: sent again they are stored once, the open one replaced
    st.ingest_now(_batch([_span(i, 9000, in_progress=i == 4) for i in range(12)]))
    assert st.count_spans("r") == 12
    rows = {r[1]: r for r in st.load_rows("r").spans}  # type: ignore[union-attr]
    assert rows[f"{3:016x}"][6:8] == (9000, 0)  # the in-progress copy was replaced by the ended one
    assert rows[f"{4:016x}"][6:8] == (5000, 0)  # an ended span is never replaced by an open copy
    st.close()


def test_forgotten_traces_are_read_back(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(store_mod, "MAX_KEPT_KEYS", 5)
    st = Store(tmp_path / "s.db")
    st.ingest_now(_batch([_span(i, 5000, in_progress=True, trace="01" * 16) for i in range(8)], "a"))
    st.ingest_now(_batch([_span(i, 5000, trace="02" * 16) for i in range(8)], "b"))  # forgets trace 01
    st.ingest_now(_batch([_span(i, 7000, trace="01" * 16) for i in range(8)], "a"))
    assert st.count_spans("a") == 8 and st.count_spans("b") == 8
    ends = {r[6] for r in st.load_rows("a").spans}  # type: ignore[union-attr]
    assert ends == {7000}
    # deleted runs leave no span ids behind in memory
    st.delete_runs(["b"])
    st.ingest_now(_batch([_span(i, 5000, trace="02" * 16) for i in range(3)], "b"))
    assert st.count_spans("b") == 3
    st.close()
