"""Span attributes as OTLP carries them (protobuf `KeyValue`s), decoded to plain values: the run
type's codec for the `attrs_pb` cells a source keeps (`run.decode_attrs`), and the OTLP decoder's
(`sources.otlp`)."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def any_value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "double_value":
        return v.double_value
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return None


def kv_attrs(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        kind = v.WhichOneof("value")
        if kind == "string_value":
            out[kv.key] = v.string_value
        elif kind == "int_value":
            out[kv.key] = v.int_value
        else:
            out[kv.key] = any_value(v)
    return out


Field = tuple[str, int, int, int, str]  # name, number, type, label, message type name ("" for scalars)


def message_class(
    file_name: str, package: str, dependencies: list[str], messages: list[tuple[str, list[Field]]]
) -> Any:
    """Define `messages` in the default descriptor pool (once) and return the class of the last one."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(file_name)
    except KeyError:
        fd = descriptor_pb2.FileDescriptorProto(
            name=file_name, package=package, syntax="proto3", dependency=dependencies
        )
        for msg_name, fields in messages:
            m = fd.message_type.add(name=msg_name)
            for fname, number, ftype, label, tname in fields:
                f = m.field.add(name=fname, number=number, type=ftype, label=label)
                if tname:
                    f.type_name = tname
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{messages[-1][0]}"))


def _attrs_only_type() -> Any:
    """A message with only `Span.attributes` (field 9): decodes a stored span's attributes alone."""
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FieldDescriptorProto
    return message_class(
        "starttrace/service/otlp_attrs.proto",
        "starttrace.otlp_attrs",
        ["opentelemetry/proto/common/v1/common.proto"],
        [
            (
                "SpanAttributes",
                [("attributes", 9, fdp.TYPE_MESSAGE, fdp.LABEL_REPEATED, ".opentelemetry.proto.common.v1.KeyValue")],
            )
        ],
    )


_AttrsOnly: Any = None


def span_attrs(raw: bytes) -> dict[str, Any]:
    """The attributes of a span stored as raw OTLP bytes (a repeated key: the last value wins).
    Parsed with a message that declares only `attributes`: the rest of the span is skipped."""
    global _AttrsOnly
    if _AttrsOnly is None:
        _AttrsOnly = _attrs_only_type()
    return kv_attrs(_AttrsOnly.FromString(raw).attributes)
