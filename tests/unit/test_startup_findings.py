"""The findings on startup beyond imports: `cold_compile`, `slow_weights`, `graph_capture` and
`kv_profile`, each from the run's own spans, each with an action, none where the run shows no
cost; and `compare`'s check of a cold-compile finding against a warm run."""

from __future__ import annotations

from typing import Any

from finding_runs import Builder

from starttrace.analysis.compare import compare
from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import RunModel

CACHE = "/cache/vllm/torch_compile_cache/abc"


def _attrs(p: Any, **attrs: Any) -> None:
    """Attributes without the `starttrace.` prefix the builder adds, on the last span."""
    p.spans[-1].attrs.update(attrs)


def _server(
    cache: str, scale: float = 1.0, gbps: float = 0.2, fs: str = "nfs4", sizes: int = 4, page_cache: float = 0.0
) -> RunModel:
    """An API server and two workers that load weights (`page_cache`: the share of their pages in the
    page cache at open), compile, profile memory and capture graphs."""
    b = Builder(["/venv/bin/vllm", "serve", "m"])
    api = b.proc(100, 1, "api_server", "root", None, 0, 60_000)
    init = b.span(api, "vllm.async_llm.init", 10, 50_000, phase="engine_init")
    for r in range(2):
        w = b.proc(110 + r, 100, "worker", "spawn", init, 100, 60_000, rank=r, world_size=2)
        load = b.span(w, "vllm.model_load", 1_000, 20_000, phase="model_load")
        t = 1_000.0
        for k in range(2):
            size = 2_000_000_000
            dur = size / (gbps * (1 + r) * 1e9) * 1000  # ms; rank 1 reads twice as fast
            b.span(w, "weights.load", t, t + dur, load, phase="model_load")
            _attrs(
                w,
                **{
                    "starttrace.weights.file": f"/models/m/model-0000{k + 1}.safetensors",
                    "starttrace.weights.file_bytes": size,
                    "starttrace.weights.fs_type": fs,
                    "starttrace.weights.page_cache_fraction": page_cache,
                },
            )
            t += dur
        loop = b.span(w, "vllm.worker.busy_loop", 21_000, 60_000, phase="idle")
        profile = b.span(w, "vllm.kv_cache.profile", 21_100, 40_000, loop, phase="kv_cache")
        _attrs(w, **{"vllm.kv_cache.available_bytes": 8 * 2**30})
        t = 21_200.0
        for g in range(3):
            graph = b.span(w, "compile.graph", t, t + 5_000 * scale, profile, phase="compile")
            _attrs(
                w,
                **{
                    "starttrace.compile.cache": "miss" if cache == "cold" else "hit",
                    "starttrace.compile.cache_dir": CACHE,
                    "starttrace.compile.id": f"{g}/0",
                },
            )
            if cache == "cold":  # Inductor's compile, nested as PyTorch nests it
                aot = b.span(w, "compile.create_aot_dispatcher_function", t + 500, t + 4_950, graph, phase="compile")
                b.span(w, "compile.inductor_compile", t + 1_000 * scale, t + 4_900 * scale, aot, phase="compile")
            t += 5_000 * scale + 10
        capture = b.span(w, "Capture model", 41_000, 41_000 + 1_000 * sizes, loop, phase="cuda_graphs")
        for k in range(sizes):
            b.span(w, "cuda_graphs.capture", 41_000 + 1_000 * k, 41_900 + 1_000 * k, capture, phase="cuda_graphs")
            _attrs(
                w,
                **{"starttrace.cuda_graphs.batch_size": 2**k, "starttrace.cuda_graphs.memory_bytes": 64 * 2**20},
            )
    b.span(api, "uvicorn.startup", 50_000, 50_100, phase="server_startup")
    return build_model(b.build(ready_at=50_200))


def _one(m: RunModel, kind: str) -> dict[str, Any]:
    found = [f for f in m.findings if f["kind"] == kind]
    assert len(found) == 1, [f["kind"] for f in m.findings]
    assert found[0]["action"], "every finding says what to do"
    return found[0]


def test_a_cold_compile_names_the_cache_and_what_a_warm_one_saves() -> None:
    m = _server("cold")
    f = _one(m, "cold_compile")
    assert f["cache_misses"] == 6 and f["graphs"] == 6
    assert f["cache_dirs"] == [CACHE] and CACHE in f["text"] and CACHE in f["action"]
    assert "VLLM_CACHE_ROOT" in f["action"]
    # per rank: the exclusive compile time (3 graphs of 5 s)
    assert f["compile_s_per_rank"] == {"110": 15.0, "111": 15.0}
    assert f["seconds"] == 15.0
    assert f["predicted_saving_s"] == 11.7  # per rank: Inductor's compile in the 3 graphs that missed


def test_a_warm_start_has_no_cold_compile_and_compare_checks_the_prediction() -> None:
    cold, warm = _server("cold"), _server("warm", scale=0.2)
    assert not [f for f in warm.findings if f["kind"] == "cold_compile"]
    cmp = compare(cold, warm)
    (check,) = cmp.compile_checks
    assert check["misses_a"] == 6 and check["misses_b"] == 0
    assert check["compile_s"]["a"] == 15.0 and check["compile_s"]["b"] == 3.0
    assert check["realised_saving_s"] == 12.0
    assert check["predicted_saving_s"] == 11.7
    assert abs(sum(row["a"] for row in cmp.ready_by_phase) - cold.startup_s) < 1e-3
    assert abs(sum(row["b"] for row in cmp.ready_by_phase) - warm.startup_s) < 1e-3
    phases = {row["phase"]: row for row in cmp.phases}  # the processes' exclusive breakdowns, summed
    assert phases["compile"]["a"] == 30.0 and phases["compile"]["b"] == 6.0 and phases["compile"]["delta"] == -24.0


