#!/usr/bin/env bash
# Set up (first time only) and start the app on http://127.0.0.1:${PORT:-8501}
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/streamlit run app.py --server.port "${PORT:-8501}" "$@"
