#!/usr/bin/env bash
# Create .venv (if missing) and install thoth-evidence with its test tools. Idempotent.
#
# The install runs through uv (installed from the registry into the venv): it downloads and
# installs in parallel, a fresh set-up in ~18 s where pip takes ~37 s (2 cores, same packages
# and versions). Like pip, it compiles the bytecode at install time: without it every process
# the tests start compiles Dagster again (the suite took 5 min 17 s instead of 3 min 56 s).
# pip stays the fallback, for a registry uv cannot reach (uv does not read pip.conf) or a uv
# that fails for any other reason: THT_SETUP_PIP=1 goes straight to it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
installed=0
# the registry the environment names for pip is uv's too (pip.conf is pip's alone)
if [ -n "${PIP_INDEX_URL:-}" ] && [ -z "${UV_DEFAULT_INDEX:-}" ]; then
  export UV_DEFAULT_INDEX="$PIP_INDEX_URL"
fi
if [ -n "${PIP_EXTRA_INDEX_URL:-}" ] && [ -z "${UV_INDEX:-}" ]; then
  export UV_INDEX="$PIP_EXTRA_INDEX_URL"
fi
if [ -z "${THT_SETUP_PIP:-}" ]; then
  if { [ -x .venv/bin/uv ] || .venv/bin/python -m pip install --quiet uv >"$LOG" 2>&1; } \
      && UV_HTTP_TIMEOUT="${UV_HTTP_TIMEOUT:-60}" .venv/bin/uv pip install --quiet --compile-bytecode \
         --python .venv/bin/python -e '.[dev,postgres]' >"$LOG" 2>&1; then
    installed=1
  else
    echo "uv could not install thoth-evidence; installing with pip instead ($(tail -n 1 "$LOG"))" >&2
  fi
fi
if [ "$installed" = 0 ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  if ! .venv/bin/python -m pip install --quiet -e '.[dev,postgres]' >"$LOG" 2>&1; then
    cat "$LOG" >&2
    echo "setup failed: pip could not install thoth-evidence (log above)" >&2
    exit 1
  fi
fi
# The editable install leaves this checkout's own modules uncompiled, and where
# PYTHONDONTWRITEBYTECODE is set every process that imports them compiles them again: compile
# them once (1.6 s; only changed files after that). test_prepare, which starts 35 CLI
# processes: 49.3 → 45.8 s of CPU.
.venv/bin/python -m compileall -q -j 0 evidence_runtime evidence_pipeline tests bench
.venv/bin/python -c "import evidence_pipeline.cli, evidence_runtime" >/dev/null
# the command is in the virtual environment, not on PATH: say where (the README's bare `tht`)
echo "tht: $PWD/.venv/bin/tht (not on PATH: run \`source .venv/bin/activate\` for a bare \`tht\`, or call it by this path)"
