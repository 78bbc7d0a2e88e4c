"""Span attributes decoded on first use.

The store keeps each span's attributes as it received them: the span's raw OTLP protobuf bytes,
or JSON object text (journals). Building the waterfall model reads only a few scalar attributes
of each span (`starttrace.phase`, the import module, its self time), and the page's first answer
shows only part of the spans: decoding every attribute list of a 100k-span run would cost more
than the rest of the build.

`LazyAttrs` is a dict that decodes its content on first use. `get(key)` of one key answers
without decoding the whole list when it can: a key whose bytes are not in the data is absent; a
key that occurs once, with a string, bool, int or double value, is read where it stands (protobuf:
`KeyValue{key=1, value=2: AnyValue{string=1 | bool=2 | int=3 | double=4}}`). Everything else
(a repeated key, arrays, maps, an entry that is not the span's own, e.g. an event's, any other
method) decodes the whole list first, so the dict always answers what the decoded list says (a
repeated key: the last value wins, as in `span_attrs`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from typing import Any

from starttrace.run import HOT_KEYS, register_raw_hot_reader
from starttrace.sources.otlp import varint

_MISSING = object()
_ATTR_TAG = b"J"  # Span.attributes: field 9, length-delimited
_UNKNOWN = object()
_KEY_PATTERNS: dict[str, bytes] = {}
_JSON_KEYS: dict[str, str] = {}


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _pattern(key: str) -> bytes:
    """The bytes of `KeyValue.key = key` followed by the tag of `KeyValue.value`."""
    pattern = _KEY_PATTERNS.get(key)
    if pattern is None:
        raw = key.encode()
        pattern = _KEY_PATTERNS[key] = b"\n" + varint(len(raw)) + raw + b"\x12"
    return pattern


def peek_protobuf(raw: bytes, key: str) -> Any:
    """The scalar value of attribute `key` in a span's protobuf bytes, `_MISSING` when the key is
    not there, `_UNKNOWN` when it cannot be read in place (then decode the whole list)."""
    pattern = _KEY_PATTERNS.get(key) or _pattern(key)
    at = raw.find(pattern)
    if at < 0:
        return _MISSING
    if raw.find(pattern, at + 1) >= 0:
        return _UNKNOWN  # repeated: the last one wins, decode
    # fast path, the common case: a short string value, every length one byte:
    # J <kv len> | pattern | <value len> 0x0A <string len> <string>
    pos = at + len(pattern)
    size = raw[pos] if pos < len(raw) else 0x80
    if size < 0x80 and at >= 2 and raw[at - 2] == 0x4A and raw[at - 1] == len(pattern) + 1 + size:
        if size >= 2 and pos + 1 + size <= len(raw) and raw[pos + 1] == 0x0A and raw[pos + 2] == size - 2:
            try:
                return raw[pos + 3 : pos + 1 + size].decode("utf-8")
            except UnicodeDecodeError:
                return _UNKNOWN
    try:
        size, pos = _read_varint(raw, pos)
        end = pos + size
        if size == 0 or end > len(raw):
            return _UNKNOWN
        # a top-level `Span.attributes` entry (field 9), not one of an event's or a link's
        head = _ATTR_TAG + varint(end - at)
        if at < len(head) or raw[at - len(head) : at] != head:
            return _UNKNOWN
        tag = raw[pos]
        pos += 1
        if tag == 0x0A:  # string_value
            length, pos = _read_varint(raw, pos)
            if pos + length != end:
                return _UNKNOWN
            return raw[pos:end].decode("utf-8")
        if tag in (0x10, 0x18):  # bool_value, int_value
            value, pos = _read_varint(raw, pos)
            if pos != end:
                return _UNKNOWN
            if tag == 0x10:
                return bool(value)
            return value - (1 << 64) if value >= 1 << 63 else value
        if tag == 0x21 and end - pos == 8:  # double_value
            return struct.unpack_from("<d", raw, pos)[0]
    except (IndexError, ValueError, UnicodeDecodeError):
        pass
    return _UNKNOWN


# what building the waterfall model asks of (nearly) every span: read together, on first use
_HOT = tuple((key, _pattern(key)) for key in HOT_KEYS)


_HOT_PATTERNS = tuple(pattern for _, pattern in _HOT)
try:  # the common case in C (starttrace/_modelcore.c, built at install where a C compiler is there)
    from starttrace._modelcore import peek_attrs as c_peek_attrs  # type: ignore[import-not-found]
except ImportError:
    c_peek_attrs = None


def peek_hot(raw: bytes, peeked: dict[str, Any]) -> None:
    """`peek_protobuf` of each of HOT_KEYS into `peeked` (a key that cannot be read in place is
    left out): one call per span instead of one per key, the common case (a short string value, or
    an absent key) inline, in C where the extension is built (`_modelcore.peek_attrs`, the same rule:
    its byte searches cost ~20,000 instructions per span in Python)."""
    if c_peek_attrs is not None:
        for key, value in zip(HOT_KEYS, c_peek_attrs(raw, _HOT_PATTERNS, _MISSING, _UNKNOWN), strict=True):
            if value is _UNKNOWN:
                value = peek_protobuf(raw, key)
                if value is _UNKNOWN:
                    continue
            peeked[key] = value
        return
    size_raw = len(raw)
    find = raw.find
    for key, pattern in _HOT:
        at = find(pattern)
        if at < 0:
            peeked[key] = _MISSING
            continue
        plen = len(pattern)
        pos = at + plen
        if find(pattern, at + 1) < 0 and pos < size_raw:
            size = raw[pos]
            if (
                2 <= size < 0x80
                and pos + 1 + size <= size_raw
                and at >= 2
                and raw[at - 2] == 0x4A
                and raw[at - 1] == plen + 1 + size
                and raw[pos + 1] == 0x0A
                and raw[pos + 2] == size - 2
            ):
                try:
                    peeked[key] = raw[pos + 3 : pos + 1 + size].decode("utf-8")
                except UnicodeDecodeError:
                    pass  # left out: the whole list is decoded when it is asked for
                continue
        value = peek_protobuf(raw, key)
        if value is not _UNKNOWN:
            peeked[key] = value


def peek_json(text: str, key: str) -> Any:
    quoted = _JSON_KEYS.get(key)
    if quoted is None:
        quoted = _JSON_KEYS[key] = json.dumps(key)
    return _MISSING if quoted not in text else _UNKNOWN


class LazyAttrs(dict):  # type: ignore[type-arg]
    """A dict of span attributes, decoded from `raw` by `decode` on first use (see the module).

    Every dict method decodes first, and so do `dict(attrs)` and `{**attrs}`. One C fast path does
    not: `json.dumps` of a LazyAttrs nobody has read yet writes `{}` (the encoder checks the dict's
    own size before it asks for items); dump `dict(attrs)`, as the views do with their own dicts."""

    __slots__ = ("_decode", "_peeked", "_raw")
    # `_peeked` until a key is read in place: one empty dict shared by all (never written: the
    # first key read gives the instance its own). A dict per span was ~60 bytes (~180 filled by the
    # model build) of fresh memory per span, which a large run's page faults made cost seconds.
    _nothing_peeked: dict[str, Any] = {}

    def __init__(self, raw: Any, decode: Callable[[Any], dict[str, Any]]) -> None:
        super().__init__()
        self._raw = raw
        self._decode = decode
        # key -> value read in place (or _MISSING); None: decoded
        self._peeked: dict[str, Any] | None = LazyAttrs._nothing_peeked

    def _own_peeked(self, peeked: dict[str, Any]) -> dict[str, Any]:
        """`peeked`, or a dict of this instance's own in place of the shared empty one (to write to)."""
        if peeked is LazyAttrs._nothing_peeked:
            peeked = self._peeked = {}
        return peeked

    def stored(self) -> Any:
        """What it was made from (the stored bytes or text) while nothing decoded it, else the
        decoded attributes as a plain dict."""
        raw = self._raw
        return raw if raw is not None else dict(self)

    def _load(self) -> None:
        raw = self._raw
        if raw is not None:
            self._raw = None
            self._peeked = None
            dict.update(self, self._decode(raw))

    @property
    def decoded(self) -> bool:
        return self._raw is None

    def get(self, key: Any, default: Any = None) -> Any:
        peeked = self._peeked
        if peeked is None:
            return dict.get(self, key, default)
        value = peeked.get(key, _UNKNOWN)
        if value is _UNKNOWN:
            raw = self._raw
            if not isinstance(key, str):
                value = _UNKNOWN
            elif isinstance(raw, bytes):
                if key in HOT_KEYS and HOT_KEYS[0] not in peeked:  # the first of them asked: read all at once
                    peeked = self._own_peeked(peeked)
                    peek_hot(raw, peeked)
                    value = peeked.get(key, _UNKNOWN)
                    if value is not _UNKNOWN:
                        return default if value is _MISSING else value
                value = peek_protobuf(raw, key)
            else:
                value = peek_json(raw, key)
            if value is _UNKNOWN:
                self._load()
                return dict.get(self, key, default)
            self._own_peeked(peeked)[key] = value
        return default if value is _MISSING else value

    def hot(self) -> tuple[Any, Any, Any]:
        """`get` of each of HOT_KEYS (`starttrace.run.hot_values` asks for them in one call)."""
        peeked = self._peeked
        raw = self._raw
        if peeked is not None and isinstance(raw, bytes):
            if HOT_KEYS[0] not in peeked:
                peeked = self._own_peeked(peeked)
                peek_hot(raw, peeked)
            get = peeked.get
            a, b, c = get(HOT_KEYS[0], _UNKNOWN), get(HOT_KEYS[1], _UNKNOWN), get(HOT_KEYS[2], _UNKNOWN)
            if a is not _UNKNOWN and b is not _UNKNOWN and c is not _UNKNOWN:
                return (None if a is _MISSING else a), (None if b is _MISSING else b), (None if c is _MISSING else c)
        return self.get(HOT_KEYS[0]), self.get(HOT_KEYS[1]), self.get(HOT_KEYS[2])

    def __getitem__(self, key: Any) -> Any:
        self._load()
        return dict.__getitem__(self, key)

    def __contains__(self, key: object) -> bool:
        if self._raw is not None and isinstance(key, str) and self.get(key, _MISSING) is _MISSING:
            return False
        self._load()
        return dict.__contains__(self, key)

    def __iter__(self) -> Iterator[Any]:
        self._load()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self._load()
        return dict.__len__(self)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __eq__(self, other: object) -> bool:
        self._load()
        if isinstance(other, LazyAttrs):
            other._load()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        self._load()
        return dict.__repr__(self)

    def __reduce__(self) -> Any:  # copies and pickles are plain dicts
        self._load()
        return (dict, (dict(dict.items(self)),))

    def __or__(self, other: Any) -> Any:
        self._load()
        return dict(dict.items(self)) | other

    def __ror__(self, other: Any) -> Any:
        self._load()
        return other | dict(dict.items(self))

    def copy(self) -> dict[str, Any]:
        self._load()
        return dict(dict.items(self))


register_raw_hot_reader(LazyAttrs, _HOT_PATTERNS, _MISSING, _UNKNOWN)  # the model build's C reader


def _loading(name: str) -> Callable[..., Any]:
    method = getattr(dict, name)

    def wrapper(self: LazyAttrs, *args: Any, **kwargs: Any) -> Any:
        self._load()
        return method(self, *args, **kwargs)

    wrapper.__name__ = name
    return wrapper


for _name in (
    "keys", "items", "values", "__setitem__", "__delitem__", "pop", "popitem", "setdefault",
    "update", "clear", "__ior__", "__reversed__",
):  # fmt: skip
    setattr(LazyAttrs, _name, _loading(_name))
