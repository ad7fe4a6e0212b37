#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: ruff, pyright, then pytest.
# Where PostgreSQL's server binaries are installed, a throw-away cluster is started so the
# registry tests also run on Postgres (THT_TEST_POSTGRES_URL); it is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/pyright  # strict on evidence_runtime ([tool.pyright] in pyproject.toml)

# The browser test of the Dagster UI needs Debian's Chromium; install it where we can.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing chromium for the UI test (apt-get)…"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
    >/dev/null 2>&1 || echo "chromium could not be installed; the browser test will be skipped"
fi

PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "${THT_TEST_POSTGRES_URL:-}" ] && [ -n "$PGBIN" ] && [ -x "$PGBIN/initdb" ] \
    && [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then
  PGDIR=$(mktemp -d /tmp/tht-pg.XXXXXX)
  chown postgres:postgres "$PGDIR"
  PGPORT=$((20000 + RANDOM % 20000))
  if su postgres -c "$PGBIN/initdb -D $PGDIR/data -A trust -U postgres --no-instructions" >/dev/null \
      && su postgres -c "$PGBIN/pg_ctl -D $PGDIR/data -o '-p $PGPORT -k $PGDIR -c listen_addresses=127.0.0.1' -l $PGDIR/server.log -w start" >/dev/null \
      && su postgres -c "$PGBIN/createdb -h 127.0.0.1 -p $PGPORT tht_test"; then
    export THT_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$PGPORT/tht_test"
    trap 'su postgres -c "$PGBIN/pg_ctl -D $PGDIR/data -m fast -w stop" >/dev/null 2>&1; rm -rf "$PGDIR"' EXIT
    echo "registry tests also run on PostgreSQL ($THT_TEST_POSTGRES_URL)"
  else
    echo "PostgreSQL could not be started; its registry tests will be skipped"
  fi
fi
# One worker per core (pytest-xdist); a test module stays on one worker, so the workspace its
# module fixtures publish is built once. Modules are handed out in collection order, where
# tests/conftest.py puts the slowest first (not xdist's default: most tests first, which left
# the long Dagster UI module, 3 tests, for the end). `-n 0` runs everything in this process.
.venv/bin/python -m pytest -n auto --dist loadfile --no-loadscope-reorder "$@"
