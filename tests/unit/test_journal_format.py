"""Journal format version 2 (docs/journal.md) as readers see it: segments with zero-byte tails (live
journals), a cut or torn last record (killed processes), journals of both versions in one run, and
the cheap change detection the service's watcher and the OTLP follower rely on."""

from __future__ import annotations

import json
from pathlib import Path

from run_spans import spans_of

from starttrace.follower import ReadyWatch
from starttrace.sources.journal_files import (
    all_journal_files,
    journal_files,
    journal_lines,
    journal_signature,
    segments,
    used_bytes,
)
from starttrace.sources.journal_reader import read_run
from starttrace.tracer.journal import JournalWriter, encode

ROOT_SPAN = "0" * 15 + "1"


def _process_record(pid: int, iid: str, version: int = 2) -> dict[str, object]:
    return {
        "k": "process", "v": version, "run": "r", "trace": "ab" * 16, "iid": iid, "pid": pid, "ppid": 1,
        "host": "elsewhere", "argv": ["python"], "exe": "/usr/bin/python3", "service": "x",
        "method": "root" if pid == 1000 else "spawn", "created": 1_000, "activated": 2_000, "anchor_mono": 0,
        "anchor_epoch": 1_700_000_000_000_000_000, "span": f"{pid:016x}", "parent": ROOT_SPAN, "launch_pid": None,
        "root_span": ROOT_SPAN, "preloaded": [], "footprint": {}, "python": "3.11.7",
    }  # fmt: skip


def _records(pid: int, iid: str, imports: int, version: int = 2) -> list[bytes]:
    out = [_process_record(pid, iid, version)]
    if pid == 1000:
        out.append({"k": "b", "s": ROOT_SPAN, "p": None, "n": "startup", "t": 1_000})
    out.append({"k": "b", "s": f"{pid:016x}", "p": ROOT_SPAN, "n": "process", "t": 1_000})
    for i in range(imports):
        span = f"{pid:08x}{i + 1:08x}"
        attrs = {"starttrace.phase": "import", "starttrace.import.module": f"m{i}"}
        out.append({"k": "b", "s": span, "p": f"{pid:016x}", "n": f"import m{i}", "t": 3_000 + i * 10, "a": attrs})
        out.append({"k": "e", "s": span, "t": 3_005 + i * 10})
    return [(encode(r) + "\n").encode() for r in out]


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    meta = {"v": 2, "run_id": "r", "trace_id": "ab" * 16, "root_span_id": ROOT_SPAN}
    (run_dir / "run.json").write_text(json.dumps(meta))
    return run_dir


def _write_segments(run_dir: Path, name: str, records: list[bytes], sizes: list[int], tail: bytes = b"") -> None:
    """Lay records into segments of the given sizes the way the writer does (whole records, zero tails)."""
    chunks: list[bytearray] = [bytearray()]
    for record in records:
        if len(chunks[-1]) + len(record) > sizes[len(chunks) - 1]:
            chunks.append(bytearray())
        chunks[-1] += record
    chunks[-1] += tail
    for number, chunk in enumerate(chunks):
        (run_dir / f"{name}.{number}.journal").write_bytes(bytes(chunk) + bytes(sizes[number] - len(chunk)))


