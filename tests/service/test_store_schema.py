"""The store's schema version: a version-2 or -3 file (one row per span) is upgraded in place, the
span ids the writer keeps in memory are read back after a restart and after being forgotten."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

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
        for lane, trace, body in batches:
            for sp in store_mod.unpack_spans(body):
                conn.execute(
                    "INSERT INTO spans(span_id, trace, lane, parent_id, name, start_ns, end_ns, in_progress, instant,"
                    " attrs, error, thread) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (sp[1], trace, lane, *sp[2:]),
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
    assert st.load_rows("r").spans == before  # type: ignore[union-attr]
    assert st.count_spans("r") == 10
    # the spans stored before are known: sent again they are stored once, the open one replaced
    st.ingest_now(_batch([_span(i, 9000, in_progress=i == 4) for i in range(12)]))
    assert st.count_spans("r") == 12
    rows = {r[1]: r for r in st.load_rows("r").spans}  # type: ignore[union-attr]
    assert rows[f"{3:016x}"][6:8] == (9000, 0)  # the in-progress copy was replaced by the ended one
    assert rows[f"{4:016x}"][6:8] == (5000, 0)  # an ended span is never replaced by an open copy
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
    ends = {r[6] for r in st.load_rows("a").spans}  # type: ignore[union-attr]
    assert ends == {7000}
    # deleted runs leave no span ids behind in memory
    st.delete_runs(["b"])
    st.ingest_now(_batch([_span(i, 5000, trace="02" * 16) for i in range(3)], "b"))
    assert st.count_spans("b") == 3
    st.close()
