"""A/B of the service's cold path (store -> run -> model -> JSON) between two checkouts.

    git worktree add /tmp/before <old commit>; git worktree add /tmp/after <new commit>
    for i in 1 2; do for w in before after; do .venv/bin/python benchmarks/ab_model_build.py $w; done; done

`before` is a checkout of the src/ layout (commit 6c93a14 or older), `after` one of the flat layout.
Prints process CPU seconds (not wall: the machine is shared) of loading a 16 x 6000-span synthetic
run from a SQLite store and building its waterfall model, and of rendering its JSON, three times.
"""

import sys
import tempfile
import time
from pathlib import Path

which = sys.argv[1]
base = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(f"/tmp/{which}")
if which == "before":
    sys.path.insert(0, str(base / "src"))
    from starttrace.service.store import Store
    from starttrace.service.synth import make_run, to_protobuf

    from starttrace.analysis.model import build_model, run_input_from_rows, to_json
    from starttrace.service.otlp_receiver import decode
else:
    sys.path.insert(0, str(base))
    sys.path.insert(0, str(base / "tests"))
    from synth_runs import make_run, to_protobuf

    from starttrace.analysis.lanes import build_model
    from starttrace.sources.otlp import decode
    from starttrace.sources.store import Store
    from starttrace.views.json import to_json
import starttrace  # noqa: E402

assert str(base) in starttrace.__file__, starttrace.__file__
run = make_run(ranks=16, imports_per_rank=6000, run_id="bench")
st = Store(Path(tempfile.mkdtemp()) / "s.db")
st.ingest_now(decode(to_protobuf(run).SerializeToString()).batch)
best = []
for _ in range(3):
    t = time.process_time()
    if which == "before":
        m = build_model(run_input_from_rows(st.load_run("bench")))
    else:
        m = build_model(st.load_run("bench"))
    t1 = time.process_time()
    to_json(m)
    t2 = time.process_time()
    best.append((t1 - t, t2 - t1))
print(
    which,
    "spans",
    len(m.spans),
    "load+build CPU s:",
    [round(a, 2) for a, _ in best],
    "to_json CPU s:",
    [round(b, 2) for _, b in best],
)
