"""Fleet facts: what one run contributes to fleet questions, and the fleet answer over many runs.

`run_facts(run, model)` derives a run's facts once (pure): time to ready, each phase's seconds (the
slowest process), per role too, the findings' seconds, the run's identity (service, version,
vLLM model and TP/PP/DP, nodes, hosts, image), its start kind and fingerprint (start_kind.py).
`fleet_answer(rows, by)` answers `GET /fleet` from facts rows: groups (and within each, its start
kinds), the slowest runs, regressions like with like (per start kind) and the change of the kinds'
`mix`; over ClickHouse the groups come from SQL, and both go through `regressions` and `answer` so
the two give one shape (docs/fleet.md). Quantiles interpolate linearly, as ClickHouse's do.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import polars as pl

from starttrace.analysis.model import STRUCTURAL_PHASES, RunModel
from starttrace.analysis.start_kind import KIND_KEYS, fingerprint, kind_label, kind_of, start_kind
from starttrace.run import Run

FACTS_VERSION = 2  # 2: kind, fingerprint, time_to_first_token_s. Bump on a change: stores re-derive older rows
# a busy loop (vLLM's worker and engine-core loops) runs on after ready: not a phase of the start
# (its share before ready is `wait` in the breakdown, analysis/breakdown.py)
BUSY_LOOP = "idle"
QUANTILES = (0.5, 0.95)
SLOWEST = 10
REGRESSION_MIN_S = 0.01  # a p50 that grew less than this is noise, not a regression
REGRESSION_MIN_SHARE = 0.03  # nor one that grew less than this share of its value before
MIX_MIN_SHARE = 0.05  # a kind's share that changed less than this between groups is not reported

# what `by` may name beside the identity keys themselves
ALIASES = {
    "service": "service.name",
    "version": "service.version",
    "model": "vllm.model",
    "tp": "vllm.tensor_parallel_size",
    "pp": "vllm.pipeline_parallel_size",
    "dp": "vllm.data_parallel_size",
    "host": "host.name",
    "node": "host.name",
    "image": "container.image",
}
# identity keys read from the processes' resources (the root process first)
RESOURCE_KEYS = ("service.name", "service.version", "host.name", "container.image.name", "container.image.tag")
# identity keys read from span attributes (vLLM's config, probes/vllm.py)
SPAN_KEYS = (
    "vllm.model",
    "vllm.tensor_parallel_size",
    "vllm.pipeline_parallel_size",
    "vllm.data_parallel_size",
)


def by_key(by: str) -> str:
    """The identity key `by` names (`tp` -> `vllm.tensor_parallel_size`)."""
    return ALIASES.get(by, by)


def _identity(run: Run, model: RunModel) -> dict[str, str]:
    out: dict[str, str] = {}
    processes = sorted(run.processes, key=lambda p: p.resource.get("starttrace.start_method") != "root")
    for key in RESOURCE_KEYS:
        value = next((p.resource.get(key) for p in processes if p.resource.get(key) not in (None, "")), None)
        if value is not None:
            out[key] = str(value)
    if model.service:
        out["service.name"] = model.service
    hosts = sorted({p.host for p in run.processes if p.host})
    out["hosts"] = ",".join(hosts)
    out["nodes"] = str(max(1, len(hosts)))
    image = out.get("container.image.name")
    if image:
        tag = out.get("container.image.tag")
        out["container.image"] = f"{image}:{tag}" if tag else image
    out.update(_span_identity(run))
    for key in SPAN_KEYS:  # foreign exporters put vLLM's config on the resource
        if key not in out:
            value = next((p.resource.get(key) for p in processes if p.resource.get(key) not in (None, "")), None)
            if value is not None:
                out[key] = str(value)
    return out


def _span_identity(run: Run) -> dict[str, str]:
    """vLLM's config attributes, from the few spans that carry them (decoded only there)."""
    from starttrace.run import decode_attrs

    spans = run.spans
    if spans.height == 0:
        return {}
    marker = SPAN_KEYS[0]
    rows = spans.filter(
        pl.col("attrs").str.contains(marker, literal=True).fill_null(False)
        | pl.col("attrs_pb").bin.contains(marker.encode()).fill_null(False)
    ).select("attrs", "attrs_pb")
    out: dict[str, str] = {}
    for text, raw in rows.iter_rows():
        attrs = decode_attrs(text, raw)
        for key in SPAN_KEYS:
            if key not in out and attrs.get(key) not in (None, ""):
                out[key] = str(attrs[key])
    return out


