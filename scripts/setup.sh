#!/usr/bin/env bash
# Create .venv (if missing) and install thoth-evidence with its test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
LOG=$(mktemp)
if ! .venv/bin/python -m pip install --quiet -e '.[dev,postgres]' >"$LOG" 2>&1; then
  cat "$LOG" >&2
  echo "setup failed: pip could not install thoth-evidence (log above)" >&2
  rm -f "$LOG"
  exit 1
fi
rm -f "$LOG"
.venv/bin/python -c "import evidence_pipeline.cli, evidence_runtime" >/dev/null
