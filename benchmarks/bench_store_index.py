"""What a unique index over random span ids costs SQLite, at 96k and 384k spans.

    .venv/bin/python benchmarks/bench_store_index.py [--lanes 16 64]

Inserts synthetic span rows shaped like the store's (12 columns, a 225-byte attribute blob, ids as
16 hex digits) into a fresh WAL database in transactions of 4096 rows (1024-row statements), with
(a) the store's schema-2 indexes: unique (span_id, trace) + lane, (b) the same with integer span
ids, (c) lane and trace indexes only (schema 3, duplicates found by the writer in memory). Prints
process CPU, wall seconds and the WAL's size (what the transactions wrote).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sqlite3
import tempfile
import time

COLUMNS = "span_id, parent_id, name, start_ns, end_ns, in_progress, instant, attrs, error, thread, trace, lane"
UNIQUE = ["CREATE UNIQUE INDEX k ON spans(span_id, trace)", "CREATE INDEX l ON spans(lane)"]
VARIANTS = {
    "unique (span_id, trace) + lane": UNIQUE,
    "the same, integer span ids": UNIQUE,
    "lane + trace (schema 3)": ["CREATE INDEX l ON spans(lane)", "CREATE INDEX t ON spans(trace)"],
}


def rows(lanes: int, integer_ids: bool, rng: random.Random) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for lane in range(lanes):
        for i in range(6000):
            sid = rng.getrandbits(63) if integer_ids else f"{rng.getrandbits(64):016x}"
            t = 1_700_000_000_000_000_000 + i
            parent = f"{rng.getrandbits(64):016x}"
            out.append((sid, parent, "import m", t, t + 5, 0, 0, os.urandom(225), None, None, 1, lane))
    return out


def insert(data: list[tuple[object, ...]], indexes: list[str], sort: bool) -> tuple[float, float, float]:
    folder = tempfile.mkdtemp(prefix="st-index-")
    path = os.path.join(folder, "x.db")
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "wal_autocheckpoint=0", "cache_size=-131072"):
        conn.execute(f"PRAGMA {pragma}")
    conn.execute(f"CREATE TABLE spans (seq INTEGER PRIMARY KEY, {COLUMNS})")
    for sql in indexes:
        conn.execute(sql)
    head = f"INSERT INTO spans({COLUMNS}) VALUES "
    cpu, wall = time.process_time(), time.perf_counter()
    for b in range(0, len(data), 4096):
        batch = sorted(data[b : b + 4096], key=lambda r: r[0]) if sort else data[b : b + 4096]  # type: ignore[arg-type, return-value]
        conn.execute("BEGIN")
        for i in range(0, len(batch), 1024):
            chunk = batch[i : i + 1024]
            conn.execute(head + ",".join(["(" + ",".join("?" * 12) + ")"] * len(chunk)), list(itertools.chain(*chunk)))
        conn.execute("COMMIT")
    result = time.process_time() - cpu, time.perf_counter() - wall, os.path.getsize(path + "-wal") / 1e6
    conn.close()
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, nargs="+", default=[16, 64])
    args = ap.parse_args()
    print("| spans | indexes | CPU s | wall s | WAL MB |\n|---|---|---|---|---|")
    for lanes in args.lanes:
        for name, indexes in VARIANTS.items():
            data = rows(lanes, "integer" in name, random.Random(1))
            cpu, wall, wal = insert(data, indexes, sort="unique" in name)  # schema 2 sorted each transaction by id
            print(f"| {len(data):,} | {name} | {cpu:.2f} | {wall:.2f} | {wal:.0f} |")


if __name__ == "__main__":
    main()
