#!/usr/bin/env bash
# The tracer on the other Python versions users run (3.11 is .venv's: the whole suite runs there).
# Per version: a venv (build/pythons/X.Y) with starttrace installed as a user installs it,
# `pip install .` (a wheel, not editable; the C core of the hot path built), then the hot-path and
# process-tree tests against that install: switch, journal, crash safety, descriptor safety, the C
# core vs the Python code, zero footprint and ground truth (-X importtime, sys.modules), the
# spawn/fork/forkserver/subprocess tree, Python 3.14's forkserver default, the wheel. Then again
# with STARTTRACE_PURE_PYTHON=1 (those that do not choose the hot path themselves).
# A version the machine lacks is skipped, and said so. Called by scripts/test.sh.
#   scripts/test_pythons.sh [X.Y ...] [-- pytest args]      default: 3.12 3.13
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
VERSIONS=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    *) VERSIONS+=("$1"); shift ;;
  esac
done
[ "${#VERSIONS[@]}" -gt 0 ] || VERSIONS=(3.12 3.13)
PYTEST_ARGS=("$@")

TESTS=(
  tests/unit/test_switch.py
  tests/unit/test_journal.py
  tests/unit/test_journal_format.py
  tests/unit/test_launchers.py
  tests/integration/test_crash.py
  tests/integration/test_journal_descriptors.py
  tests/integration/test_hotpath.py
  tests/integration/test_light_activation.py
  tests/integration/test_concurrency.py
  tests/integration/test_footprint.py
  tests/integration/test_tree.py
  tests/integration/test_default_forkserver.py
  tests/integration/test_wheel.py
)
# with STARTTRACE_PURE_PYTHON=1: the tests that trace and do not pick the hot path themselves
# (test_hotpath, test_journal_descriptors and test_wheel run both ways already)
PURE_TESTS=(
  tests/unit/test_switch.py
  tests/unit/test_journal.py
  tests/integration/test_crash.py
  tests/integration/test_footprint.py
  tests/integration/test_tree.py
  tests/integration/test_default_forkserver.py
)
# the tools the tests need, with the bounds of pyproject.toml's `test` extra (not all of it:
# the browser, deploy and lint tools stay on .venv)
TOOLS=(pytest pytest-timeout hypothesis httpx hatchling)

find_python() {  # X.Y -> an interpreter of that version, or nothing
  local version="$1" candidate
  local -a candidates=()
  candidate="$(command -v "python$version" 2>/dev/null || true)"
  [ -n "$candidate" ] && candidates+=("$candidate")
  local pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}"
  while IFS= read -r candidate; do
    candidates+=("$candidate")
  done < <(ls -d "$pyenv_root/versions/$version".*/bin/"python$version" 2>/dev/null | sort -V -r)
  candidates+=("/usr/bin/python$version" "/usr/local/bin/python$version")
  for candidate in "${candidates[@]}"; do  # a pyenv shim of a version not selected fails: try the next
    if [ -x "$candidate" ] && [ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$version" ]; then
      echo "$candidate"
      return
    fi
  done
}

tool_requirements() {  # the TOOLS, each as pyproject.toml's test extra bounds it
  "$1" - "${TOOLS[@]}" <<'EOF'
import re, sys, tomllib
with open("pyproject.toml", "rb") as f:
    extra = tomllib.load(f)["project"]["optional-dependencies"]["test"]
bounded = {re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower(): req for req in extra}
print("\n".join(bounded.get(tool, tool) for tool in sys.argv[1:]))
EOF
}

pip_install() {  # venv, requirements...: quiet (this image's pip.conf names index folders it lacks)
  local venv="$1"
  shift
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

status=0
for version in "${VERSIONS[@]}"; do
  python="$(find_python "$version")"
  if [ -z "$python" ]; then
    echo "== Python $version: not on this machine, skipped"
    continue
  fi
  started=$SECONDS
  venv="$REPO/build/pythons/$version"
  echo "== Python $version ($("$python" -c 'import sys; print(sys.version.split()[0])'), $python): venv $venv"
  full="$("$python" -c 'import sys; print(sys.version)')"
  if [ -d "$venv" ] && [ "$("$venv/bin/python" -c 'import sys; print(sys.version)' 2>/dev/null)" != "$full" ]; then
    rm -rf "$venv"  # made by another interpreter of that version (or broken): start again
  fi
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
    pip_install "$venv" -U "pip>=24"
  fi
  mapfile -t tools < <(tool_requirements "$venv/bin/python")
  pip_install "$venv" "${tools[@]}"
  # as a user installs it: a wheel built from the checkout, with its dependencies
  "$venv/bin/python" -m pip uninstall -q -y starttrace 2>/dev/null || true
  pip_install "$venv" "$REPO"
  scratch="$(mktemp -d)"  # run from outside the checkout: nothing may import its starttrace/
  (
    cd "$scratch"
    "$venv/bin/python" - "$REPO" <<'EOF'
import importlib.util, pathlib, sys
import starttrace
where = pathlib.Path(starttrace.__file__).resolve()
checkout = pathlib.Path(sys.argv[1]).resolve() / "starttrace"
assert not where.is_relative_to(checkout), f"starttrace imported from the checkout: {where}"
assert where.is_relative_to(pathlib.Path(sys.prefix).resolve()), f"not the venv's install: {where}"
# the wheel's metadata names this version as supported (pyproject.toml's classifiers)
from importlib.metadata import metadata
version = "%d.%d" % sys.version_info[:2]
assert f"Programming Language :: Python :: {version}" in metadata("starttrace").get_all("Classifier"), version
core = importlib.util.find_spec("starttrace.tracer._hotpath")
print(f"   starttrace {starttrace.__version__} from {where.parent}; C core: {core.origin if core else 'not built'}")
EOF
  )
  run_tests() {  # label, arguments of env..., -- tests...
    local label="$1"
    shift
    local -a env_vars=()
    while [ "$1" != "--" ]; do env_vars+=("$1"); shift; done
    shift
    local -a paths=()
    for test in "$@"; do paths+=("$REPO/$test"); done
    echo "== Python $version, $label: pytest ${*##*/}"
    set +e
    (cd "$scratch" && env "${env_vars[@]}" "$venv/bin/python" -m pytest -p no:cacheprovider \
      --rootdir "$REPO" -c "$REPO/pyproject.toml" "${PYTEST_ARGS[@]}" "${paths[@]}")
    local code=$?
    set -e
    if [ "$code" != 0 ]; then
      echo "== Python $version, $label: FAILED (pytest exit $code)" >&2
      status=1
    fi
  }
  run_tests "C core" -u STARTTRACE_PURE_PYTHON -- "${TESTS[@]}"
  run_tests "STARTTRACE_PURE_PYTHON=1" STARTTRACE_PURE_PYTHON=1 -- "${PURE_TESTS[@]}"
  rm -rf "$scratch"
  echo "== Python $version: $((SECONDS - started)) s"
done
exit "$status"
