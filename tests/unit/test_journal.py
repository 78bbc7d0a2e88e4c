"""The journal's hand-written JSON encoder, its writer, and the reader's handling of damaged runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from starttrace.journal import JournalWriter, encode, quote
from starttrace.sources.journal_reader import EmptyRun, RunNotFound, find_run_dir, list_run_dirs, read_run

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
    path = tmp_path / "values.jsonl"
    path.unlink(missing_ok=True)
    writer = JournalWriter(str(path))
    try:
        assert writer.write(encode(value) + "\n") is True
    finally:
        writer.close()
    data = path.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 1, "one record must be exactly one line"
    data.decode("utf-8")  # valid UTF-8 on disk, whatever the string held
    return json.loads(data)


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


def test_writer_on_a_full_disk_reports_and_never_raises() -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("/dev/full is a Linux device")
    writer = JournalWriter("/dev/full")
    assert writer.write('{"k":"b"}\n') is False
    assert writer.failed is not None and "No space left" in writer.failed
    assert "/dev/full" in writer.failed
    # once failed, it stays failed, quietly
    assert writer.write('{"k":"e"}\n') is False
    assert writer.fd == -1
    writer.close()  # idempotent


def test_writer_appends_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    first = JournalWriter(str(path))
    second = JournalWriter(str(path))  # two descriptors on one file, as after a fork
    assert first.write(encode({"n": 1}) + "\n")
    assert second.write(encode({"n": 2}) + "\n")
    assert first.write(encode({"n": 3}) + "\n")
    first.close()
    second.close()
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == [1, 2, 3]
    assert oct(path.stat().st_mode & 0o777) == oct(0o644 & ~_umask())


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
    names = {s.name: s for s in process.spans}
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
    (span,) = [s for s in run.processes[0].spans if s.name == "import weird_mod"]
    assert span.attrs["code.file.path"] == os.path.join(folder, "weird_mod.py")
    for journal in run_dir.glob("*.jsonl"):
        journal.read_bytes().decode("utf-8")  # the journal itself is valid UTF-8
