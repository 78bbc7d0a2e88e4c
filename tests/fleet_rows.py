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
