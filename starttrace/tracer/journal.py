"""Journal writer: one memory-mapped, segmented journal per process (hot path, stdlib only).

The format is documented in docs/journal.md (version 3). A journal is a series of segment files
`<base>.<n>.journal` (n = 0, 1, ...). Each segment is created by path, allocated in full
(`posix_fallocate`, so a full disk is an error here, never a SIGBUS later), mapped shared, and
its descriptor closed at once: a record is a memory copy into the mapping, not a system call, and
no descriptor of ours stays open for the program to close, `dup2` over or be handed back. What was
copied is in the page cache, so it survives `os._exit` and SIGKILL like a `write` would.

This module imports nothing beyond builtins, `os`, `sys` and `time` (already loaded when the
`.pth` line runs) except `mmap` where the C core does not map the segments itself (the Python
code, or a failed journal's last words), which it loads once and then removes from `sys.modules`
again, so that the traced program's own first `import mmap` is still recorded (see `footprint`).
That is also why it encodes JSON by hand instead of importing `json`.
"""

import os
import sys
from time import monotonic_ns

from starttrace.tracer.activation import (
    FIRST_SEGMENT,
    FORMAT_VERSION,
    MAX_SEGMENT,
    SEGMENT_RESERVE,
    SEGMENT_SUFFIX,
    encode,
    footprint,
    quote,
    segment_path,
)

__all__ = [
    "FIRST_SEGMENT",
    "FORMAT_VERSION",
    "MAX_SEGMENT",
    "SEGMENT_SUFFIX",
    "JournalWriter",
    "encode",
    "footprint",
    "quote",
    "segment_path",
]

_PAGE = 4096


class JournalWriter:
    """Writes whole records into memory-mapped segments `<base>.<n>.journal`.

    `put` is the bound `write` method of the current segment (None once the journal failed or
    was closed): a `_hotpath.Segment` over the mapping where the C core is built, else the
    mapping's own. One C call that copies a record and advances the position, atomic under the
    GIL, so threads never tear or interleave records. It raises ValueError when the record does
    not fit; `write` (and the import probe's inlined copies of it) then call `overflow`, which
    opens the next segment. A record never spans two segments. The last RESERVE bytes of
    a segment are not mapped for records: they keep room for the `warn` record that says why
    the journal ends, should the next segment fail (a full disk).
    """

    RESERVE = SEGMENT_RESERVE

    __slots__ = ("_lock", "base", "failed", "number", "put", "size")

    @classmethod
    def adopt(cls, base: str, number: int, size: int, put: object) -> "JournalWriter":
        """The writer of the journal activation.py's light case opened (`put`: its current
        segment's write)."""
        from _thread import allocate_lock

        writer = cls.__new__(cls)
        writer.base = base
        writer.failed = None
        writer.number = number
        writer.size = size
        writer.put = put
        writer._lock = allocate_lock()
        return writer

    def __init__(self, base: str, first_size: int = FIRST_SEGMENT) -> None:
        """Create segment 0 of the journal `base` (raises OSError: the caller reports it)."""
        from _thread import allocate_lock  # a builtin module, loaded at interpreter start

        self.base = base
        self.failed: str | None = None
        self.number = -1
        self.size = 0
        self.put = None
        self._lock = allocate_lock()
        self._open_segment(first_size)

    def write(self, line: str) -> bool:
        """Write one record (a line with its newline). False once writing has failed (disk full, ...)."""
        put = self.put
        if put is None:
            return False
        data = line.encode("utf-8", "backslashreplace")
        try:
            put(data)
        except ValueError:
            return self.overflow(put, data)
        return True

    def overflow(self, full_put: object, data: bytes) -> bool:
        """The segment behind `full_put` had no room for `data`: write it into the next one."""
        with self._lock:  # several threads can find the segment full at once: one opens the next
            if self.put is full_put:
                size = min(self.size * 2, MAX_SEGMENT)
                needed = (len(data) + self.RESERVE + _PAGE) // _PAGE * _PAGE
                try:
                    self._open_segment(max(size, needed))
                except OSError as exc:
                    self._fail(full_put, f"cannot extend journal {segment_path(self.base, self.number + 1)}: {exc}")
                    return False
            put = self.put
        if put is None:
            return False
        try:
            put(data)
        except ValueError:
            return self.overflow(put, data)
        return True

    def _open_segment(self, size: int) -> None:
        path = segment_path(self.base, self.number + 1)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)  # a full disk fails here, not as SIGBUS on a later write
            core = hotpath
            if core is not None and hasattr(core, "map_segment"):  # maps it in C: `mmap` stays unloaded
                put = core.map_segment(fd, size - self.RESERVE).write
            else:
                mapping = _map(fd, size - self.RESERVE, 0)
                put = core.Segment(mapping).write if core is not None else mapping.write  # type: ignore[attr-defined]
        except BaseException:
            os.close(fd)
            try:
                os.unlink(path)
            except OSError:
                pass
            raise
        os.close(fd)
        self.number += 1
        self.size = size
        self.put = put

    def _fail(self, full_put: object, message: str) -> None:
        """Stop for good; write the `warn` record into the current segment's reserved tail."""
        self.failed = message
        self.put = None
        try:
            used = full_put.__self__.tell()  # type: ignore[attr-defined]
            start = used // _PAGE * _PAGE
            fd = os.open(segment_path(self.base, self.number), os.O_RDWR | os.O_CLOEXEC)
            try:
                tail = _map(fd, self.size - start, start)
            finally:
                os.close(fd)
            warn = '{"k":"warn","t":%d,"msg":%s}\n' % (monotonic_ns(), quote(message[:600]))
            data = warn.encode("utf-8", "backslashreplace")
            at = full_put.__self__.tell() - start  # type: ignore[attr-defined]  # a thread may have added one
            tail[at : at + len(data)] = data  # type: ignore[index]
        except Exception:
            pass  # the failure is reported on stderr all the same

    def close(self) -> None:
        """Stop writing. The mappings stay (see `_keep`): closing one could close a descriptor
        number the program owns by now."""
        self.put = None


