"""After migration there is one runtime store: reviewed formulas are published and found by
``search(..., purpose=sql_generation, context with kind=formula)`` (issue: formulas, §12, §16)."""

from __future__ import annotations

import json
from pathlib import Path

from evidence_pipeline.authoring.formulas import import_formulas, import_proposals
from evidence_pipeline.authoring.resolve import resolve
from evidence_pipeline.demo import LEGACY_FORMULAS
from evidence_pipeline.formats.curated_writer import dump_rt
from evidence_pipeline.publishing.publish import activate, preprocess
from evidence_pipeline.validation.validator import validate_workspace
from evidence_runtime.query import EvidenceConstraints, EvidenceSearchContext
from evidence_runtime.search import EvidenceSearcher
from evidence_runtime.units import EvidenceKind
from tests.helpers import VectorStore, commit
from tests.test_formulas import approve, make_ws, proposal, write_artifact


def test_reviewed_formulas_are_published_and_found_with_kind_formula(
        tmp_path: Path, vector_store: VectorStore) -> None:
    ws = make_ws(tmp_path)
    vector_store.seed(ws)  # the shipped vectors hold this corpus's fragments too
    legacy = import_formulas(ws, LEGACY_FORMULAS)
    commit(ws, "import legacy formulas")
    blocked = [e.evidence_id for e in legacy.entries if e.review_codes]
    assert len(blocked) == 2  # the full SELECT and the DELETE
    assert validate_workspace(ws).status.value == "blocked"
    for eid in blocked:  # the curator decides they are not formulas
        resolve(ws, eid, retire=True)
        commit(ws, f"retire {eid}")

    artifact = write_artifact(tmp_path, {"formula_proposals": [proposal()]})
    proposed = import_proposals(ws, [artifact])
    commit(ws, "import a session proposal")
    new_id = proposed.entries[0].evidence_id
    assert validate_workspace(ws).status.value == "blocked"
    approve(ws, new_id)
    assert validate_workspace(ws).status.value == "publishable"

    good = sorted(e.evidence_id for e in legacy.entries if not e.review_codes)
    (ws / "evidence" / "evaluation.yaml").write_text(dump_rt({"queries": [
        {"id": "f1", "text": "Come si calcola l'indice di massa corporea?", "profile": "semantic",
         "purpose": "sql_generation", "expected": [g for g in good if "bmi" in g]},
        {"id": "f2", "text": "fascia pediatrica in base all'età al ricovero",
         "profile": "mixed", "purpose": "sql_generation", "expected": [new_id]},
    ]}), encoding="utf-8")
    commit(ws, "evaluation")
    activate(ws)
    published = preprocess(ws)
    assert published.activated and published.counts["units"] == len(good) + 1

    context = EvidenceSearchContext(constraints=EvidenceConstraints(kinds=(EvidenceKind.formula,)))
    with EvidenceSearcher.for_workspace(ws) as searcher:
        outcome = searcher.search("durata della degenza in giorni", "sql_generation", context)
        assert outcome.available
        assert outcome.results and all(r.kind == "formula" for r in outcome.results)
        assert any("degenza" in r.evidence_id for r in outcome.results[:2])
        pediatric = searcher.search("pazienti pediatrici", "sql_generation", context)
        assert new_id in pediatric.evidence_ids
        # the same store answers without the constraint, other kinds allowed
        free = searcher.search("indice di massa corporea", "sql_generation")
        assert free.available and free.results[0].kind == "formula"
    json.dumps(published.to_json())