def run_facts(run: Run, model: RunModel) -> dict[str, Any]:
    """The run's facts (one row of `starttrace_runs`)."""
    phases: dict[str, float] = {}
    role_phases: dict[str, float] = {}
    for lane in model.lanes:
        if lane.after_ready:
            continue
        for phase, ns in lane.phases.items():
            if phase in STRUCTURAL_PHASES or phase == BUSY_LOOP:
                continue
            secs = ns / 1e9
            phases[phase] = max(phases.get(phase, 0.0), secs)
            key = f"{lane.role or 'process'}/{phase}"
            role_phases[key] = max(role_phases.get(key, 0.0), secs)
    findings: dict[str, float] = {}
    for f in model.findings:
        kind = str(f.get("kind"))
        secs = f.get("seconds")
        findings[kind] = findings.get(kind, 0.0) + (float(secs) if isinstance(secs, (int, float)) else 0.0)
    ttr = None if model.ready_ns is None else max(0, model.ready_ns - model.t0) / 1e9
    kind = start_kind(run, model)
    identity = _identity(run, model)
    identity.update({f"kind.{k}": v for k, v in kind.items()})  # `by=kind.compile_cache` on every store
    return {
        "run_id": model.run_id,
        "trace_id": model.trace_id or run.trace_id or "",
        "service": model.service or "",
        "start_ns": int(model.t0),
        "status": model.status,
        "time_to_ready_s": None if ttr is None else round(ttr, 6),
        "time_to_first_token_s": model.time_to_first_token_s,  # None: the run served no request
        "startup_s": round(model.startup_s, 6),
        "phases": {k: round(v, 6) for k, v in phases.items()},
        "role_phases": {k: round(v, 6) for k, v in role_phases.items()},
        "findings": {k: round(v, 6) for k, v in findings.items()},
        "identity": identity,
        "kind": kind,
        "fingerprint": fingerprint(run, model),
        "processes": len(model.lanes),
        "spans": run.span_count(),
        "version": run.version,
        "facts_version": FACTS_VERSION,
    }


# ---------------------------------------------------------------------------------------------
# the fleet answer


def _q(values: pl.Series) -> dict[str, float | None]:
    values = values.drop_nulls()
    if values.len() == 0:
        return {"p50": None, "p95": None}
    return {f"p{round(q * 100)}": round(float(values.quantile(q, "linear")), 6) for q in QUANTILES}  # type: ignore[arg-type]


