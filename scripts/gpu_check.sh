#!/usr/bin/env bash
# One prepared GPU check (machines with a CUDA GPU; < 8 min; needs only this checkout and a Python
# with CUDA torch). Runs examples/forkserver_ranks.py traced, three times:
#   clean:  --backend nccl --device cuda, one rank per GPU (at most 4): real cuda.init in every
#           rank (no error), cuda.set_device, dist.init over NCCL, a CUDA-clean tree;
#   gloo4:  (only with fewer than 4 GPUs) 4 ranks on the GPUs with gloo and CUDA tensors;
#   dirty:  --cuda-in-preload (CPU tensors, gloo): the worker forkserver initialises CUDA for real
#           while preloading, the audit flags it (starttrace.cuda_before_fork), and the forked
#           ranks' own CUDA init fails ("Cannot re-initialize CUDA in forked subprocess").
# then scripts/gpu/check_runs.py reads the journals and checks all of it.
#
#   scripts/gpu_check.sh                # python3 (or $PYTHON) must import a CUDA torch
#   PYTHON=/opt/venv/bin/python scripts/gpu_check.sh
#
# Results (journals, logs, check report) go to $OUT when set (the device runner's folder), else to
# a temporary folder. Exit status 0 only when every check passed.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then PY="$REPO/.venv/bin/python"; else PY="$(command -v python3)"; fi
fi
RESULTS="${OUT:-$(mktemp -d /tmp/starttrace-gpu-check.XXXXXX)}"
mkdir -p "$RESULTS"
echo "gpu_check: python $PY, results in $RESULTS"

# 1. CUDA torch present? (untraced)
if ! NGPU="$(env -u STARTTRACE -u VLLM_STARTTRACE "$PY" -c '
import torch
assert torch.cuda.is_available(), "torch.cuda.is_available() is False (torch %s, cuda %s)" % (torch.__version__, torch.version.cuda)
print(torch.cuda.device_count())' 2>"$RESULTS/torch-check.err")"; then
    echo "gpu_check: FAILED: no usable CUDA torch in $PY:"; cat "$RESULTS/torch-check.err"; exit 2
fi
echo "gpu_check: $NGPU GPU(s): $(env -u STARTTRACE "$PY" -c 'import torch; print(torch.cuda.get_device_name(0), "torch", torch.__version__, "cuda", torch.version.cuda)')"

# 2. Make this checkout's starttrace active in every process of the tree. An installed starttrace
#    (pip install -e . puts starttrace.pth in site-packages) is used as is; otherwise a
#    sitecustomize on PYTHONPATH runs the same activation line as starttrace.pth (later in
#    interpreter start-up than the .pth would, which only shifts where import recording begins).
BOOT="$RESULTS/boot"
mkdir -p "$BOOT"
if env -u STARTTRACE "$PY" -c '
import glob, os, site, sys, starttrace
want = os.path.realpath(sys.argv[1])
assert os.path.realpath(os.path.dirname(starttrace.__file__)).startswith(want), "another starttrace"
assert any(glob.glob(os.path.join(d, "starttrace.pth")) for d in site.getsitepackages()), "no starttrace.pth"
' "$REPO" 2>/dev/null; then
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check: using the installed starttrace.pth"
else
    cat > "$BOOT/sitecustomize.py" <<'PYEOF'
import os, sys
(os.environ.get("STARTTRACE") or os.environ.get("VLLM_STARTTRACE")) and __import__("starttrace.tracer.activation").tracer.activation.activate()
# run the sitecustomize this one shadows, if any
here = os.path.dirname(os.path.abspath(__file__))
for entry in sys.path:
    candidate = os.path.join(entry, "sitecustomize.py")
    if entry and os.path.abspath(entry) != here and os.path.exists(candidate):
        exec(compile(open(candidate).read(), candidate, "exec"), {"__name__": "sitecustomize", "__file__": candidate})
        break
PYEOF
    export PYTHONPATH="$BOOT:$REPO${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check: activating starttrace through $BOOT/sitecustomize.py"
fi

RANKS=$(( NGPU < 4 ? NGPU : 4 ))
run_tree() {  # name, args...
    local name="$1"; shift
    rm -rf "$RESULTS/$name"; mkdir -p "$RESULTS/$name"
    echo "gpu_check: run $name: forkserver_ranks.py $*"
    env STARTTRACE=1 STARTTRACE_DIR="$RESULTS/$name" PYTHONUNBUFFERED=1 \
        timeout 150 "$PY" "$REPO/examples/forkserver_ranks.py" "$@" >"$RESULTS/$name.log" 2>&1
    local status=$?
    tail -n 8 "$RESULTS/$name.log"
    echo "gpu_check: run $name exit status $status"
    return $status
}

FAILED=0
run_tree clean --ranks "$RANKS" --backend nccl --device cuda || FAILED=1
CHECK_ARGS=(--clean "$RESULTS/clean" --clean-ranks "$RANKS" --clean-backend nccl)
if [ "$RANKS" -lt 4 ]; then
    run_tree gloo4 --ranks 4 --backend gloo --device cuda || FAILED=1
    CHECK_ARGS+=(--gloo4 "$RESULTS/gloo4")
fi
run_tree dirty --ranks 4 --backend gloo --device cpu --cuda-in-preload || FAILED=1
CHECK_ARGS+=(--dirty "$RESULTS/dirty")

env -u STARTTRACE -u VLLM_STARTTRACE "$PY" "$REPO/scripts/gpu/check_runs.py" "${CHECK_ARGS[@]}" \
    --report "$RESULTS/report.txt" || FAILED=1
# journals stay in $RESULTS/<name>/<run_id>/; the device runner only returns files 2 levels down
if [ -n "${OUT:-}" ]; then
    for name in clean gloo4 dirty; do
        [ -d "$RESULTS/$name" ] && tar -C "$RESULTS" -czf "$RESULTS/journals-$name.tgz" "$name" 2>/dev/null
    done
fi
if [ "$FAILED" -ne 0 ]; then echo "gpu_check: FAILED (see $RESULTS)"; exit 1; fi
echo "gpu_check: all checks passed"
