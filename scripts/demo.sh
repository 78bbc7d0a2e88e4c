#!/usr/bin/env bash
# The main job, set-up included: a traced real vLLM startup on CPU (TP=2, tiny offline model)
# and its per-rank report. No Jaeger, no Docker: journals under ~/.local/state/starttrace/runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-apt
exec .venv/bin/starttrace demo "$@"
