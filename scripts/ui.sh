#!/usr/bin/env bash
# The Dagster UI on the demo workspace, one command:  bash scripts/ui.sh
# then open http://127.0.0.1:3000 (THT_UI_PORT changes the port); Ctrl-C stops it.
# Builds the demo workspace (`tht demo init`) as a Git repository under a state directory
# ($THT_UI_STATE, default /tmp/thoth-evidence-ui; rebuilt only when missing), sets THT_WORKSPACE
# to it and DAGSTER_HOME beside it, and runs `dagster dev` (webserver + daemon, so the sensors and
# the nightly schedule run) in a process group of its own.
#
# Ctrl-C (or SIGTERM) asks Dagster to stop and gives it THT_UI_STOP_S seconds (default 10):
# `dagster dev` alone waits up to 60 s for a webserver that an open browser tab keeps busy, and
# then kills it, leaving its code server behind. After that time the webserver is interrupted
# again (uvicorn's forced exit), then whatever is left of the group is terminated, then killed.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
[ -x .venv/bin/dagster ] || bash scripts/setup.sh

STATE=${THT_UI_STATE:-"${TMPDIR:-/tmp}/thoth-evidence-ui"}
STOP_S=${THT_UI_STOP_S:-10}
export DAGSTER_HOME="$STATE/dagster-home"
export THT_WORKSPACE="$STATE/demo-workspace"
mkdir -p "$DAGSTER_HOME/.nux"
cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"
# Dagster's "join the community" dialog opens over the graph until this flag is in DAGSTER_HOME
printf 'seen: 1\n' > "$DAGSTER_HOME/.nux/nux.yaml"
# `dagster dev` says it is superseded by `dg dev` (dagster-dg-cli, not a dependency here) with a
# FutureWarning on every start: noise for this script
export PYTHONWARNINGS="ignore::FutureWarning${PYTHONWARNINGS:+,$PYTHONWARNINGS}"
if [ ! -f "$THT_WORKSPACE/thoth.yaml" ]; then
  .venv/bin/tht demo init "$THT_WORKSPACE"
fi

echo "workspace:   $THT_WORKSPACE"
echo "DAGSTER_HOME: $DAGSTER_HOME"
echo "next: activate the demo's revision (the 'activate' job in the UI, or"
echo "      .venv/bin/tht workspace activate \"$THT_WORKSPACE\"); the activated_revision_sensor"
echo "      then publishes it, or materialize 'publish' in the UI. Ctrl-C stops the UI."

# not from the repository: Dagster warns about a dagster.yaml in the working directory that
# DAGSTER_HOME overrides
cd "$STATE"
set -m  # the job below gets a process group of its own: Ctrl-C reaches this script only
"$REPO/.venv/bin/dagster" dev -w "$REPO/workspace.yaml" -h 127.0.0.1 -p "${THT_UI_PORT:-3000}" &
GROUP=$!
set +m

# Ctrl-C interrupts the wait below; the shutdown runs outside the trap, where bash still reaps
stopping=
trap 'stopping=1' INT TERM
status=0
wait "$GROUP" || status=$?
[ -n "$stopping" ] || exit "$status"  # dagster dev ended by itself
trap 'stopping=again' INT TERM  # a second Ctrl-C: no more waiting
echo "stopping Dagster (at most ${STOP_S} s)…" >&2
kill -INT -- "-$GROUP" 2>/dev/null || true
deadline=$((SECONDS + STOP_S))
while kill -0 "$GROUP" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ] \
    && [ "$stopping" != again ]; do
  sleep 0.2
done
if kill -0 "$GROUP" 2>/dev/null; then
  echo "Dagster did not stop; stopping what is left of it" >&2
  kill -INT -- "-$GROUP" 2>/dev/null || true  # a second interrupt: uvicorn's forced exit
  sleep 2
fi
# what is left of the group: a code server dagster dev left behind, or a stuck process
if kill -TERM -- "-$GROUP" 2>/dev/null; then
  sleep 1
  kill -KILL -- "-$GROUP" 2>/dev/null || true
fi
wait 2>/dev/null || true
echo "Dagster stopped" >&2
