#!/usr/bin/env bash
# Set up (if needed) and run the main job on the demo workspace, offline:
#   1. build the demo workspace (a real Git repository) and validate it;
#   2. on a scratch copy, edit one note and add one, prepare (structural backend), show the diff;
#   3. activate the reviewed revision, publish it (preprocess evidence: gate included), search.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DEMO="${1:-demo-workspace}"
SCRATCH="${DEMO}-scratch"
THT="$PWD/.venv/bin/tht"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "building the demo workspace in $DEMO (a Git repository)"
"$THT" demo init "$DEMO" --force
step "tht evidence validate $DEMO"
"$THT" evidence validate "$DEMO"

step "prepare on a scratch copy ($SCRATCH): one note edited, one note added"
"$THT" demo init "$SCRATCH" --force
cat >> "$SCRATCH/evidence/source/10-domini-clinici/paziente.md" <<'NOTE'

## Neonati
Per neonato si intende il paziente con età inferiore a 28 giorni alla data del ricovero.
NOTE
mkdir -p "$SCRATCH/evidence/source/80-note-nuove"
cat > "$SCRATCH/evidence/source/80-note-nuove/codici-esito-ps.md" <<'NOTE'
# Esito dell'accesso in Pronto Soccorso

La colonna clinical.ed_visit.outcome_code registra l'esito dell'accesso.

| codice | significato |
|---|---|
| 1 | dimesso a domicilio |
| 2 | ricoverato |
| 3 | trasferito ad altro istituto |
| 4 | deceduto |
NOTE
git -C "$SCRATCH" add -A && git -C "$SCRATCH" -c user.name=demo -c user.email=demo@thoth.invalid commit -qm "Curator edits: neonati, esiti PS"
"$THT" evidence prepare "$SCRATCH" --backend structural
step "git status of the scratch copy after prepare (nothing committed by prepare)"
git -C "$SCRATCH" status --short
step "tht evidence validate $SCRATCH (any review item blocks publication until a curator resolves it)"
"$THT" evidence validate "$SCRATCH" || true

step "publishing the reviewed demo revision"
"$THT" workspace activate "$DEMO"
"$THT" workspace preprocess evidence "$DEMO"
step "tht evidence evaluate $DEMO"
"$THT" evidence evaluate "$DEMO" | tail -n 3
step "tht evidence search: a question from a workflow stage"
"$THT" evidence search "$DEMO" "Quali pazienti sono minorenni?" --purpose sql_generation --table clinical.patient --limit 3
"$THT" evidence search "$DEMO" "Cosa significa il codice di dimissione T?" --purpose disambiguation --kind enum --limit 2
