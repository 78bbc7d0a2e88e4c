"""The attributes the model reads of every span (`lazy_attrs.HOT_KEYS`) are read together on first
use: whatever the encoding, each answers what the decoded attribute list says."""

from __future__ import annotations

import itertools

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from starttrace.run import hot_values
from starttrace.sources import lazy_attrs
from starttrace.sources.lazy_attrs import HOT_KEYS, LazyAttrs
from starttrace.sources.otlp import span_attrs

PHASE, MODULE, SELF_US = HOT_KEYS


@pytest.fixture(autouse=True, params=["c", "python"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the C common case (`_modelcore.peek_attrs`) and with the Python one."""
    if request.param == "c":
        if lazy_attrs.c_peek_attrs is None:
            pytest.skip("starttrace._modelcore is not built here (no C compiler at install)")
    else:
        monkeypatch.setattr(lazy_attrs, "c_peek_attrs", None)
    return str(request.param)


def _raw(*kvs: KeyValue, event: KeyValue | None = None) -> bytes:
    span = Span(trace_id=b"\1" * 16, span_id=b"\2" * 8, name="import x", start_time_unix_nano=5, end_time_unix_nano=9)
    span.attributes.extend(kvs)
    if event is not None:
        span.events.add(name="e").attributes.append(event)
    return span.SerializeToString()


def _kv(key: str, **value: object) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))  # type: ignore[arg-type]


CASES = {
    "strings": _raw(_kv(PHASE, string_value="import"), _kv(MODULE, string_value="a.b"), _kv(SELF_US, int_value=7)),
    "long module": _raw(_kv(PHASE, string_value="import"), _kv(MODULE, string_value="m" * 200)),
    "two-byte kv": _raw(_kv(MODULE, string_value="é" * 60), _kv(SELF_US, double_value=1.5)),
    "empty and big int": _raw(_kv(PHASE, string_value=""), _kv(SELF_US, int_value=1 << 40)),
    "repeated": _raw(_kv(PHASE, string_value="a"), _kv(PHASE, string_value="b"), _kv(MODULE, string_value="m")),
    "not a string": _raw(_kv(PHASE, int_value=3), _kv(MODULE, bool_value=True)),
    "only in an event": _raw(_kv(SELF_US, int_value=2), event=_kv(PHASE, string_value="not the span's")),
    "none": _raw(_kv("other", string_value="x")),
}


@pytest.mark.parametrize("name", CASES)
def test_hot_keys_match_the_decoded_list(name: str) -> None:
    raw = CASES[name]
    full = span_attrs(raw)
    for order in itertools.permutations([*HOT_KEYS, "other"]):
        lazy = LazyAttrs(raw, span_attrs)
        for key in order:
            assert lazy.get(key, "default") == full.get(key, "default"), (name, order, key)
        assert lazy == full


def test_hot_keys_need_no_decode() -> None:
    lazy = LazyAttrs(CASES["strings"], span_attrs)
    assert (lazy.get(PHASE), lazy.get(MODULE), lazy.get(SELF_US)) == ("import", "a.b", 7)
    assert lazy.get("absent") is None
    assert not lazy.decoded
    assert LazyAttrs(CASES["repeated"], span_attrs).get(PHASE) == "b"  # the last one wins: decoded


@pytest.mark.parametrize("name", CASES)
def test_hot_values_in_one_call_match_the_decoded_list(name: str) -> None:
    """`run.hot_values` (what build_model asks of every span): one `LazyAttrs.hot()` call, before or
    after other reads, and on a plain dict, answers `get` of each key of the decoded list."""
    raw = CASES[name]
    full = span_attrs(raw)
    want = tuple(full.get(key) for key in HOT_KEYS)
    assert hot_values(full) == want
    for first in (None, *HOT_KEYS, "other"):
        lazy = LazyAttrs(raw, span_attrs)
        if first is not None:
            lazy.get(first)
        assert hot_values(lazy) == want, (name, first)
        assert hot_values(lazy) == want  # asked again: the same, from what was read
        assert lazy == full


def test_c_common_case_matches_python_on_damaged_bytes(implementation: str) -> None:
    """`_modelcore.peek_attrs` reads stored bytes in C: on every truncation and on random byte
    changes of each case (invalid UTF-8 included), it finds what the Python code finds."""
    if implementation == "python":
        pytest.skip("compares the C code with the Python code: runs once, as the 'c' case")
    import random

    def both(raw: bytes) -> tuple[dict[str, object], dict[str, object]]:
        c_side: dict[str, object] = {}
        lazy_attrs.peek_hot(raw, c_side)
        py_side: dict[str, object] = {}
        saved, lazy_attrs.c_peek_attrs = lazy_attrs.c_peek_attrs, None
        try:
            lazy_attrs.peek_hot(raw, py_side)
        finally:
            lazy_attrs.c_peek_attrs = saved
        return c_side, py_side

    bad_utf8 = CASES["strings"].replace(b"import", b"\xff\xfeport")
    c_side, py_side = both(bad_utf8)
    assert c_side == py_side and PHASE not in c_side  # left out: decoding the list reports it
    rng = random.Random(7)
    for raw in [*CASES.values(), bad_utf8]:
        for cut in range(len(raw) + 1):
            c_side, py_side = both(raw[:cut])
            assert c_side == py_side, (raw, cut)
        for _ in range(300):
            damaged = bytearray(raw)
            damaged[rng.randrange(len(raw))] = rng.randrange(256)
            c_side, py_side = both(bytes(damaged))
            assert c_side == py_side, bytes(damaged)