def _map(fd: int, length: int, offset: int) -> object:
    """Map `length` bytes of the file `fd` from `offset` (page-aligned), shared, for writing, and
    keep the mapping for the rest of the process. The caller closes `fd`; no other descriptor
    stays open. Raises OSError."""
    mmap = _load_mmap()
    if _TRACKFD:
        mapping = mmap.mmap(fd, length, offset=offset, trackfd=False)  # Python >= 3.13: keeps no descriptor
    else:
        spare = os.dup(fd)  # the lowest free descriptor: where the mmap object's own dup lands
        os.close(spare)
        mapping = mmap.mmap(fd, length, offset=offset)
        _close_mmap_dup(fd, spare)
    _keep(mapping)
    return mapping


_TRACKFD = sys.version_info >= (3, 13)


def _close_mmap_dup(fd: int, guess: int) -> None:
    """Before 3.13 an mmap object keeps a duplicate of its file's descriptor (for size(), resize()
    and close(), which starttrace never calls). Close it: starttrace holds no descriptor at all.
    Only `fd` and that duplicate refer to the file in this process (a segment is created, or a
    failed journal's last segment reopened, a moment before), so the duplicate is `guess` or, if
    another thread took that number meanwhile, whichever other descriptor refers to the file."""
    own = os.fstat(fd)

    def same(other: int) -> bool:
        try:
            found = os.fstat(other)
        except OSError:
            return False
        return found.st_ino == own.st_ino and found.st_dev == own.st_dev

    if guess != fd and same(guess):
        os.close(guess)
        return
    try:
        numbers = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for other in numbers:
        if other != fd and same(other):
            os.close(other)
            return


def _keep(mapping: object) -> None:
    """Keep `mapping` alive until the process ends, interpreter shutdown included.

    Deallocating an mmap object (before 3.13) closes the descriptor number it remembers, which
    `_close_mmap_dup` closed already and the program may own by now (a log file it opened after a
    `closerange`): at shutdown that would cut the program's unflushed output. A reference cycle
    through a code object (not tracked by the garbage collector) is never collected or cleared.
    """
    holder = [mapping]
    holder.append(_keep.__code__.replace(co_consts=(holder,)))


def _load_mmap():  # type: ignore[no-untyped-def]
    """The `mmap` module, loaded once without leaving a trace in sys.modules (see `footprint`)."""
    global _mmap
    if _mmap is not None:
        return _mmap
    modules = sys.modules
    loaded = modules.get("mmap")
    if loaded is not None:  # the program (or site) has it already: nothing to hide
        _mmap = loaded
        return loaded
    start = monotonic_ns()
    import mmap

    footprint["mmap"] = monotonic_ns() - start
    if modules.get("mmap") is mmap:
        del modules["mmap"]
    _mmap = mmap
    return mmap


_mmap = None


# The C core of the hot path (starttrace/tracer/_hotpath.c) once activation chose it
# (`boot._load_hotpath`, or activation.py's light case); None: the Python code writes the same records (mmap.write).
hotpath = None
