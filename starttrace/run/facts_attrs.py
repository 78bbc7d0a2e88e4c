"""A run's facts (`analysis.fleet.run_facts`) as the attributes of one `starttrace.run` span, and back.

The run's exporter ships its facts in the run's own OTLP trace (views/otlp.py `facts_span`), so a
Collector -> ClickHouse -> Grafana fleet needs no service to derive them (docs/fleet.md). The
flattening is generic, so that fields other code adds to the facts travel without a change here:

- a scalar `key` -> `starttrace.run.<key>` (`run_id` -> `starttrace.run.id`); None is left out and
  named in `starttrace.run.null_fields`, so the facts read back have the field (as None);
- a nested dict `d` -> `starttrace.run.<d>.<key>` per entry, except `phases`, which the issue names
  `starttrace.run.phase.<phase>_s`;
- `starttrace.run.str_fields`: the top-level fields whose values are all strings, so that a reader of
  ClickHouse (where every attribute value is a string) keeps `"2"` a string where the facts had one;
- `starttrace.run.export_seq`: 0 at ready, 1 at exit; the later export supersedes the earlier.

Field names are identifiers (no dot), so `starttrace.run.identity.service.name` splits at its first
dot after the prefix: field `identity`, key `service.name`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SPAN_NAME = "starttrace.run"
PHASE = "facts"  # the span's `starttrace.phase`
PREFIX = "starttrace.run."
ID_KEY = PREFIX + "id"
VERSION_KEY = PREFIX + "facts_version"
STR_FIELDS_KEY = PREFIX + "str_fields"
SEQ_KEY = PREFIX + "export_seq"
NULL_FIELDS_KEY = PREFIX + "null_fields"
_META = frozenset({STR_FIELDS_KEY, SEQ_KEY, NULL_FIELDS_KEY})
# the fields every facts row has (fleet_answer reads them), filled when a span lacks them
_DICT_DEFAULTS = ("phases", "role_phases", "findings", "identity")


def _attr_key(field: str, key: str | None = None) -> str:
    if key is None:
        return ID_KEY if field == "run_id" else PREFIX + field
    if field == "phases":
        return f"{PREFIX}phase.{key}_s"
    return f"{PREFIX}{field}.{key}"


def facts_attributes(facts: Mapping[str, Any], export_seq: int = 0) -> dict[str, Any]:
    """The span attributes of a facts dict (scalars: str, int, float, bool)."""
    out: dict[str, Any] = {}
    str_fields = []
    null_fields = []
    for field, value in facts.items():
        if isinstance(value, Mapping):
            if value and all(isinstance(v, str) for v in value.values()):
                str_fields.append(field)
            for key, item in value.items():
                if item is not None:
                    out[_attr_key(field, str(key))] = item if isinstance(item, (str, int, float, bool)) else str(item)
            if not value:
                out[_attr_key(field)] = "{}"  # an empty dict still travels (a field, not a missing one)
        elif value is not None:
            if isinstance(value, str):
                str_fields.append(field)
            out[_attr_key(field)] = value if isinstance(value, (int, float, bool)) else str(value)
        else:
            null_fields.append(field)
    out[STR_FIELDS_KEY] = ",".join(str_fields)
    out[NULL_FIELDS_KEY] = ",".join(null_fields)
    out[SEQ_KEY] = export_seq
    return out


def _typed(value: Any) -> Any:
    """A value ClickHouse stored as a string (`AsString`), typed back; typed values pass through.
    (No regular expression: this runs for every attribute of every run of a fleet answer.)"""
    if type(value) is not str or not value:
        return value
    if value[0] in _NUMBER_START and "_" not in value:
        try:
            return float(value) if "." in value or "e" in value or "E" in value else int(value)
        except ValueError:
            return value
    if value == "true":
        return True
    if value == "false":
        return False
    return value


_NUMBER_START = frozenset("-0123456789")
# attribute name less the prefix -> (field, key in the field's dict or None for a scalar); names
# repeat across runs
_NAMES: dict[str, tuple[str, str | None] | None] = {}
_META_RESTS = frozenset(m[len(PREFIX) :] for m in _META)


def _name(rest: str) -> tuple[str, str | None] | None:
    got = _NAMES.get(rest, False)
    if got is not False:
        return got  # type: ignore[return-value]
    out: tuple[str, str | None] | None = None
    if rest not in _META_RESTS:
        field, dot, key = rest.partition(".")
        if not dot:
            out = ("run_id" if field == "id" else field, None)
        elif field == "phase" and key.endswith("_s"):
            out = ("phases", key[:-2])
        else:
            out = (field, key)
    if len(_NAMES) < 100_000:
        _NAMES[rest] = out
    return out


def facts_from_attributes(attrs: Mapping[str, Any], prefixed: bool = True) -> dict[str, Any]:
    """The facts dict of a `starttrace.run` span's attributes (typed OTLP values or ClickHouse
    strings); `prefixed=False`: the names come without `starttrace.run.` (ClickHouse strips it)."""
    cut = len(PREFIX)
    str_fields = set(str(attrs.get(STR_FIELDS_KEY if prefixed else STR_FIELDS_KEY[cut:]) or "").split(","))
    out: dict[str, Any] = {}
    for attr, raw in attrs.items():
        if prefixed:
            if not attr.startswith(PREFIX):
                continue
            attr = attr[cut:]
        name = _name(attr)
        if name is None:
            continue
        field, key = name
        value = str(raw) if field in str_fields else _typed(raw)
        if key is None:
            if raw == "{}" and field not in str_fields:
                out.setdefault(field, {})
            else:
                out[field] = value
            continue
        target = out.get(field)
        if type(target) is not dict:
            target = out[field] = {}
        target[key] = value
    for field in _DICT_DEFAULTS:
        out.setdefault(field, {})
    out.setdefault("time_to_ready_s", None)
    for field in str(attrs.get(NULL_FIELDS_KEY if prefixed else NULL_FIELDS_KEY[cut:]) or "").split(","):
        if field:
            out.setdefault(field, None)
    return out
