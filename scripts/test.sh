#!/usr/bin/env bash
# The whole test suite, set-up included: scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p artifacts
echo "== ruff"
.venv/bin/ruff check starttrace tests benchmarks examples hatch_build.py
echo "== pytest"
set +e
.venv/bin/python -m pytest -p no:cacheprovider "$@"
code=$?
set -e
if [ "$code" = 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$code"
