"""The journal files of a run and the record lines in them, both versions (docs/journal.md).

Version 1: one `<pid>-<instance>.jsonl` file per process. Version 2: segments
`<pid>-<instance>.<n>.journal`, each whole records followed by zero bytes up to its allocated size; a
process killed mid-record leaves that record cut, as the very last one of its journal. Readers here
never write or lock anything; they read live journals as they are.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

V1_SUFFIX = ".jsonl"
_SEGMENT = re.compile(r"(?P<journal>.+)\.(?P<n>\d+)\.journal")
_CHUNK = 1 << 16

# Bounds on what a reader takes from a run folder (docs/journal.md, "Reading bounds"): a writer's
# segment is at most 8 MiB (a record larger than that gets a segment of its own size).
MAX_SEGMENT_BYTES = 64 << 20
MAX_RUN_BYTES_ENV = "STARTTRACE_MAX_RUN_MB"  # the cap per run, in MiB (default 1024)
DEFAULT_MAX_RUN_BYTES = 1024 << 20
MAX_SMALL_FILE_BYTES = 1 << 20  # run.json, clock files
_READ_CHUNK = 1 << 20
_ZERO_CHUNK = bytes(_READ_CHUNK)


def max_run_bytes() -> int:
    """The cap on journal bytes read per run (STARTTRACE_MAX_RUN_MB, else DEFAULT_MAX_RUN_BYTES)."""
    value = os.environ.get(MAX_RUN_BYTES_ENV, "")
    try:
        return max(1, int(float(value) * (1 << 20))) if value else DEFAULT_MAX_RUN_BYTES
    except ValueError:
        return DEFAULT_MAX_RUN_BYTES


class ReadBudget:
    """The journal bytes a reader may still take from one run, and what it skipped (for `problems`)."""

    def __init__(self, total: int | None = None) -> None:
        self.left = max_run_bytes() if total is None else total
        self.skipped: list[str] = []


def open_regular(path: Path) -> int:
    """A descriptor of `path`, which must be a regular file (not a FIFO, a device such as /dev/zero,
    a socket or a folder, also through a link). Raises OSError naming what it is instead."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO must not wait for a writer
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file ({_kind(mode)})", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


def read_small(path: Path, limit: int = MAX_SMALL_FILE_BYTES) -> bytes:
    """The bytes of a small file (run.json, a clock file): a regular file of at most `limit` bytes.
    Raises OSError otherwise."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return data


def _read_bounded(path: Path, budget: ReadBudget, version2: bool) -> bytes:
    """A journal file's bytes, at most MAX_SEGMENT_BYTES and what `budget` has left; a version 2
    segment's read stops at its unused tail (a whole chunk of zero bytes: a sparse 1 GiB segment
    costs one chunk). What was not read is noted in `budget.skipped`. Raises OSError."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size
        limit = min(MAX_SEGMENT_BYTES, max(0, budget.left))
        parts: list[bytes] = []
        got = 0
        while got < limit:
            chunk = handle.read(min(_READ_CHUNK, limit - got))
            if not chunk:
                break
            if version2 and chunk == _ZERO_CHUNK[: len(chunk)]:
                break  # the unused tail
            parts.append(chunk)
            got += len(chunk)
        else:
            if handle.read(1) and not (version2 and _all_zero_after(handle)):
                cap = "the run's cap" if limit < MAX_SEGMENT_BYTES else f"{MAX_SEGMENT_BYTES >> 20} MiB per segment"
                budget.skipped.append(f"read only {got} of the {size} bytes of {path.name} ({cap}); the rest skipped")
    budget.left -= got
    return b"".join(parts)


def _all_zero_after(handle: Any) -> bool:
    """Is the next chunk of the file (after the one byte just read) zero bytes only? (the tail)"""
    handle.seek(-1, os.SEEK_CUR)
    chunk = handle.read(_READ_CHUNK)
    return chunk == _ZERO_CHUNK[: len(chunk)]


CLOCK_PREFIX = "clock-"  # clock-<root span id>.json: a host's NTP state (starttrace.clocksync.record)


def is_clock_file(name: str) -> bool:
    return name.startswith(CLOCK_PREFIX) and name.endswith(".json")


def is_journal_file(name: str) -> bool:
    """Is a file of this name (in a run folder) a journal file of either version?"""
    return name.endswith(V1_SUFFIX) or _SEGMENT.fullmatch(name) is not None


def _segment_key(path: Path) -> tuple[str, int] | None:
    match = _SEGMENT.fullmatch(path.name)
    return None if match is None else (match["journal"], int(match["n"]))


def journal_files(run_dir: Path) -> list[Path]:
    """One path per journal in `run_dir`, sorted by name: a version 1 file, or the first segment
    of a version 2 journal (pass it to `journal_lines`, which reads all of its segments)."""
    firsts: dict[str, Path] = {}
    numbers: dict[str, int] = {}
    paths: list[Path] = []
    for path in Path(run_dir).iterdir():
        if path.name.endswith(V1_SUFFIX):
            paths.append(path)
            continue
        key = _segment_key(path)
        if key is not None and (key[0] not in numbers or key[1] < numbers[key[0]]):
            firsts[key[0]], numbers[key[0]] = path, key[1]
    paths.extend(firsts.values())
    return sorted(paths, key=lambda p: p.name)


def all_journal_files(run_dir: Path) -> list[Path]:
    """Every journal file in `run_dir` (each segment of a version 2 journal on its own)."""
    return sorted((p for p in Path(run_dir).iterdir() if is_journal_file(p.name)), key=lambda p: p.name)