def test_live_journal_with_a_zero_tail(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    records = _records(1000, "0000aaaa", 30)
    _write_segments(run_dir, "1000-0000aaaa", records, [1 << 16])
    run = read_run(run_dir)
    assert run.problems == []
    (process,) = run.processes
    assert process.journal_path.name == "1000-0000aaaa.0.journal"
    assert len([s for s in spans_of(run, process) if s.name.startswith("import ")]) == 30
    assert all(s.end_ns is not None for s in spans_of(run, process) if s.name.startswith("import "))
    own = run.process_span(process)
    assert own is not None and own.end_ns is None  # still running: in progress


def test_segments_are_joined_in_order(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    records = _records(1000, "0000aaaa", 200)
    _write_segments(run_dir, "1000-0000aaaa", records, [4096, 8192, 16384, 32768])
    assert len(list(run_dir.glob("*.journal"))) == 4
    (journal,) = journal_files(run_dir)
    assert [p.name for p in segments(journal)] == [f"1000-0000aaaa.{n}.journal" for n in range(4)]
    assert journal_lines(journal) == [r[:-1] for r in records] + [b""]
    run = read_run(run_dir)
    assert run.problems == []
    names = [
        s.name for s in sorted(spans_of(run, run.processes[0]), key=lambda s: s.start_ns) if s.name.startswith("import")
    ]
    assert names == [f"import m{i}" for i in range(200)]


def test_killed_in_the_middle_of_a_record(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    records = _records(1000, "0000aaaa", 20)
    cut = b'{"k":"b","s":"00000000000003e8","p":"00000000000003e8","n":"import tor'
    _write_segments(run_dir, "1000-0000aaaa", records, [2048, 8192], tail=cut)
    run = read_run(run_dir)
    assert len(run.problems) == 1 and "cut last line" in run.problems[0], run.problems
    assert "1000-0000aaaa.0.journal" in run.problems[0]
    assert len([s for s in spans_of(run, run.processes[0]) if s.name.startswith("import ")]) == 20


def test_a_torn_last_record_with_zeros_inside(tmp_path: Path) -> None:
    # a copy cut by SIGKILL need not be a prefix: its later bytes may be there and earlier ones not
    run_dir = _run_dir(tmp_path)
    records = _records(1000, "0000aaaa", 5)
    torn = bytearray(records[-1])
    torn[5:30] = bytes(25)
    _write_segments(run_dir, "1000-0000aaaa", [*records[:-1], bytes(torn)], [1 << 14])
    run = read_run(run_dir)
    assert len(run.problems) == 1 and "cut last line" in run.problems[0], run.problems
    imports = [s for s in spans_of(run, run.processes[0]) if s.name.startswith("import ")]
    assert len(imports) == 5 and imports[-1].end_ns is None  # its end record was the torn one


def test_versions_1_and_2_in_one_run(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    _write_segments(run_dir, "1000-0000aaaa", _records(1000, "0000aaaa", 3), [8192])
    (run_dir / "1001-0000bbbb.jsonl").write_bytes(b"".join(_records(1001, "0000bbbb", 4, version=1)))
    assert [p.name for p in journal_files(run_dir)] == ["1000-0000aaaa.0.journal", "1001-0000bbbb.jsonl"]
    assert [p.name for p in all_journal_files(run_dir)] == ["1000-0000aaaa.0.journal", "1001-0000bbbb.jsonl"]
    run = read_run(run_dir)
    assert run.problems == []
    assert sorted(p.pid for p in run.processes) == [1000, 1001]
    counts = {p.pid: len([s for s in spans_of(run, p) if s.name.startswith("import ")]) for p in run.processes}
    assert counts == {1000: 3, 1001: 4}


def test_used_bytes_and_signature_see_records_added_in_place(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    writer = JournalWriter(str(run_dir / "1000-0000aaaa"))
    for record in _records(1000, "0000aaaa", 5):
        assert writer.write(record.decode())
    segment = run_dir / "1000-0000aaaa.0.journal"
    size = segment.stat().st_size
    known: dict[str, int] = {}
    first = journal_signature(run_dir, known)
    used = used_bytes(segment)
    assert used == known[segment.name] and 0 < used < size
    assert segment.read_bytes()[used - 1 : used + 1] == b"\n\0"
    assert journal_signature(run_dir, known) == first, "nothing new: the same signature"
    writer.write(encode({"k": "i", "s": "f" * 16, "p": "0" * 15 + "1", "n": "ready", "t": 9_999}) + "\n")
    assert segment.stat().st_size == size  # a segment's size never changes ...
    second = journal_signature(run_dir, known)
    assert second != first  # ... its signature does
    assert used_bytes(segment, used) == used_bytes(segment) > used
    assert used_bytes(segment, 7) == used_bytes(segment)  # a wrong hint costs a full read, not a wrong answer
    writer.close()
    assert read_run(run_dir).problems == []


def test_ready_watch_reads_only_new_bytes_of_live_segments(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    writer = JournalWriter(str(run_dir / "1000-0000aaaa"), first_size=8192)
    for record in _records(1000, "0000aaaa", 5):
        writer.write(record.decode())
    watch = ReadyWatch(run_dir)
    assert watch.ready() is False
    offset = watch.offsets[run_dir / "1000-0000aaaa.0.journal"]
    assert offset == used_bytes(run_dir / "1000-0000aaaa.0.journal")
    for i in range(40):  # into the next segment
        writer.write(encode({"k": "attrs", "t": i, "a": {"pad": "z" * 300}}) + "\n")
    assert watch.ready() is False
    writer.write(encode({"k": "i", "s": "f" * 16, "p": ROOT_SPAN, "n": "ready", "t": 9_999}) + "\n")
    assert len(all_journal_files(run_dir)) == 2
    assert watch.ready() is True
    # a v1 journal as well
    (run_dir / "1001-0000bbbb.jsonl").write_bytes(b"".join(_records(1001, "0000bbbb", 1, version=1)))
    other = ReadyWatch(run_dir)
    assert other.ready() is True


def test_the_service_watcher_sees_records_added_to_a_live_segment(tmp_path: Path) -> None:
    from starttrace.sources.journal_watcher import _signature

    run_dir = _run_dir(tmp_path)
    writer = JournalWriter(str(run_dir / "1000-0000aaaa"))
    for record in _records(1000, "0000aaaa", 2):
        writer.write(record.decode())
    before = _signature(run_dir)
    assert _signature(run_dir) == before
    writer.write(encode({"k": "i", "s": "f" * 16, "p": ROOT_SPAN, "n": "ready", "t": 9_999}) + "\n")
    assert _signature(run_dir) != before
    writer.close()
