"""Deep import chains (issue 38 item 5): one process whose imports nest DEPTH deep, stored by the
service over OTLP, then the model built and each export made, each timed once.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_deep_chains.py 10000 20000

Prints, per depth: seconds to build the model, and to export perfetto / jaeger / otlp-json
(full) and jaeger (summary), through the real app (TestClient)."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from fastapi.testclient import TestClient
from hostile_runs import deep_run
from synth_runs import to_protobuf

from starttrace.service.app import Settings, create_app


def main(depths: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(Settings(db=Path(tmp) / "deep.db", prebuild_idle_s=None))
        with TestClient(app, base_url="http://localhost") as c:
            for depth in depths:
                rid = f"deep-{depth}"
                body = to_protobuf(deep_run(rid, depth)).SerializeToString()
                r = c.post("/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"})
                assert r.status_code == 200, r.text
                row = [f"depth {depth}:"]
                t = time.perf_counter()
                assert c.get(f"/startup/{rid}", headers={"Accept": "application/json"}).status_code == 200
                row.append(f"model+first answer {time.perf_counter() - t:.2f} s")
                for fmt, detail in (
                    ("perfetto", "full"),
                    ("jaeger", "full"),
                    ("otlp-json", "full"),
                    ("jaeger", "summary"),
                ):
                    t = time.perf_counter()
                    r = c.get(f"/runs/{rid}/export?format={fmt}&detail={detail}")
                    assert r.status_code == 200, r.text[:300]
                    row.append(f"{fmt}/{detail} {time.perf_counter() - t:.2f} s")
                print(", ".join(row), flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [10_000, 20_000])