def test_slow_weights_name_the_filesystem_and_the_rates() -> None:
    m = _server("warm")
    f = _one(m, "slow_weights")
    assert f["fs_types"] == ["nfs4"]
    assert f["gbps_per_rank"] == {"110": 0.2, "111": 0.4}
    assert f["files"] == 2 and f["bytes"] == 4_000_000_000
    assert "nfs4" in f["text"] and "0.20 GB/s" in f["text"]
    assert "local disk" in f["action"]
    assert f["seconds"] == 20.0


def test_weights_already_in_the_page_cache_point_at_the_loader() -> None:
    m = _server("warm", gbps=0.5, fs="ext4", page_cache=1.0)
    from starttrace.analysis.findings.weights import slow_weights_findings

    (f,) = slow_weights_findings(m)
    assert f["page_cache_share"] == 1.0
    assert "deserialising" in f["action"]


def test_graph_capture_counts_sizes_and_memory() -> None:
    m = _server("warm", sizes=6)
    f = _one(m, "graph_capture")
    assert f["sizes"] == 6 and f["batch_sizes"] == [1, 2, 4, 8, 16, 32]
    assert f["memory_bytes"] == 6 * 64 * 2**20
    assert f["seconds"] == 6.0
    assert "--cudagraph-capture-sizes" in f["action"]


def test_kv_profile_reports_the_bytes_found() -> None:
    m = _server("cold")
    f = _one(m, "kv_profile")
    # the profile run's own time: 18.9 s of the span minus its 15 s of compile
    assert abs(f["seconds"] - (40_000 - 21_100 - 15_000) / 1000) < 1e-6
    assert f["available_bytes"] == 8 * 2**30
    assert "VLLM_ENABLE_STARTUP_PLAN=1" in f["action"] and str(8 * 2**30) in f["action"]


def test_no_finding_where_the_run_shows_no_cost() -> None:
    b = Builder(["/venv/bin/vllm", "serve", "m"])
    api = b.proc(100, 1, "api_server", "root", None, 0, 2_000)
    w = b.proc(110, 100, "worker", "spawn", None, 10, 2_000, rank=0, world_size=1)
    b.span(w, "weights.load", 100, 110, phase="model_load")
    _attrs(w, **{"starttrace.weights.file": "/m/a.safetensors", "starttrace.weights.file_bytes": 10_000_000})
    b.span(w, "compile.graph", 200, 300, phase="compile")
    _attrs(w, **{"starttrace.compile.cache": "miss"})
    profile = b.span(w, "vllm.kv_cache.profile", 400, 500, phase="kv_cache")
    b.span(w, "cuda_graphs.capture", 410, 420, profile, phase="cuda_graphs")
    b.span(api, "uvicorn.startup", 1_000, 1_010, phase="server_startup")
    m = build_model(b.build(ready_at=1_100))
    kinds = {f["kind"] for f in m.findings}
    assert not kinds & {"cold_compile", "slow_weights", "graph_capture", "kv_profile"}


def _inductor_only(aot_failed: bool) -> RunModel:
    """A worker that compiled one graph into Inductor's default cache; with `aot_failed`, after vLLM
    failed to load its AOT-compiled model (the file was there)."""
    b = Builder(["/venv/bin/vllm", "serve", "m"])
    api = b.proc(100, 1, "api_server", "root", None, 0, 20_000)
    w = b.proc(110, 100, "worker", "spawn", None, 10, 20_000, rank=0, world_size=1)
    if aot_failed:
        b.span(w, "compile.aot_load", 1_000, 1_500, phase="compile")
        _attrs(
            w,
            **{"starttrace.compile.cache": "miss", "starttrace.compile.cache_dir": "/c/torch_compile_cache/h/rank_0_0"},
        )
    b.span(w, "compile.graph", 1_500, 9_500, phase="compile")
    _attrs(w, **{"starttrace.compile.cache": "miss", "starttrace.compile.cache_dir": "/tmp/torchinductor_root"})
    b.span(api, "uvicorn.startup", 10_000, 10_100, phase="server_startup")
    return build_model(b.build(ready_at=10_200))


def test_an_inductor_cache_miss_points_at_torchinductor_cache_dir() -> None:
    f = _one(_inductor_only(aot_failed=False), "cold_compile")
    assert f["cache_dirs"] == ["/tmp/torchinductor_root"]
    assert "TORCHINDUCTOR_CACHE_DIR" in f["action"] and "VLLM_CACHE_ROOT" not in f["action"]
    assert f["aot_load_failures"] == []


def test_a_failed_aot_load_is_named_with_what_to_do() -> None:
    f = _one(_inductor_only(aot_failed=True), "cold_compile")
    assert f["aot_load_failures"] == ["/c/torch_compile_cache/h/rank_0_0"]
    assert "could not load it, and compiled again" in f["text"]
    assert "VLLM_USE_AOT_COMPILE=0" in f["action"]
    assert f["seconds"] == 8.5  # the failed load and the compile after it
