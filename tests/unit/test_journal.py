"""The journal's hand-written JSON encoder, its writer, and the reader's handling of damaged runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from run_spans import spans_of

from starttrace.sources.journal_files import journal_files, journal_lines
from starttrace.sources.journal_reader import EmptyRun, RunNotFound, find_run_dir, list_run_dirs, read_run
from starttrace.tracer.journal import JournalWriter, encode, quote

NASTY = [
    "",
    'say "hi"',
    "back\\slash \\u0041 \\n literal",
    "".join(chr(i) for i in range(32)) + "\x7f",
    "tab\tnew\nline\rcr\x00nul\x1b[31m",
    "ünïcödé ✓ 中文 \u2028\u2029 \ufeff",
    "emoji 😀 and astral 𝄞",
    os.fsdecode(b"/tmp/bad-\xff\xfe-name.py"),  # lone surrogates from surrogateescape
    "\udc80",
    "\ud800 high alone",
    "</script><!--",
]


def _through_file(tmp_path: Path, value: object) -> object:
    """encode -> JournalWriter -> bytes on disk -> json.loads, as every reader does it."""
    for old in tmp_path.glob("values.*.journal"):
        old.unlink()
    writer = JournalWriter(str(tmp_path / "values"))
    try:
        assert writer.write(encode(value) + "\n") is True
    finally:
        writer.close()
    (segment,) = journal_files(tmp_path)
    lines = journal_lines(segment)
    assert len(lines) == 2 and lines[1] == b"", "one record must be exactly one line"
    data = segment.read_bytes()
    assert data[: len(lines[0]) + 1] == lines[0] + b"\n" and not data[len(lines[0]) + 1 :].strip(b"\0")
    lines[0].decode("utf-8")  # valid UTF-8 on disk, whatever the string held
    return json.loads(lines[0])


@pytest.mark.parametrize("text", NASTY)
def test_nasty_strings_round_trip(tmp_path: Path, text: str) -> None:
    assert json.loads(quote(text)) == text
    assert json.loads(encode(text)) == text
    assert _through_file(tmp_path, {"k": text, text: [text]}) == {"k": text, text: [text]}


def test_scalars_and_containers_round_trip(tmp_path: Path) -> None:
    value = {
        "ints": [0, -1, 1 << 62, -(1 << 63), 10**30],
        "floats": [0.0, -0.0, 1.5, 1e16, 1e-300, -2.5e-7, 3.141592653589793],
        "bools": [True, False],
        "none": None,
        "nested": {"a": [{"b": []}, {}], "tuple": (1, "x")},
        "empty": "",
    }
    expected = json.loads(json.dumps(value))  # tuples become lists
    assert json.loads(encode(value)) == expected
    assert _through_file(tmp_path, value) == expected
    # bool is not encoded as int, int not as float
    assert encode(True) == "true" and encode(1) == "1" and encode(None) == "null"


def test_non_finite_floats_stay_valid_json() -> None:
    for value in (float("nan"), float("inf"), float("-inf")):
        decoded = json.loads(encode({"x": value}))  # strict JSON has no NaN/Infinity
        assert isinstance(decoded["x"], str)
        assert decoded["x"] == repr(value)


def test_other_types_become_strings() -> None:
    assert json.loads(encode({"p": Path("/a b"), 3: {1}})) == {"p": "/a b", "3": "{1}"}


_lone_surrogates = st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF)
_text = st.text(st.characters(exclude_categories=("Cs",)) | _lone_surrogates, max_size=40)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _text,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_text, children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_encode_round_trips_any_json_value(value: object) -> None:
    assert json.loads(encode(value)) == value
    line = (encode(value) + "\n").encode("utf-8", "backslashreplace")  # what JournalWriter writes
    assert line.count(b"\n") == 1
    assert json.loads(line) == value


def test_writer_that_cannot_extend_reports_and_never_raises(tmp_path: Path) -> None:
    # The journal's next segment cannot be created (its folder is gone, as with a full disk the
    # allocation fails): the writer says why, once, and stays failed. tests/integration/
    # test_journal_descriptors.py fills a real (tmpfs) disk.
    folder = tmp_path / "gone"
    folder.mkdir()
    writer = JournalWriter(str(folder / "1-0000abcd"), first_size=8192)
    line = encode({"k": "b", "pad": "x" * 500}) + "\n"
    for _ in range(13):  # 13 * ~520 bytes fit in 8192 - RESERVE
        assert writer.write(line) is True
    (segment,) = folder.iterdir()
    segment.unlink()
    folder.rmdir()
    written = sum(writer.write(line) for _ in range(10))
    assert written < 10
    assert writer.failed is not None and "cannot extend journal" in writer.failed
    assert "gone" in writer.failed and "No such file" in writer.failed
    # once failed, it stays failed, quietly
    assert writer.write('{"k":"e"}\n') is False
    assert writer.put is None
    writer.close()  # idempotent
    writer.close()


def test_writer_rotates_segments_and_records_stay_whole(tmp_path: Path) -> None:
    writer = JournalWriter(str(tmp_path / "7-0000beef"), first_size=8192)
    lines = [encode({"n": i, "pad": "y" * (i % 700)}) + "\n" for i in range(400)]
    lines.append(encode({"n": 400, "pad": "z" * 40_000}) + "\n")  # larger than any segment so far
    for line in lines:
        assert writer.write(line)
    writer.close()
    segments = sorted(tmp_path.iterdir(), key=lambda p: int(p.name.split(".")[1]))
    assert len(segments) >= 4 and segments[0].name == "7-0000beef.0.journal"
    assert [p.stat().st_size for p in segments[:3]] == [8192, 16384, 32768]
    (journal,) = journal_files(tmp_path)
    got = journal_lines(journal)
    assert got[-1] == b"" and [json.loads(raw)["n"] for raw in got[:-1]] == list(range(401))


def test_writer_appends_whole_lines(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "j"
    first = JournalWriter(str(path), first_size=16384)
    second = JournalWriter(str(tmp_path / "k"))  # two journals of one process never share a file
    go = threading.Barrier(8)

    def work(w: int) -> None:
        go.wait()
        for i in range(200):
            assert first.write(encode({"w": w, "i": i, "pad": "p" * (i * 7 % 300)}) + "\n")

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert second.write(encode({"n": 2}) + "\n")
    first.close()
    second.close()
    records = [json.loads(raw) for raw in journal_lines(tmp_path / "j.0.journal")[:-1]]
    assert len(records) == 8 * 200
    for w in range(8):
        assert [r["i"] for r in records if r["w"] == w] == list(range(200)), "each thread's records in order"
    assert [json.loads(raw)["n"] for raw in journal_lines(tmp_path / "k.0.journal")[:-1]] == [2]
    for segment in tmp_path.iterdir():
        assert oct(segment.stat().st_mode & 0o777) == oct(0o644 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- reader: damaged journals, empty and missing runs -----------------------------------------


def _process_record(pid: int = 4242) -> dict[str, object]:
    return {
        "k": "process",
        "v": 1,
        "run": "r1",
        "trace": "ab" * 16,
        "iid": "0badcafe",
        "pid": pid,
        "ppid": 1,
        "host": "elsewhere",
        "argv": ["python", "x.py"],
        "exe": "/usr/bin/python3",
        "service": "x",
        "method": "root",
        "created": 1_000,
        "activated": 2_000,
        "anchor_mono": 0,
        "anchor_epoch": 1_700_000_000_000_000_000,
        "span": "1" * 16,
        "parent": "0" * 15 + "1",
        "launch_pid": None,
        "root_span": "0" * 15 + "1",
        "preloaded": [],
        "python": "3.11.7",
    }


def _write_run(root: Path, name: str, lines: list[str], tail: bytes = b"") -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    meta = {"v": 1, "run_id": name, "trace_id": "ab" * 16, "root_span_id": "0" * 15 + "1", "parent_span_id": None}
    (run_dir / "run.json").write_text(json.dumps(meta) + "\n")
    (run_dir / "4242-0badcafe.jsonl").write_bytes("".join(line + "\n" for line in lines).encode() + tail)
    return run_dir


def test_reader_skips_malformed_middle_line_and_cut_last_line(tmp_path: Path) -> None:
    root_span = "0" * 15 + "1"
    lines = [
        encode(_process_record()),
        encode({"k": "b", "s": root_span, "p": None, "n": "startup", "t": 1_000}),
        encode({"k": "b", "s": "1" * 16, "p": root_span, "n": "process", "t": 1_000}),
        encode(
            {
                "k": "b",
                "s": "2" * 16,
                "p": "1" * 16,
                "n": "import json",
                "t": 3_000,
                "a": {"starttrace.phase": "import", "starttrace.import.module": "json"},
            }
        ),
        '{"k":"b","s":"3333333333333333","p":"1111111111111111","n":"import br',  # line 5: torn
        encode({"k": "e", "s": "2" * 16, "t": 9_000}),
        encode({"k": "mystery", "whatever": 1}),  # unknown kinds are ignored
    ]
    run_dir = _write_run(tmp_path, "r1", lines, tail=b'{"k":"e","s":"1111111111111111","t":99')  # line 8
    run = read_run(run_dir)
    journal = "4242-0badcafe.jsonl"
    assert any("malformed" in p and "line 5" in p and journal in p for p in run.problems), run.problems
    assert any("cut last" in p and "line 8" in p and journal in p for p in run.problems), run.problems
    assert len(run.problems) == 2, run.problems
    (process,) = run.processes
    names = {s.name: s for s in spans_of(run, process)}
    assert set(names) == {"process", "import json"}
    assert names["import json"].end_ns is not None
    assert names["import json"].duration_ns == 6_000
    assert names["process"].end_ns is None  # its end record was the cut line: still in progress
    assert run.startup is not None and run.startup.name == "startup"


def test_reader_reports_a_journal_without_process_record(tmp_path: Path) -> None:
    run_dir = _write_run(tmp_path, "r2", [encode(_process_record())])
    (run_dir / "999-deadbeef.jsonl").write_text(encode({"k": "b", "s": "4" * 16, "p": None, "n": "x", "t": 1}) + "\n")
    run = read_run(run_dir)
    assert len(run.processes) == 1
    assert any("999-deadbeef.jsonl" in p for p in run.problems), run.problems


def test_reader_empty_and_missing_runs(tmp_path: Path) -> None:
    with pytest.raises(RunNotFound):
        read_run(tmp_path / "nope")
    empty = tmp_path / "runs" / "empty"
    empty.mkdir(parents=True)
    (empty / "1-00000000.jsonl").write_bytes(b"")
    with pytest.raises(EmptyRun, match="empty"):
        read_run(empty)
    no_journal = tmp_path / "runs" / "bare"
    no_journal.mkdir()
    (no_journal / "run.json").write_text("{}")
    with pytest.raises(EmptyRun, match="no journal"):
        read_run(no_journal)
    garbage = tmp_path / "runs" / "garbage"
    garbage.mkdir()
    (garbage / "2-00000000.jsonl").write_text("this is not json\n")
    with pytest.raises(EmptyRun, match=r"2-00000000\.jsonl"):
        read_run(garbage)


def test_find_run_dir(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    with pytest.raises(RunNotFound, match="no runs"):
        find_run_dir(root, None)
    assert list_run_dirs(root) == []
    assert not root.exists(), "looking must not create anything"
    for name in ("20260101-000000-aaaaaa", "20260102-000000-bbbbbb", "20260102-000000-bbbccc"):
        _write_run(root, name, [encode(_process_record())])
    (root / "not-a-run").mkdir()
    assert [p.name for p in list_run_dirs(root)] == [
        "20260102-000000-bbbccc",
        "20260102-000000-bbbbbb",
        "20260101-000000-aaaaaa",
    ]
    assert find_run_dir(root, None).name == "20260102-000000-bbbccc"
    assert find_run_dir(root, "20260101").name == "20260101-000000-aaaaaa"
    assert find_run_dir(root, "20260102-000000-bbbb").name == "20260102-000000-bbbbbb"
    with pytest.raises(RunNotFound, match="ambiguous"):
        find_run_dir(root, "20260102")
    with pytest.raises(RunNotFound, match="unknown run id"):
        find_run_dir(root, "20990101")


def test_traced_import_from_a_non_utf8_path_round_trips(
    venv_python: str, tmp_path: Path, traced_env: dict[str, str], journal_root: Path
) -> None:
    import subprocess

    folder = os.fsdecode(os.fsencode(str(tmp_path)) + b'/mods-\xff\xfe "q" \\ \x01')
    os.mkdir(folder)
    Path(folder, "weird_mod.py").write_text("X = 1\n")
    env = dict(traced_env, PYTHONPATH=folder)
    proc = subprocess.run([venv_python, "-c", "import weird_mod"], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = journal_root.iterdir()
    run = read_run(run_dir)
    assert run.problems == []
    (span,) = [s for s in spans_of(run, run.processes[0]) if s.name == "import weird_mod"]
    assert span.attrs["code.file.path"] == os.path.join(folder, "weird_mod.py")
    journals = journal_files(run_dir)
    assert journals
    for journal in journals:
        b"\n".join(journal_lines(journal)).decode("utf-8")  # the journal itself is valid UTF-8


def test_writer_keeps_no_descriptor_and_its_mappings_outlive_it(tmp_path: Path) -> None:
    """No descriptor of the journal stays open, and the mappings are never deallocated (before
    Python 3.13 an mmap object closes the descriptor number it remembers when it goes away: by then
    that number may be one of the program's own files)."""
    import gc
    import weakref

    from starttrace.tracer import journal

    def open_fds() -> set[int]:
        return {int(n) for n in os.listdir("/proc/self/fd")}

    before = open_fds()
    maps: list[weakref.ref[object]] = []
    real_map = journal._map

    def spy(fd: int, length: int, offset: int) -> object:
        mapping = real_map(fd, length, offset)
        maps.append(weakref.ref(mapping))
        return mapping

    journal._map = spy  # type: ignore[assignment]
    try:
        writer = JournalWriter(str(tmp_path / "5-0000cafe"), first_size=8192)
        for i in range(100):
            assert writer.write(encode({"i": i, "pad": "m" * 300}) + "\n")
    finally:
        journal._map = real_map  # type: ignore[assignment]
    assert len(maps) >= 3
    assert open_fds() == before, "no descriptor stays open while the journal is written"
    writer.close()
    del writer
    gc.collect()
    assert all(ref() is not None for ref in maps), "mappings stay for the life of the process"
    assert open_fds() == before


def test_traced_imports_with_newlines_and_spaces_in_paths_round_trip(
    venv_python: str, tmp_path: Path, traced_env: dict[str, str], journal_root: Path
) -> None:
    """Compact import records carry the module and path unescaped to the end of the line: a path
    with spaces stays compact, one with a line feed goes as JSON; both read back exactly."""
    import subprocess

    spaced = tmp_path / "mods with  spaces"
    broken = tmp_path / "mods\nwith a line feed"
    both = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/mods\n\xff"))  # a line feed and no UTF-8
    for folder, module in ((spaced, "spaced_mod"), (broken, "broken_mod"), (both, "both_mod")):
        folder.mkdir()
        (folder / f"{module}.py").write_text("X = 1\n")
    env = dict(traced_env, PYTHONPATH=f"{spaced}:{broken}:{both}")
    program = "import spaced_mod, broken_mod, both_mod, email.utils"
    proc = subprocess.run([venv_python, "-c", program], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = journal_root.iterdir()
    run = read_run(run_dir)
    assert run.problems == []
    spans = {s.name: s for s in spans_of(run, run.processes[0])}
    assert spans["import spaced_mod"].attrs["code.file.path"] == str(spaced / "spaced_mod.py")
    assert spans["import broken_mod"].attrs["code.file.path"] == str(broken / "broken_mod.py")
    assert spans["import both_mod"].attrs["code.file.path"] == str(both / "both_mod.py")
    utils = spans["import email.utils"]
    assert utils.attrs["starttrace.import.module"] == "email.utils" and utils.attrs["starttrace.phase"] == "import"
    assert utils.end_ns is not None and utils.end_ns >= utils.start_ns
    assert spans["import email"].span_id == utils.parent_id or any(
        s.span_id == utils.parent_id for s in spans_of(run, run.processes[0])
    )
    lines = [raw for journal in journal_files(run_dir) for raw in journal_lines(journal)]
    assert any(raw.startswith(b"I") and raw.endswith(b" spaced_mod") for raw in lines)  # compact
    assert any(raw.startswith(b"E") and raw.endswith(b"/spaced_mod.py") for raw in lines)
    assert any(b'"code.file.path":' in raw and b"line feed" in raw for raw in lines)  # the JSON form


@pytest.mark.parametrize(
    "raw",
    [
        b"I0123456789abcdef0123456789abcde 12 x",  # parent one digit short
        b"I0123456789abcdefXYZ3456789abcdef12 x",  # not hex
        b"I0123456789abcdef0123456789abcdef12",  # no module
        b"I0123456789abcdef0123456789abcdefxx x",  # time not a number
        b"E0123456789abcde",  # no dt
        b"E0123456789abcdefnope /p",
        b"[1, 2]",
    ],
)
def test_malformed_compact_records_are_rejected(raw: bytes) -> None:
    from starttrace.sources.journal_files import parse_record

    with pytest.raises(ValueError):
        parse_record(raw)


def test_compact_records_parse_to_their_json_form() -> None:
    from starttrace.sources.journal_files import parse_record

    begin = parse_record(b"I0123456789abcdeffedcba987654321012345 pkg.mod \xc3\xa9")
    assert begin == {
        "k": "b",
        "s": "0123456789abcdef",
        "p": "fedcba9876543210",
        "n": "import pkg.mod é",
        "t": 12345,
        "a": {"starttrace.phase": "import", "starttrace.import.module": "pkg.mod é"},
    }
    assert parse_record(b"E0123456789abcdef77") == {"k": "e", "s": "0123456789abcdef", "dt": 77}
    assert parse_record(b"E0123456789abcdef7 /a b/c.py")["a"] == {"code.file.path": "/a b/c.py"}
