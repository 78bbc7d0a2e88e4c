"""weights probe: one `weights.load` span per weight file a process reads, and a `weights.download`
span per Hugging Face download (docs/probes.md has the attributes).

A generic library probe (vLLM, SGLang, transformers, plain torch). It replaces `safetensors.safe_open`
before `safetensors.torch` and vLLM bind it (a class that opens the real one and hands its calls
through), wraps `torch.load` of a path (hooked by the torch probe, which loads this module at the
first such call) and `huggingface_hub.file_download.hf_hub_download`. The file's facts: size,
filesystem type (/proc/self/mountinfo), page cache share (mincore(2)), bytes read (/proc/self/io).
Standard library only.
"""

import os
import sys

from starttrace.tracer import recorder
from starttrace.tracer.probes._wrap import _mark, note_attached, note_missing, publish_probe_list, traced

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Attrs = dict[str, Any]

FULL_MINCORE_PAGES = 262144  # up to 1 GiB of 4 KiB pages: every page; past that, sampled windows
SAMPLE_WINDOWS = 64
SAMPLE_WINDOW_PAGES = 4096


def install() -> None:
    """Register the post-import hooks (probes/__init__.py LAZY_PROBES)."""
    recorder.when_imported("safetensors", _patch_safetensors)
    recorder.when_imported("safetensors.torch", _patch_safetensors)
    recorder.when_imported("huggingface_hub.file_download", _patch_hf_file_download)


# --------------------------------------------------------------------------------------------
# file facts: filesystem type, page cache, process I/O


class _Mounts:
    table: "list[tuple[str, str]] | None" = None  # (mount point, fstype), longest mount point first