def _group_stats(members: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs, time to ready's, time to first token's and each phase's quantiles of some facts rows."""
    ttr = pl.Series([m["time_to_ready_s"] for m in members], dtype=pl.Float64())
    phase_names = sorted({p for m in members for p in m["phases"]})
    phases = {p: _q(pl.Series([m["phases"].get(p) for m in members], dtype=pl.Float64())) for p in phase_names}
    ttft = pl.Series([m.get("time_to_first_token_s") for m in members], dtype=pl.Float64())
    return {"runs": len(members), "time_to_ready_s": _q(ttr), "time_to_first_token_s": _q(ttft), "phases": phases}


def _kinds(members: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The group's start kinds, most runs first: each with its share of the group and its quantiles."""
    by_kind: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for m in members:
        by_kind.setdefault(tuple(kind_of(m).values()), []).append(m)
    out = []
    for values, part in by_kind.items():
        kind = dict(zip(KIND_KEYS, values, strict=True))
        stats = _group_stats(part)
        out.append({"kind": kind, "label": kind_label(kind), "share": round(len(part) / len(members), 6), **stats})
    out.sort(key=lambda k: (-k["runs"], k["label"]))
    return out


def group_value(facts: dict[str, Any], key: str) -> str:
    """A facts row's value of `key`: an identity key, `kind.<key>` or `fingerprint.<key>`."""
    if key.startswith("kind.") and key[5:] in KIND_KEYS:
        return kind_of(facts)[key[5:]]
    if key.startswith("fingerprint."):
        return str((facts.get("fingerprint") or {}).get(key[12:], ""))
    return str(facts["identity"].get(key, ""))


def fleet_answer(rows: Iterable[dict[str, Any]], by: str, slowest: int = SLOWEST) -> dict[str, Any]:
    """The fleet answer from facts rows (as `run_facts` gives them), grouped by identity key `by`."""
    key = by_key(by)
    facts = list(rows)
    grouped: dict[str, list[dict[str, Any]]] = {}
    for f in facts:
        grouped.setdefault(group_value(f, key), []).append(f)
    groups = [
        {
            "value": value,
            "first_ns": min(int(m["start_ns"]) for m in members),
            **_group_stats(members),
            "kinds": _kinds(members),
        }
        for value, members in grouped.items()
    ]
    ranked = sorted(
        (f for f in facts if f["time_to_ready_s"] is not None), key=lambda f: f["time_to_ready_s"], reverse=True
    )
    top = [
        {
            "run_id": f["run_id"],
            "service": f["service"],
            "value": group_value(f, key),
            "time_to_ready_s": f["time_to_ready_s"],
            "start_ns": int(f["start_ns"]),
            "kind": kind_of(f),
        }
        for f in ranked[:slowest]
    ]
    return answer(by, key, groups, top, len(facts))


def _ordered(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((g for g in groups if g["value"]), key=lambda g: (g["first_ns"], g["value"]))


def regressions(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Phases whose p50 grew from one version to the next (versions in first-seen order), like with
    like: within each start kind both versions have (`kind`). Groups without kinds (over ClickHouse's
    SQL groups) compare as one kind, `{}`."""
    out = []
    for before, after in itertools.pairwise(_ordered(groups)):
        kinds_before = {k["label"]: k for k in before.get("kinds", [])} or {"": {"kind": {}, **before}}
        kinds_after = {k["label"]: k for k in after.get("kinds", [])} or {"": {"kind": {}, **after}}
        for label, old_kind in kinds_before.items():
            new_kind = kinds_after.get(label)
            if new_kind is None:
                continue
            for phase, q in new_kind["phases"].items():
                old = old_kind["phases"].get(phase, {}).get("p50")
                new = q.get("p50")
                if old is None or new is None:
                    continue
                delta = new - old
                if delta >= max(REGRESSION_MIN_S, REGRESSION_MIN_SHARE * old):
                    out.append(
                        {
                            "phase": phase,
                            "from": before["value"],
                            "to": after["value"],
                            "kind": new_kind["kind"],
                            "p50_delta_s": round(delta, 6),
                            "from_p50_s": old,
                            "to_p50_s": new,
                            "runs_from": old_kind.get("runs"),
                            "runs_to": new_kind.get("runs"),
                        }
                    )
    out.sort(key=lambda r: (-r["p50_delta_s"], r["phase"], kind_label(r["kind"])))
    return out


def mix(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start-kind shares that changed from one version to the next by MIX_MIN_SHARE or more: per kind
    key and value (`compile_cache` = `cold`), its share of the runs before and after."""
    out = []
    for before, after in itertools.pairwise(_ordered(groups)):
        if not before.get("kinds") or not after.get("kinds"):
            continue
        for key in KIND_KEYS:
            share_before = _shares(before["kinds"], key)
            share_after = _shares(after["kinds"], key)
            for value in sorted(set(share_before) | set(share_after)):
                a, b = share_before.get(value, 0.0), share_after.get(value, 0.0)
                if abs(b - a) >= MIX_MIN_SHARE:
                    out.append(
                        {
                            "from": before["value"],
                            "to": after["value"],
                            "key": key,
                            "value": value,
                            "share_from": round(a, 6),
                            "share_to": round(b, 6),
                        }
                    )
    out.sort(key=lambda m: (-abs(m["share_to"] - m["share_from"]), m["key"], m["value"]))
    return out


def _shares(kinds: list[dict[str, Any]], key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in kinds:
        value = k["kind"].get(key, "unknown")
        out[value] = out.get(value, 0.0) + k["share"]
    return out


def answer(by: str, key: str, groups: list[dict[str, Any]], slowest: list[dict[str, Any]], runs: int) -> dict[str, Any]:
    """The answer's shape, whichever store computed the groups."""
    if key == "service.version":
        groups = sorted(groups, key=lambda g: (g["first_ns"], g["value"]))
    else:
        groups = sorted(groups, key=lambda g: (-g["runs"], g["value"]))
    for row in slowest:
        row["url"] = f"/startup/{quote(str(row['run_id']), safe='')}"
    ordered = key == "service.version"
    return {
        "by": by,
        "key": key,
        "runs": runs,
        "groups": groups,
        "slowest": slowest,
        "regressions": regressions(groups) if ordered else [],
        "mix": mix(groups) if ordered else [],
    }
