"""The service reading journal directories: real traced process trees, live updates, bad files."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from st_service_helpers import Server, wait_for

MONO0 = 10_000_000_000
EPOCH0 = 1_750_000_000_000_000_000


def _line(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def write_run(root: Path, run_id: str = "20250101-000000-abcdef") -> tuple[Path, Path]:
    """A hand-written two-process run (docs/journal.md format); the worker is still importing."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    trace = "ab" * 16
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "v": 1,
                "run_id": run_id,
                "trace_id": trace,
                "root_span_id": "a000000000000001",
                "parent_span_id": None,
                "argv": ["x"],
                "cwd": "/",
                "host": "h",
                "created_epoch_ns": EPOCH0,
                "service": "journal-svc",
            }
        )
    )
    main = run_dir / "100-0000aaaa.jsonl"
    base = {
        "k": "process",
        "v": 1,
        "run": run_id,
        "trace": trace,
        "host": "other-host",
        "argv": ["python"],
        "exe": "python",
        "service": "journal-svc",
        "anchor_mono": MONO0,
        "anchor_epoch": EPOCH0,
        "root_span": "a000000000000001",
        "preloaded": [],
        "python": "3.11",
    }
    _line(
        main,
        {
            **base,
            "iid": "0000aaaa",
            "pid": 100,
            "ppid": 1,
            "method": "root",
            "created": MONO0,
            "activated": MONO0 + 10**7,
            "span": "a000000000000002",
            "parent": "a000000000000001",
        },
    )
    _line(
        main,
        {
            "k": "b",
            "s": "a000000000000001",
            "p": None,
            "n": "startup",
            "t": MONO0,
            "a": {"starttrace.phase": "startup"},
        },
    )
    _line(
        main,
        {
            "k": "b",
            "s": "a000000000000002",
            "p": "a000000000000001",
            "n": "process",
            "t": MONO0,
            "a": {"starttrace.phase": "process"},
        },
    )
    _line(
        main,
        {
            "k": "b",
            "s": "a000000000000003",
            "p": "a000000000000002",
            "n": "import json",
            "t": MONO0 + 10**7,
            "a": {"starttrace.phase": "import", "starttrace.import.module": "json"},
        },
    )
    _line(main, {"k": "e", "s": "a000000000000003", "t": MONO0 + 3 * 10**7})
    _line(
        main,
        {
            "k": "b",
            "s": "a000000000000004",
            "p": "a000000000000002",
            "n": "process.launch",
            "t": MONO0 + 4 * 10**7,
            "a": {"starttrace.phase": "launch", "starttrace.start_method": "spawn"},
        },
    )
    _line(main, {"k": "e", "s": "a000000000000004", "t": MONO0 + 5 * 10**7, "a": {"starttrace.child_pid": 101}})
    _line(main, {"k": "attrs", "t": MONO0, "a": {"starttrace.role": "api_server"}})
    worker = run_dir / "101-0000bbbb.jsonl"
    _line(
        worker,
        {
            **base,
            "iid": "0000bbbb",
            "pid": 101,
            "ppid": 100,
            "method": "spawn",
            "created": MONO0 + 4 * 10**7,
            "activated": MONO0 + 5 * 10**7,
            "span": "b000000000000001",
            "parent": "a000000000000004",
        },
    )
    _line(
        worker,
        {
            "k": "b",
            "s": "b000000000000001",
            "p": "a000000000000004",
            "n": "process",
            "t": MONO0 + 4 * 10**7,
            "a": {"starttrace.phase": "process"},
        },
    )
    _line(worker, {"k": "attrs", "t": MONO0, "a": {"starttrace.role": "worker", "starttrace.rank": 0}})
    _line(
        worker,
        {
            "k": "b",
            "s": "b000000000000002",
            "p": "b000000000000001",
            "n": "import torch",
            "t": MONO0 + 6 * 10**7,
            "a": {"starttrace.phase": "import", "starttrace.import.module": "torch"},
        },
    )
    return run_dir, worker


