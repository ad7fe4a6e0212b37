#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: ruff, then pytest with pyright beside it.
# Where PostgreSQL's server binaries are installed, a throw-away cluster is started so the
# registry tests also run on Postgres (THT_TEST_POSTGRES_URL); it is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .

# pyright (strict on evidence_runtime, [tool.pyright] in pyproject.toml) runs on one core while
# the tests start; its report is printed, and its failure fails the run, after them.
PYRIGHT_LOG=$(mktemp /tmp/tht-pyright.XXXXXX)
.venv/bin/pyright >"$PYRIGHT_LOG" 2>&1 &
PYRIGHT_PID=$!

# The browser tests of the Dagster UI need Debian's Chromium; where we can, it is installed in
# the background while the tests run, and those tests wait for the file THT_CHROMIUM_PENDING.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing chromium for the UI tests in the background (apt-get)…"
  CHROMIUM_DIR=$(mktemp -d /tmp/tht-chromium.XXXXXX)
  export THT_CHROMIUM_PENDING="$CHROMIUM_DIR/done"
  ( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
      >"$CHROMIUM_DIR/apt.log" 2>&1 \
      || echo "chromium could not be installed; the browser tests will be skipped" >&2
    touch "$THT_CHROMIUM_PENDING" ) &
fi

PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$PGBIN" ] && command -v initdb >/dev/null 2>&1; then  # e.g. /usr/local/bin
  PGBIN=$(dirname "$(command -v initdb)")
fi
if [ -z "${THT_TEST_POSTGRES_URL:-}" ] && [ -n "$PGBIN" ] && [ -x "$PGBIN/initdb" ] \
    && [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then
  PGDIR=$(mktemp -d /tmp/tht-pg.XXXXXX)
  chown postgres:postgres "$PGDIR"
  PGPORT=$((20000 + RANDOM % 20000))
  if su postgres -c "$PGBIN/initdb -D $PGDIR/data -A trust -U postgres --no-instructions" >/dev/null \
      && su postgres -c "$PGBIN/pg_ctl -D $PGDIR/data -o '-p $PGPORT -k $PGDIR -c listen_addresses=127.0.0.1' -l $PGDIR/server.log -w start" >/dev/null \
      && { if [ -x "$PGBIN/createdb" ]; then su postgres -c "$PGBIN/createdb -h 127.0.0.1 -p $PGPORT tht_test"
           else .venv/bin/python -c "import psycopg, sys; psycopg.connect(sys.argv[1], autocommit=True).execute('CREATE DATABASE tht_test')" \
                  "postgresql://postgres@127.0.0.1:$PGPORT/postgres"; fi; }; then
    export THT_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$PGPORT/tht_test"
    trap 'su postgres -c "$PGBIN/pg_ctl -D $PGDIR/data -m fast -w stop" >/dev/null 2>&1; rm -rf "$PGDIR"' EXIT
    echo "registry tests also run on PostgreSQL ($THT_TEST_POSTGRES_URL)"
  else
    echo "PostgreSQL could not be started; its registry tests will be skipped"
  fi
fi
# One worker per core and one more (pytest-xdist): much of the suite waits on processes it
# started (the CLI, Dagster's webserver, kill trials) or on a lock, and a third worker keeps two
# cores busy meanwhile (2 cores: 4 min 51 s with 2 workers, 3 min 59 s with 3, 4 min 5 s with
# 4). A test module stays on one worker, so the workspace its module fixtures publish is built
# once. Modules are handed out in collection order, where tests/conftest.py puts the slowest
# first (not xdist's default: most tests first, which left the long Dagster UI module, 3
# tests, for the end). `-n 0` after the script's name runs everything in this process.
status=0
.venv/bin/python -m pytest -n "$(( $(nproc) + 1 ))" --dist loadfile --no-loadscope-reorder "$@" \
  || status=$?
pyright_status=0
wait "$PYRIGHT_PID" || pyright_status=$?
echo "pyright:"
cat "$PYRIGHT_LOG"
rm -f "$PYRIGHT_LOG"
if [ "$pyright_status" != 0 ]; then
  echo "pyright failed (exit $pyright_status)" >&2
  [ "$status" != 0 ] || status=$pyright_status
fi
exit "$status"
