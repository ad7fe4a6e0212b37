#!/usr/bin/env bash
# Set up (if needed), build the demo workspace as a real Git repository and run the main job on it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DEMO="${1:-demo-workspace}"
THT=.venv/bin/tht
echo "== building the demo workspace in $DEMO (a Git repository)"
$THT demo init "$DEMO" --force
echo "== tht evidence validate $DEMO"
$THT evidence validate "$DEMO"