def test_journal_dir_live_updates(server_factory: Callable[..., Server], tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run_dir, worker = write_run(root)
    srv = server_factory("--journal-dir", str(root))
    url = srv.url + "/startup/" + run_dir.name
    doc = wait_for(lambda: (r := httpx.get(url)).status_code == 200 and r.json())
    assert doc["status"] == "running" and doc["live"]
    assert [(ln["role"], ln["rank"], ln["pid"]) for ln in doc["lanes"]] == [
        ("api_server", None, 100),
        ("worker", 0, 101),
    ]
    assert doc["in_progress"][0]["name"] == "import torch"
    first_open = doc["in_progress"][0]["open_s"]
    time.sleep(1.2)
    doc = httpx.get(url).json()
    assert doc["in_progress"][0]["open_s"] > first_open  # still open, and growing
    # new lines appear: the import ends, the server becomes ready
    _line(worker, {"k": "e", "s": "b000000000000002", "t": MONO0 + 9 * 10**7})
    _line(
        run_dir / "100-0000aaaa.jsonl",
        {
            "k": "i",
            "s": "a000000000000009",
            "p": "a000000000000002",
            "n": "ready",
            "t": MONO0 + 10 * 10**7,
            "a": {"starttrace.phase": "ready"},
        },
    )

    def ended() -> Any:
        d = httpx.get(url).json()
        return d if d["status"] == "ready" else None

    doc = wait_for(ended, timeout=10)
    w = doc["lanes"][1]
    row = next(r for r in w["spans"] if r[2] == "import torch")
    assert row[5] - row[4] == 30_000 and not (row[7] & 1)
    assert doc["ready_s"] == 0.1
    assert 'starttrace_ingested_spans_total{source="journal"}' in httpx.get(srv.url + "/metrics").text


def test_malformed_journal_file_skipped_with_warning(server_factory: Callable[..., Server], tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run_dir, worker = write_run(root, "20250101-000000-bad000")
    (run_dir / "999-deadbeef.jsonl").write_text('this is not json\n{"k": "b"}\n')
    with open(worker, "a") as fh:
        fh.write('{"k": "b", "s": "b0000000000000ff", "p": "b000000000000001", "n": "cut\n')
        fh.write(
            '{"k": "i", "s": "b0000000000000fe", "p": "b000000000000001", "n": "late", "t": %d}\n' % (MONO0 + 10**8)
        )
    srv = server_factory("--journal-dir", str(root))
    url = srv.url + "/startup/" + run_dir.name
    doc = wait_for(lambda: (r := httpx.get(url)).status_code == 200 and r.json())
    problems = " | ".join(doc["problems"])
    assert "999-deadbeef.jsonl" in problems
    assert "101-0000bbbb.jsonl" in problems
    assert [ln["pid"] for ln in doc["lanes"]] == [100, 101]  # the rest of the run shows
    html = httpx.get(url, headers={"Accept": "text/html"}).text
    assert "999-deadbeef.jsonl" in html


def test_real_traced_tree(
    run_tree: Callable[..., Any], journal_root: Path, server_factory: Callable[..., Server]
) -> None:
    """examples/tree.py traced for real; the service shows the same processes the reader sees."""
    run = run_tree("--no-torch")
    srv = server_factory("--journal-dir", str(journal_root))
    url = f"{srv.url}/startup/{run.run_id}"
    doc = wait_for(lambda: (r := httpx.get(url)).status_code == 200 and r.json())
    assert {ln["pid"] for ln in doc["lanes"]} == {p.pid for p in run.processes}
    total = run.span_count()
    assert sum(ln["span_count"] for ln in doc["lanes"]) == total
    roles = {ln["role"] for ln in doc["lanes"]}
    assert "forkserver" in roles or any(ln["start_method"] == "forkserver" for ln in doc["lanes"])
    assert doc["import_hotspots"] and doc["import_hotspots"][0]["cumulative_s"] > 0
    assert doc["critical_path"]
    assert httpx.get(srv.url + "/runs").json()["runs"][0]["run_id"] == run.run_id


def _packed_as_tuples(run: Any) -> dict[str, Any]:
    """How the watcher packed a run before it packed its table: a SpanTuple per row, by lane, then
    `pack_by_trace` (the reference the table path must match)."""
    import polars as pl

    from starttrace.run import spans_table
    from starttrace.sources.batches import pack_by_trace

    table = run.spans
    roots = [p for p in run.processes if p.resource.get("starttrace.start_method") == "root"]
    root_proc = (roots or run.processes)[0]
    table = pl.concat([table, spans_table((root_proc.instance_id, s) for s in run.root_spans)])
    rows = table.select(
        pl.lit(run.trace_id or run.run_id).alias("trace_id"),
        "span_id", "parent_id", "name", "start", "end",
        pl.col("end").is_null().cast(pl.Int64).alias("in_progress"),
        pl.col("instant").fill_null(False).cast(pl.Int64),
        "attrs", "error", "thread", "phase", "module", "self_us", "launched_by", "lane",
    )  # fmt: skip
    by_lane: dict[str, list[Any]] = {}
    for row in rows.iter_rows():
        by_lane.setdefault(row[-1], []).append(row[:-1])
    return {lane: pack_by_trace(spans) for lane, spans in by_lane.items()}


def test_watcher_packs_the_run_table_as_the_span_tuples_did(run_tree: Callable[..., Any], tmp_path: Path) -> None:
    """A real traced tree's run, packed by the watcher straight from its span table: per lane the
    same stored columns, ids, open ids and time range as packing a SpanTuple per row gave."""
    from starttrace.sources.batches import unpack_spans
    from starttrace.sources.journal_watcher import JournalWatcher
    from starttrace.sources.store import Store

    run = run_tree("--no-torch")
    store = Store(tmp_path / "st.db")
    try:
        batch = JournalWatcher(tmp_path, store)._batch(run)
    finally:
        store.close()
    expected = _packed_as_tuples(run)
    got = {p.lane_id: p.packed for p in batch.processes if p.packed}
    assert got.keys() == expected.keys() and len(got) == len(run.processes) >= 4
    for lane, packed in got.items():
        assert [p.spans for p in batch.processes if p.lane_id == lane] == [[]]
        (new,), (old,) = packed, expected[lane]
        assert (new.trace_id, new.span_ids, new.open_ids, new.first_ns, new.last_ns) == (
            old.trace_id, old.span_ids, old.open_ids, old.first_ns, old.last_ns,
        )  # fmt: skip
        assert unpack_spans(new.body).equals(unpack_spans(old.body)), lane
    assert sum(len(p.span_ids) for ps in got.values() for p in ps) == run.span_count()
