#!/usr/bin/env bash
# The whole test suite, set-up included: scripts/test.sh [pytest args]; then the tracer's tests on the
# other Python versions the machine has (scripts/test_pythons.sh)
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
echo "== the tracer on Python 3.12 and 3.13 (scripts/test_pythons.sh)"
set +e
bash scripts/test_pythons.sh -- -q
versions=$?
set -e
if [ "$code" = 0 ]; then
  code=$versions
fi
exit "$code"
