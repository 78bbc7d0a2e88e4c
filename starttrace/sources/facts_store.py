"""Per-run facts beside the embedded store: the rows `starttrace_runs` holds in ClickHouse, in a
`run_facts` table of the store's SQLite file, with a connection of its own (WAL). Writing a run
again replaces its row; of the store's tables it only reads `runs`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS run_facts (
    run_id TEXT PRIMARY KEY,
    service TEXT,
    start_ns INTEGER,
    version INTEGER NOT NULL,  -- runs.version the facts were derived from
    facts_version INTEGER NOT NULL,
    derived_at REAL NOT NULL,
    facts TEXT NOT NULL  -- analysis.fleet.run_facts as JSON
);
CREATE INDEX IF NOT EXISTS run_facts_start ON run_facts(start_ns);
"""


class FactsStore:
    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._conn().executescript(SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            self._local.conn = conn
        return conn

    def write(self, facts: list[dict[str, Any]]) -> None:
        if not facts:
            return
        now = time.time()
        rows = [
            (
                f["run_id"],
                f["service"],
                int(f["start_ns"]),
                int(f["version"]),
                int(f["facts_version"]),
                now,
                json.dumps(f, separators=(",", ":"), sort_keys=True),
            )
            for f in facts
        ]
        with self._write_lock:
            conn = self._conn()
            with conn:
                conn.executemany("INSERT OR REPLACE INTO run_facts VALUES (?, ?, ?, ?, ?, ?, ?)", rows)

    def missing(
        self, limit: int = 1000, idle_s: float = 5.0, facts_version: int = 0, now: float | None = None
    ) -> list[str]:
        """Runs of the store whose facts are missing or stale (the run changed since, or derived by
        a facts definition older than `facts_version`), newest first, with no ingest for `idle_s`."""
        quiet = (time.time() if now is None else now) - idle_s
        rows = self._conn().execute(
            "SELECT r.run_id FROM runs r LEFT JOIN run_facts f ON f.run_id = r.run_id"
            " WHERE (f.run_id IS NULL OR f.version != r.version OR f.facts_version < ?) AND r.updated_at <= ?"
            " ORDER BY COALESCE(r.first_ns, 0) DESC LIMIT ?",
            (facts_version, quiet, limit),
        )
        return [str(r[0]) for r in rows]

    def get(self, run_id: str) -> dict[str, Any] | None:
        row = self._conn().execute("SELECT facts FROM run_facts WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else json.loads(row[0])

    def rows(
        self,
        since_ns: int | None = None,
        until_ns: int | None = None,
        service: str | None = None,
        facts_version: int = 0,
    ) -> list[dict[str, Any]]:
        """The facts of the runs in range derived by definition `facts_version` or newer."""
        filters = (("start_ns >= ?", since_ns), ("start_ns <= ?", until_ns), ("service = ?", service))
        kept = [(c, v) for c, v in filters if v is not None]
        sql = " AND ".join(["SELECT facts FROM run_facts WHERE facts_version >= ?", *(c for c, _ in kept)])
        return [json.loads(r[0]) for r in self._conn().execute(sql, [facts_version, *(v for _, v in kept)])]

    def pending(
        self,
        since_ns: int | None = None,
        until_ns: int | None = None,
        service: str | None = None,
        facts_version: int = 0,
    ) -> int:
        """How many runs of the store in range have no facts of `facts_version` yet (being derived)."""
        filters = (
            ("COALESCE(r.first_ns, 0) >= ?", since_ns),
            ("COALESCE(r.first_ns, 0) <= ?", until_ns),
            ("r.service = ?", service),
        )
        kept = [(c, v) for c, v in filters if v is not None]
        conn = self._conn()
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'").fetchone() is None:
            return 0  # facts without a store beside them (tests): no run to wait for
        sql = " AND ".join(
            [
                "SELECT count(*) FROM runs r LEFT JOIN run_facts f ON f.run_id = r.run_id"
                " WHERE (f.run_id IS NULL OR f.facts_version < ?)",
                *(c for c, _ in kept),
            ]
        )
        return int(conn.execute(sql, [facts_version, *(v for _, v in kept)]).fetchone()[0])

    def forget(self, run_ids: list[str]) -> None:
        with self._write_lock:
            conn = self._conn()
            with conn:
                conn.executemany("DELETE FROM run_facts WHERE run_id = ?", [(r,) for r in run_ids])
