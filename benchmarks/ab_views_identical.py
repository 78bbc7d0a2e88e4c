"""Do two source trees render the same views? Full JSON, the page's first answer and every lane's
detail of five synthetic runs (16 x 6000 spans; a CUDA-tainted forkserver; a live run with spans in
progress; spawned ranks; 4 nodes with skewed clocks), ingested over the OTLP decoder into a store.

    .venv/bin/python benchmarks/ab_views_identical.py /tmp/base
    # /tmp/base: `git archive <rev> | tar -x -C /tmp/base`

Prints a hash per run and view for each tree and exits 1 if they differ. Spans that start at the
same nanosecond keep their storage order in a lane: compare against a tree that stores spans in
the same order (before store schema 3, a transaction's spans were stored in span-id order).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import hashlib, json, os, sys, tempfile
sys.path.insert(1, sys.argv[1])
from synth_multinode import make_multinode_run
from synth_runs import make_run, protobuf_batches
from starttrace.analysis.clocks import correct_clocks
from starttrace.analysis.lanes import build_model
from starttrace.sources import store as S
from starttrace.sources.otlp import parse_and_decode
from starttrace.views.json import to_json
from starttrace.views.startup_json import first_payload, lane_detail
runs = {
    "16x6000": make_run(ranks=16, imports_per_rank=6000, run_id="16x6000", seed=42),
    "cuda-forkserver": make_run(ranks=4, imports_per_rank=200, run_id="cuda-forkserver", seed=3,
                                cuda_in_forkserver=True),
    "live": make_run(ranks=3, imports_per_rank=300, run_id="live", seed=5, in_progress_rank=1, ready=False),
    "spawn": make_run(ranks=5, imports_per_rank=400, run_id="spawn", seed=7, start_method="spawn"),
    "4-nodes": make_multinode_run(4, 2, 500, run_id="4-nodes", seed=42),
}
out = {}
for name, run in runs.items():
    st = S.Store(os.path.join(tempfile.mkdtemp(), "s.db"))
    for body in protobuf_batches(run, 512):
        st.ingest_now(parse_and_decode(body, "application/x-protobuf").batch)
    model = build_model(correct_clocks(st.load_run(name), owned=True), now_ns=1_800_000_000_000_000_000)
    views = {
        "json": to_json(model),
        "first": first_payload(model),
        "lanes": [lane_detail(model, i, min_us=100) for i in range(len(model.lanes))],
    }
    out[name] = {
        k: hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).hexdigest()[:16]
        for k, v in views.items()
    }
print(json.dumps(out))
"""


def hashes(tree: Path) -> dict[str, dict[str, str]]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree / "tests")],  # each tree its own generators (the same runs)
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, cwd=str(tree), capture_output=True, text=True,
        timeout=900, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    other = Path(sys.argv[1])
    a, b = hashes(other), hashes(ROOT)
    same = True
    for run in a:
        for view in a[run]:
            ok = a[run][view] == b.get(run, {}).get(view)
            same &= ok
            print(f"{run:16} {view:6} {a[run][view]} {b.get(run, {}).get(view)} {'same' if ok else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