def segments(journal: Path) -> list[Path]:
    """The files of one journal in order: [journal] for version 1, its segments for version 2."""
    key = _segment_key(journal)
    if key is None:
        return [journal]
    found: list[tuple[int, Path]] = []
    prefix = key[0] + "."
    for path in journal.parent.iterdir():
        name = path.name
        if name.startswith(prefix):
            other = _segment_key(path)
            if other is not None and other[0] == key[0] and other[1] >= key[1]:
                found.append((other[1], path))
    return [path for _, path in sorted(found)] or [journal]


def split_segment(data: bytes) -> tuple[bytes, bytes]:
    """(whole records, cut record) of one version 2 segment's bytes: the records are everything up
    to the last newline; the cut record is what follows it up to the first zero byte (b"": none)."""
    end = data.rfind(b"\n") + 1
    stop = data.find(b"\0", end)
    return data[:end], data[end : len(data) if stop < 0 else stop]


def journal_lines(journal: Path, budget: ReadBudget | None = None) -> list[bytes]:
    """The record lines of a journal (either version), as `data.split(b"\\n")` gives them for a
    version 1 file: the last item is b"" when the journal ends with a whole record, else the cut
    last record. Zero-byte tails of version 2 segments are not lines. Reads within `budget` (a new
    one per call when None): what it could not read is named in `budget.skipped`. Raises OSError
    (also for a file that is not a regular file)."""
    budget = ReadBudget() if budget is None else budget
    parts = segments(journal)
    if len(parts) == 1 and _segment_key(parts[0]) is None:
        return _read_bounded(parts[0], budget, version2=False).split(b"\n")
    lines: list[bytes] = []
    fragment = b""
    for index, path in enumerate(parts):
        if budget.left <= 0:
            rest = len(parts) - index - 1
            budget.skipped.append(f"skipped {path.name} and the {rest} segment(s) after it (the run's cap)")
            break
        if fragment:  # a cut record followed by another segment: a line of its own (malformed)
            lines.append(fragment)
        records, fragment = split_segment(_read_bounded(path, budget, version2=True))
        if records:
            lines.extend(records.split(b"\n")[:-1])
    lines.append(fragment)
    return lines


def used_bytes(path: Path, known: int = 0) -> int:
    """The bytes of a journal file that hold whole records: a version 1 file's size, the end of the
    last whole record in a version 2 segment (its size and mtime do not follow its writes). `known`,
    an earlier answer for the same file, makes it cheap: only the bytes after it are read."""
    if _segment_key(path) is None:
        return os.stat(path).st_size
    with os.fdopen(open_regular(path), "rb", buffering=0) as handle:
        end = 0
        if known > 0:
            handle.seek(known - 1)
            probe = handle.read(2)
            if probe[:1] == b"\n":
                if probe[1:] in (b"\0", b""):
                    return known  # the byte after the last record is still unused: nothing new
                end = known
        offset = end
        handle.seek(offset)
        while True:
            chunk = handle.read(_CHUNK)
            if not chunk:
                return end
            stop = chunk.find(b"\0")
            piece = chunk if stop < 0 else chunk[:stop]
            newline = piece.rfind(b"\n")
            if newline >= 0:
                end = offset + newline + 1
            if stop >= 0:
                return end
            offset += len(chunk)
            if offset >= MAX_SEGMENT_BYTES:
                return end  # what a reader would read of it (_read_bounded)


def journal_signature(run_dir: Path, known: dict[str, int] | None = None) -> tuple[tuple[str, int, int], ...]:
    """(name, bytes in use, mtime ns) of run.json, the clock files and every journal file in `run_dir`, sorted: it
    changes whenever a record is added, also to a version 2 segment (whose size and mtime may not
    change). `known` (name -> bytes in use) is read and updated, so that a poll reads only new bytes."""
    known = {} if known is None else known
    out = []
    try:
        with os.scandir(run_dir) as entries:
            for entry in entries:
                name = entry.name
                journal = is_journal_file(name)
                if not journal and name != "run.json" and not is_clock_file(name):
                    continue
                try:
                    info = entry.stat()
                    if not stat.S_ISREG(info.st_mode):
                        continue  # never opened (a FIFO would block, /dev/zero never ends); the reader names it
                    used = used_bytes(Path(entry.path), known.get(name, 0)) if journal else info.st_size
                except OSError:
                    continue
                known[name] = used
                out.append((name, used, info.st_mtime_ns))
    except OSError:
        return ()
    return tuple(sorted(out))


_HEX_DIGITS = frozenset(b"0123456789abcdef")


def parse_record(raw: bytes) -> dict[str, Any]:
    """One journal record as a dict. A JSON record is parsed as it is; a compact import record
    (version 3: `I<span><parent><t> <module>`, `E<span><dt>[ <path>]`, docs/journal.md) becomes the
    JSON record it stands for, with `dt` (ns since its begin) in place of `t` for an `E`.
    Raises ValueError for a malformed record."""
    lead = raw[:1]
    if lead == b"I":
        head, sep, name = raw.partition(b" ")
        if not sep or len(head) < 34 or not _HEX_DIGITS.issuperset(head[1:33]):
            raise ValueError("malformed import begin record")
        module = name.decode()
        return {
            "k": "b",
            "s": head[1:17].decode(),
            "p": head[17:33].decode(),
            "n": "import " + module,
            "t": int(head[33:]),
            "a": {"starttrace.phase": "import", "starttrace.import.module": module},
        }
    if lead == b"E":
        head, sep, path = raw.partition(b" ")
        if len(head) < 18 or not _HEX_DIGITS.issuperset(head[1:17]):
            raise ValueError("malformed import end record")
        record: dict[str, Any] = {"k": "e", "s": head[1:17].decode(), "dt": int(head[17:])}
        if sep:
            record["a"] = {"code.file.path": path.decode()}
        return record
    item = json.loads(raw)
    if not isinstance(item, dict):
        raise ValueError("not an object")
    return item
