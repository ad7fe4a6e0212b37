#!/usr/bin/env bash
# Set up (if needed) and run the main job on the demo workspace, offline:
#   1. build the demo workspace (a real Git repository) and validate it;
#   2. on a scratch copy, edit one note and add one, prepare (structural backend), show the diff;
#   3. activate the reviewed revision, publish it (preprocess evidence: gate included), search;
#   4. review the scratch copy's pending change: one static HTML page (tht evidence review).
# Every step says how long it took; the first set-up shows the packages installed so far, and
# publishing draws a progress bar while it embeds the fragments (on a terminal).
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO="${1:-demo-workspace}"
SCRATCH="${DEMO}-scratch"
THT="$PWD/.venv/bin/tht"
STARTED=$SECONDS
LAST=$SECONDS
took() { printf '\033[2m   (%ss)\033[0m\n' "$((SECONDS - LAST))"; LAST=$SECONDS; }
step() { [ "$SECONDS" -eq "$STARTED" ] || took; printf '\n\033[1m== %s\033[0m\n' "$*"; }

if [ -x .venv/bin/tht ]; then
  bash scripts/setup.sh
else
  step "setting up .venv: thoth-evidence and its dependencies (first run only, a few minutes)"
  bash scripts/setup.sh &
  SETUP=$!
  while kill -0 "$SETUP" 2>/dev/null; do
    sleep 2
    n=$(find .venv/lib -maxdepth 3 -name '*.dist-info' 2>/dev/null | wc -l)
    if [ -t 1 ]; then
      printf '\r   %s packages installed (%ss)' "$n" "$((SECONDS - LAST))"
    elif [ $(((SECONDS - LAST) % 30)) -lt 2 ]; then
      printf '   %s packages installed (%ss)\n' "$n" "$((SECONDS - LAST))"
    fi
  done
  [ -t 1 ] && printf '\n'
  wait "$SETUP"
fi

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

step "tht evidence review $SCRATCH: the pending change as one HTML page (scratch evaluation, nothing published)"
# the vector cache is keyed by model and text: the published demo's vectors spare the scratch
# copy embedding its unchanged fragments again
mkdir -p "$SCRATCH/.tht" && cp "$DEMO/.tht/vectors.sqlite3" "$SCRATCH/.tht/vectors.sqlite3"
"$THT" evidence review "$SCRATCH"
echo "open the page above in a browser (or add --open to the review)"
took
printf '\n\033[1mdemo finished in %dm%02ds\033[0m\n' "$(((SECONDS - STARTED) / 60))" "$(((SECONDS - STARTED) % 60))"
