"""Journal writer: one append-only JSON-lines file per process (hot path, stdlib only).

The format is documented in docs/journal.md. This module must not import anything beyond
builtins and `os`: it runs inside traced processes before they are ready, and every module it
imported would be missing from the traced program's own import record. That is also why it
encodes JSON by hand instead of importing `json`.
"""

from __future__ import annotations

import os

FORMAT_VERSION = 1

_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES[ord('"')] = '\\"'
_ESCAPES[ord("\\")] = "\\\\"
_ESCAPES[0x7F] = "\\u007f"


def quote(text: str) -> str:
    if text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'  # the common case (module names, paths): 5x faster than translate
    return '"' + text.translate(_ESCAPES) + '"'


def encode(value: object) -> str:
    """Encode a JSON value (str, int, float, bool, None, list, tuple, dict); others as str."""
    kind = type(value)
    if kind is str:
        return quote(value)  # type: ignore[arg-type]
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            return quote(repr(value))
        return repr(value)
    if value is None:
        return "null"
    if kind is list or kind is tuple:
        return "[" + ",".join([encode(item) for item in value]) + "]"  # type: ignore[attr-defined]
    if kind is dict:
        return (
            "{"
            + ",".join([quote(str(k)) + ":" + encode(v) for k, v in value.items()])  # type: ignore[attr-defined]
            + "}"
        )
    return quote(str(value))


class JournalWriter:
    """Appends whole lines to one file with single `os.write` calls on an O_APPEND descriptor."""

    __slots__ = ("failed", "fd", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.failed: str | None = None
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        self.fd = os.open(path, flags, 0o644)

    def write(self, line: str) -> bool:
        """Write one line (with its newline). False once writing has failed (disk full, ...)."""
        if self.fd < 0:
            return False
        data = line.encode("utf-8", "backslashreplace")
        try:
            written = os.write(self.fd, data)
        except OSError as exc:
            self._fail(f"cannot write {self.path}: {exc}")
            return False
        if written != len(data):
            self._fail(f"short write to {self.path} (disk full?)")
            return False
        return True

    def _fail(self, message: str) -> None:
        self.failed = message
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
