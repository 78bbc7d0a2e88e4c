"""Span attributes decoded on first use (sources/lazy_attrs.py): a `LazyAttrs` answers exactly what
the decoded attribute list says, whatever is asked first, for OTLP span bytes and journal JSON."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from starttrace.sources.lazy_attrs import LazyAttrs
from starttrace.sources.otlp import span_attrs
from starttrace.sources.store import decode_attrs, lazy_attrs

KEYS = ("starttrace.phase", "n", "neg", "f", "b", "arr", "kv", "dup", "only.event", "absent", "otel.scope.name")


def _kv(key: str, **value: object) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))  # type: ignore[arg-type]


def _span_bytes(nested_key: str = "starttrace.phase") -> bytes:
    span = Span(trace_id=b"\1" * 16, span_id=b"\2" * 8, name="import x", start_time_unix_nano=5, end_time_unix_nano=9)
    span.attributes.extend(
        [
            _kv("starttrace.phase", string_value="import"),
            _kv("n", int_value=1 << 40),
            _kv("neg", int_value=-7),
            _kv("f", double_value=2.5),
            _kv("b", bool_value=True),
            _kv("dup", string_value="first"),
            _kv("dup", string_value="last"),  # a repeated key: the last one wins
            _kv("long", string_value="é" * 300),  # a two-byte length prefix
        ]
    )
    arr = span.attributes.add(key="arr")
    arr.value.array_value.values.extend([AnyValue(int_value=1), AnyValue(string_value="two")])
    kv = span.attributes.add(key="kv")
    kv.value.kvlist_value.values.extend([_kv(nested_key, string_value="nested")])  # the same key, nested
    event = span.events.add(name="exception")
    event.attributes.extend([_kv("only.event", string_value="not the span's"), _kv("n", int_value=3)])
    return span.SerializeToString()


@pytest.mark.parametrize("first", (*KEYS, "long"))
def test_protobuf_any_first_access(first: str) -> None:
    raw = _span_bytes()
    full = span_attrs(raw)
    lazy = LazyAttrs(raw, span_attrs)
    assert lazy.get(first, "default") == full.get(first, "default")
    for key in KEYS:
        assert lazy.get(key, "default") == full.get(key, "default"), key
    assert lazy == full and dict(lazy) == full and {**lazy} == full and len(lazy) == len(full)
    assert full["dup"] == "last" and "only.event" not in full and full["n"] == 1 << 40


def test_scalar_reads_need_no_decode() -> None:
    lazy = LazyAttrs(_span_bytes(nested_key="inner"), span_attrs)
    assert lazy.get("starttrace.phase") == "import" and lazy.get("neg") == -7 and lazy.get("f") == 2.5
    assert lazy.get("b") is True and lazy.get("absent") is None and "absent" not in lazy
    assert not lazy.decoded
    assert lazy.get("dup") == "last" and lazy.decoded  # a repeated key decodes the whole list
    nested = LazyAttrs(_span_bytes(), span_attrs)
    assert nested.get("starttrace.phase") == "import" and nested.decoded  # seen twice: decoded, to be sure


def test_a_key_only_in_an_event_is_not_the_spans() -> None:
    lazy = LazyAttrs(_span_bytes(), span_attrs)
    assert lazy.get("only.event") is None
    assert lazy.get("n") == 1 << 40


def test_json_text_and_dict_behaviour() -> None:
    text = json.dumps({"starttrace.phase": "import", "x": [1, 2]})
    lazy = lazy_attrs(text)
    assert isinstance(lazy, LazyAttrs) and lazy.get("nope") is None and not lazy.decoded
    assert lazy.get("x") == [1, 2] and lazy == decode_attrs(text)
    assert lazy_attrs(None) == {} and lazy_attrs(b"") == {}
    raw = lazy_attrs(_span_bytes())
    assert json.dumps(raw) == "{}", "the documented trap: json.dumps of an unread LazyAttrs"
    assert json.loads(json.dumps(dict(raw))) == json.loads(json.dumps(span_attrs(_span_bytes())))
    assert copy.deepcopy(raw) == raw and pickle.loads(pickle.dumps(raw)) == raw
    assert sorted(raw) == sorted(span_attrs(_span_bytes()))
    raw["extra"] = 1
    assert raw.pop("extra") == 1 and "extra" not in raw
    assert raw.copy() == span_attrs(_span_bytes()) and type(raw.copy()) is dict
    assert bool(LazyAttrs(Span(name="bare").SerializeToString(), span_attrs)) is False
