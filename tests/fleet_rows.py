"""Synthetic fleet facts rows (as `analysis.fleet.run_facts` gives them): tests of the fleet
answer and of the Fleet startup dashboard's SQL."""

from __future__ import annotations

import random
from typing import Any

from starttrace.analysis.fleet import FACTS_VERSION

S = 1_000_000_000


def synthetic_facts(n: int, seed: int = 5) -> list[dict[str, Any]]:
    """Facts rows of `n` runs over three versions; 0.33 loads weights slower."""
    rng = random.Random(seed)
    versions = [("0.31.0", 0), ("0.32.0", 100), ("0.33.0", 200)]
    out = []
    for i in range(n):
        version, day = versions[i % 3]
        load = rng.uniform(8, 12) + (6.0 if version == "0.33.0" else 0.0)
        imp = rng.uniform(4, 6)
        ttr = None if i % 17 == 0 else round(imp + load + rng.uniform(5, 10), 6)
        out.append(
            {
                "run_id": f"run-{i:05d}",
                "trace_id": f"{i:032x}",
                "service": "vllm" if i % 5 else "sglang",
                "start_ns": (1_700_000_000 + day * 86400 + i) * S,
                "status": "ready" if ttr is not None else "exited",
                "time_to_ready_s": ttr,
                "startup_s": ttr or 30.0,
                "phases": {"import": round(imp, 6), "model_load": round(load, 6)},
                "role_phases": {"worker/model_load": round(load, 6)},
                "findings": {"slow_weights": 1.0} if load > 15 else {},
                "identity": {
                    "service.name": "vllm",
                    "service.version": version,
                    "vllm.tensor_parallel_size": str(1 + i % 2),
                    "host.name": f"node{i % 4}",
                },
                "processes": 4,
                "spans": 100,
                "version": 100,
                "facts_version": FACTS_VERSION,
            }
        )
    return out


def held_out_fleet(n: int = 1000, seed: int = 11) -> list[dict[str, Any]]:
    """Facts rows of `n` vLLM starts: 0.32.0 with 20 % cold-compile-cache starts, then 0.33.0 with
    80 %. Within each kind the compile time is the same in both versions (cold ~40 s, warm ~3 s);
    0.33.0's model_load is 5 s slower. The cold share of each version is exact (every fifth run)."""
    rng = random.Random(seed)
    out = []
    half = n // 2
    for i in range(n):
        version = "0.32.0" if i < half else "0.33.0"
        slot = i % 5  # 0.32.0: slot 0 cold (1 in 5); 0.33.0: slots 0-3 cold (4 in 5)
        cold = slot == 0 if version == "0.32.0" else slot < 4
        compile_s = rng.uniform(38, 42) if cold else rng.uniform(2.5, 3.5)
        load = rng.uniform(9, 11) + (5.0 if version == "0.33.0" else 0.0)
        imp = rng.uniform(18, 22)
        ttr = round(imp + compile_s + load + rng.uniform(1, 2), 6)
        kind = {
            "compile_cache": "cold" if cold else "warm",
            "page_cache": "warm",
            "weights_source": "local",
            "weights_fs": "ext4",
            "plan_cache": "none",
        }
        out.append(
            {
                "run_id": f"held-{i:05d}",
                "trace_id": f"{i + 1:032x}",
                "service": "vllm",
                "start_ns": (1_760_000_000 + (0 if version == "0.32.0" else 86400 * 30) + i * 60) * S,
                "status": "ready",
                "time_to_ready_s": ttr,
                "startup_s": ttr,
                "phases": {"import": round(imp, 6), "compile": round(compile_s, 6), "model_load": round(load, 6)},
                "role_phases": {"worker/model_load": round(load, 6), "worker/compile": round(compile_s, 6)},
                "findings": {"cold_compile": round(compile_s, 6)} if cold else {},
                "identity": {
                    "service.name": "vllm",
                    "service.version": version,
                    "vllm.model": "Qwen/Qwen3-0.6B",
                    "vllm.tensor_parallel_size": "2",
                    "host.name": f"node{i % 8}",
                    **{f"kind.{k}": v for k, v in kind.items()},
                },
                "kind": kind,
                "fingerprint": {"software.vllm": version, "config.tp": "2", "hardware.cpu.count": "32"},
                "processes": 5,
                "spans": 4000,
                "version": 1,
                "facts_version": 2,
            }
        )
    return out