_mounts = _Mounts()


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    if "\\" not in field:
        return field
    out = []
    index = 0
    while index < len(field):
        if field[index] == "\\" and field[index + 1 : index + 4].isdigit():
            out.append(chr(int(field[index + 1 : index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def _mount_table() -> "list[tuple[str, str]]":
    if _mounts.table is None:
        table: list[tuple[str, str]] = []
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as file:
                for line in file:
                    left, sep, right = line.partition(" - ")
                    fields = left.split()
                    if not sep or len(fields) < 5 or not right:
                        continue
                    table.append((_unescape(fields[4]), right.split()[0]))
        except OSError:
            pass
        # longest first; among equal mount points the last mounted (later line) wins
        table.reverse()
        table.sort(key=lambda row: len(row[0]), reverse=True)
        _mounts.table = table
    return _mounts.table


def fs_type(path: str) -> "str | None":
    """The fstype of the mount holding `path` (its real path), from /proc/self/mountinfo."""
    real = os.path.realpath(path)
    for mount_point, fstype in _mount_table():
        if real == mount_point or mount_point == "/" or real.startswith(mount_point.rstrip("/") + "/"):
            return fstype
    return None


def _io_read_bytes() -> "int | None":
    try:
        with open("/proc/self/io", "rb") as file:
            for line in file:
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


class _Libc:
    handle: "Any" = None
    ctypes: "Any" = None
    failed = False


_libc = _Libc()


def _load_libc() -> "Any":
    if _libc.handle is not None or _libc.failed:
        return _libc.handle
    try:
        from starttrace.tracer.probes import import_unrecorded

        # torch and numpy load ctypes anyway; past the import probe, as it is not the program's import
        ctypes = import_unrecorded("ctypes")
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
        libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        _libc.ctypes = ctypes
        _libc.handle = libc
    except Exception as exc:
        _libc.failed = True
        recorder.report(f"weights probe: no mincore: {type(exc).__name__}: {exc}", key="weights:libc")
    return _libc.handle


def page_cache_fraction(path: str, size: int) -> "float | None":
    """Share of the file's pages in the page cache now (mincore over a PROT_READ mapping; the
    mapping reads nothing). Files past FULL_MINCORE_PAGES pages are sampled in SAMPLE_WINDOWS
    windows spread over the file."""
    if size <= 0:
        return None
    libc = _load_libc()
    if libc is None:
        return None
    ctypes = _libc.ctypes
    page = os.sysconf("SC_PAGE_SIZE")
    pages = (size + page - 1) // page
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        address = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if address is None or address == ctypes.c_void_p(-1).value:
            return None
        try:
            if pages <= FULL_MINCORE_PAGES:
                windows = [(0, pages)]
            else:
                step = (pages - SAMPLE_WINDOW_PAGES) // (SAMPLE_WINDOWS - 1)
                windows = [(i * step, SAMPLE_WINDOW_PAGES) for i in range(SAMPLE_WINDOWS)]
            vec = (ctypes.c_ubyte * max(count for _, count in windows))()
            resident = total = 0
            for first, count in windows:
                length = min(count * page, size - first * page)
                if libc.mincore(address + first * page, length, vec) != 0:
                    return None
                data = bytes(vec)[:count]
                resident += count - data.count(0)
                total += count
            return resident / total if total else None
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def _path_of(filename: "Any") -> "str | None":
    if isinstance(filename, str):
        return filename
    if isinstance(filename, bytes):
        return None
    fspath = getattr(type(filename), "__fspath__", None)
    if fspath is None:
        return None
    value = fspath(filename)
    return value if isinstance(value, str) else None


def begin_load(filename: "Any", fmt: str) -> "tuple[str, int | None]":
    """Begin `weights.load` for a path ("" when it is not a path, or tracing is off)."""
    if recorder._writer is None:
        return "", None
    try:
        path = _path_of(filename)
        if path is None:
            return "", None
        attrs: Attrs = {
            "starttrace.phase": "model_load",
            "starttrace.weights.file": path,
            "starttrace.weights.format": fmt,
        }
        try:
            size = os.stat(path).st_size
        except OSError:
            size = None  # the library will say why it cannot open it
        if size is not None:
            attrs["starttrace.weights.file_bytes"] = size
            fstype = fs_type(path)
            if fstype:
                attrs["starttrace.weights.fs_type"] = fstype
            try:
                fraction = page_cache_fraction(path, size)
            except OSError:
                fraction = None
            if fraction is not None:
                attrs["starttrace.weights.page_cache_fraction"] = round(fraction, 4)
        io_before = _io_read_bytes()
        # not pushed: what runs while the file is open (a loader's per-tensor code) nests where it ran
        return recorder.begin("weights.load", attrs, push=False), io_before
    except Exception as exc:
        recorder.report(f"weights probe failed: {type(exc).__name__}: {exc}", key="weights:begin")
        return "", None


def end_load(
    span_id: str, io_before: "int | None", bytes_read: "int | None", tensors: "int | None", error: "str | None" = None
) -> None:
    if not span_id:
        return
    try:
        attrs: Attrs = {}
        if bytes_read is not None:
            attrs["starttrace.weights.bytes_read"] = bytes_read
        if tensors is not None:
            attrs["starttrace.weights.tensors"] = tensors
        io_after = _io_read_bytes()
        if io_before is not None and io_after is not None:
            attrs["starttrace.weights.io_read_bytes"] = io_after - io_before
        recorder.end(span_id, attrs or None, error)
    except Exception as exc:
        recorder.report(f"weights probe failed: {type(exc).__name__}: {exc}", key="weights:end")


def _nbytes(value: "Any") -> int:
    nbytes = getattr(value, "nbytes", None)
    return nbytes if isinstance(nbytes, int) else 0


def tensor_bytes(result: "Any") -> "tuple[int, int]":
    """(bytes, count) of the tensors in a loaded object: a tensor, or a dict of them (a state
    dict, or one level deeper: {"model": state_dict, ...})."""
    values = [result]
    if isinstance(result, dict):
        values = []
        for value in result.values():
            if isinstance(value, dict):
                values.extend(value.values())
            else:
                values.append(value)
    total = count = 0
    for value in values:
        size = _nbytes(value)
        if size or hasattr(value, "nbytes"):
            total += size
            count += 1
    return total, count


# --------------------------------------------------------------------------------------------
# safetensors


def _safe_open_class(original: "Any") -> "Any":
    class safe_open:
        """starttrace's stand-in for safetensors' `safe_open`: the real one inside, one span per
        file (docs/probes.md)."""

        __slots__ = ("_bytes", "_done", "_inner", "_io", "_span", "_tensors")

        def __init__(self, filename: "Any", *args: "Any", **kwargs: "Any") -> None:
            self._span, self._io = begin_load(filename, "safetensors")
            self._bytes = 0
            self._tensors = 0
            self._done = False
            try:
                self._inner = original(filename, *args, **kwargs)
            except BaseException as exc:
                self._finish(f"{type(exc).__name__}: {exc}")
                raise

        def _finish(self, error: "str | None" = None) -> None:
            if not self._done:
                self._done = True
                end_load(self._span, self._io, self._bytes, self._tensors, error)

        def __enter__(self) -> "safe_open":
            self._inner.__enter__()
            return self

        def __exit__(self, *exc_info: "Any") -> "Any":
            try:
                return self._inner.__exit__(*exc_info)
            finally:
                self._finish()

        def get_tensor(self, name: str) -> "Any":
            tensor = self._inner.get_tensor(name)
            self._bytes += _nbytes(tensor)
            self._tensors += 1
            return tensor

        def get_tensors(self, *args: "Any", **kwargs: "Any") -> "Any":
            tensors = self._inner.get_tensors(*args, **kwargs)
            size, count = tensor_bytes(tensors)
            self._bytes += size
            self._tensors += count
            return tensors

        def __getattr__(self, name: str) -> "Any":
            if name.startswith("_"):
                raise AttributeError(name)
            return getattr(self._inner, name)

        def __del__(self) -> None:
            try:
                self._finish()
            except Exception:
                pass

    safe_open.__module__ = getattr(original, "__module__", "safetensors")
    safe_open.__qualname__ = safe_open.__name__ = "safe_open"
    safe_open.__wrapped__ = original  # type: ignore[attr-defined]
    safe_open.__starttrace__ = True  # type: ignore[attr-defined]
    return safe_open


class _SafeOpen:
    original: "Any" = None
    replacement: "Any" = None


_safe = _SafeOpen()


def _patch_safetensors(module: "Any") -> None:
    current = getattr(module, "safe_open", None)
    if current is None:
        note_missing(f"{module.__name__}.safe_open")
        publish_probe_list()
        return
    if getattr(current, "__starttrace__", False):
        return
    if _safe.replacement is None or current is not _safe.original:
        _safe.original = current
        _safe.replacement = _safe_open_class(current)
    module.safe_open = _safe.replacement
    note_attached(f"{module.__name__}.safe_open")
    publish_probe_list()


# --------------------------------------------------------------------------------------------
# torch.load


def _torch_load_wrapper(original: "Callable[..., Any]") -> "Callable[..., Any]":
    """A `weights.load` span around torch.load (the torch probe's torch.load wrapper calls it for a path only)."""

    def load(f: "Any", *args: "Any", **kwargs: "Any") -> "Any":
        span_id, io_before = begin_load(f, "torch")
        try:
            result = original(f, *args, **kwargs)
        except BaseException as exc:
            end_load(span_id, io_before, None, None, f"{type(exc).__name__}: {exc}")
            raise
        size: int | None = None
        count: int | None = None
        if span_id:
            try:
                size, count = tensor_bytes(result)
            except Exception:
                pass
        end_load(span_id, io_before, size, count)
        return result

    return _mark(load, original)


# --------------------------------------------------------------------------------------------
# Hugging Face downloads


def _hf_before(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "Attrs | None":
    # hf_hub_download(repo_id, filename, *, subfolder=None, repo_type=None, revision=None, ...)
    attrs: Attrs = {"starttrace.weights.format": "download"}
    repo = kwargs.get("repo_id", args[0] if args else None)
    filename = kwargs.get("filename", args[1] if len(args) > 1 else None)
    if isinstance(repo, str):
        attrs["starttrace.weights.repo"] = repo
    if isinstance(filename, str):
        attrs["starttrace.weights.repo_file"] = filename
    revision = kwargs.get("revision")
    if isinstance(revision, str):
        attrs["starttrace.weights.revision"] = revision
    return attrs


def _hf_after(args: "tuple[Any, ...]", kwargs: "dict[str, Any]", result: "Any") -> "Attrs | None":
    if not isinstance(result, str):
        return None
    attrs: Attrs = {"starttrace.weights.file": result}
    try:
        attrs["starttrace.weights.file_bytes"] = os.stat(result).st_size
    except OSError:
        pass
    return attrs


def _patch_hf_file_download(module: "Any") -> None:
    original = getattr(module, "hf_hub_download", None)
    if original is None or not callable(original):
        note_missing("huggingface_hub.file_download.hf_hub_download")
        publish_probe_list()
        return
    if getattr(original, "__starttrace__", False):
        return
    module.hf_hub_download = traced(original, "weights.download", "model_load", None, _hf_before, _hf_after)
    hub = sys.modules.get("huggingface_hub")
    if hub is not None and hub.__dict__.get("hf_hub_download") is original:
        hub.hf_hub_download = module.hf_hub_download
    note_attached("huggingface_hub.file_download.hf_hub_download")
    publish_probe_list()
