#!/usr/bin/env bash
# The Dagster UI on the demo workspace, one command:  bash scripts/ui.sh
# then open http://127.0.0.1:3000 (THT_UI_PORT changes the port).
# Builds the demo workspace (`tht demo init`) as a Git repository under a state directory
# ($THT_UI_STATE, default /tmp/thoth-evidence-ui; rebuilt only when missing), sets THT_WORKSPACE
# to it and DAGSTER_HOME beside it, and runs `dagster dev` (webserver + daemon, so the sensors and
# the nightly schedule run).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/dagster ] || bash scripts/setup.sh

STATE=${THT_UI_STATE:-"${TMPDIR:-/tmp}/thoth-evidence-ui"}
export DAGSTER_HOME="$STATE/dagster-home"
export THT_WORKSPACE="$STATE/demo-workspace"
mkdir -p "$DAGSTER_HOME"
cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"
if [ ! -f "$THT_WORKSPACE/thoth.yaml" ]; then
  .venv/bin/tht demo init "$THT_WORKSPACE"
fi

echo "workspace:   $THT_WORKSPACE"
echo "DAGSTER_HOME: $DAGSTER_HOME"
echo "next: activate the demo's revision (.venv/bin/tht workspace activate \"$THT_WORKSPACE\");"
echo "      the activated_revision_sensor then publishes it, or materialize 'publish' in the UI."
exec .venv/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p "${THT_UI_PORT:-3000}"
