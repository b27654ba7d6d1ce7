#!/usr/bin/env bash
# Set up (virtual environment, CPU torch, test tools, Debian's Chromium) and run every test.
# pytest exits non-zero when a test fails and when no test ran at all. Without Chromium or
# Playwright the browser tests fail, saying what to install; ATTENTION_LAB_SKIP_BROWSER=1
# skips them on purpose.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
.venv/bin/ruff check .  # the linter first ([tool.ruff] in pyproject.toml): a finding fails the run
# Two workers (pytest-xdist), each test file kept on one worker so its module-scoped models and app
# server are loaded once; ATTENTION_LAB_TEST_WORKERS=0 runs everything in this one process.
# --durations: the 20 slowest, since the suite is a time budget (35 min here).
exec .venv/bin/python -m pytest -q -n "${ATTENTION_LAB_TEST_WORKERS:-2}" --dist loadfile --durations=20 "$@"
