"""``tht evidence suggest`` and the miss reasons behind it (issue 26 item 5): ``not_retrieved``
when neither branch has the expected unit, and a fix per miss as the curator would write it,
written as a patch that is reviewed and applied by hand, never by the command.

The small workspace of test_evaluate (25 units; its evaluation.yaml misses one expected unit
per query, each for another reason) is published once for the module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from evidence_pipeline.demo import create_demo_repo, git
from evidence_pipeline.formats.evalset import EvalQuery, Profile
from evidence_pipeline.publishing import evaluate as evaluate_module
from evidence_pipeline.publishing.content_words import ContentWords
from evidence_pipeline.publishing.evaluate import (
    NotRetrieved,
    PurposeFiltered,
    RankedLow,
    Ranks,
    explain_miss,
)
from evidence_pipeline.publishing.suggest import (
    RecordedEvaluation,
    evaluated_generation,
    revision_units,
    suggestions_path,
)
from evidence_pipeline.publishing.suggestions import suggest_one
from evidence_runtime.search import EvidenceSearcher
from evidence_runtime.units import EvidencePurpose
from evidence_runtime.workspace import load_workspace
from tests.helpers import FAILING_EVALUATION, VectorStore, cli, commit, copy_workspace
from tests.test_evaluate import small_workspace

pytestmark = pytest.mark.usefixtures("own_state")


@dataclass
class Small:
    ws: Path
    revision: str


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, vector_store: VectorStore,
          own_state: None) -> Small:
    ws = small_workspace(tmp_path_factory.mktemp("small") / "ws")
    vector_store.seed(ws)
    revision = commit(ws, "A small workspace")
    assert cli("workspace", "activate", str(ws)).exit_code == 0
    pre = cli("workspace", "preprocess", "evidence", str(ws), "--json")
    assert pre.exit_code == 0, pre.output
    return Small(ws, revision)


@pytest.fixture
def clone(small: Small, tmp_path: Path) -> Path:
    return copy_workspace(small.ws, tmp_path / "ws")


def suggest_json(ws: Path, *args: str) -> dict[str, Any]:
    result = cli("evidence", "suggest", str(ws), "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# --------------------------------------------------------------------------- the CLI


def test_suggest_writes_a_patch_to_review_that_git_applies(clone: Path) -> None:
    result = cli("evidence", "suggest", str(clone))
    assert result.exit_code == 0, result.output
    assert "generation 1 (the newest evaluated one)" in result.stdout
    patch = suggestions_path(load_workspace(clone), 1)
    assert f"patch written, not applied: {patch}" in " ".join(result.stdout.split())
    # never applied by the command itself
    assert git(clone, "status", "--porcelain").strip() == ""
    text = patch.read_text(encoding="utf-8")
    assert "+  - sql_generation\n" in text  # q02: icd10-oms lacked the query's purpose
    assert "a/evidence/curated/" in text

    git(clone, "apply", str(patch))
    icd = next((clone / "evidence" / "curated").rglob("icd10-oms.md")).read_text("utf-8")
    assert "  - sql_generation\n" in icd
    validated = json.loads(cli("evidence", "validate", str(clone), "--json").stdout)
    # the patched units are valid: the one problem is the test's own unknown expected unit
    assert [p["code"] for p in validated["problems"]] == ["evaluation_expected_unknown"]


def test_the_json_document_names_field_values_path_and_text_of_each_fix(clone: Path) -> None:
    doc = suggest_json(clone)
    assert set(doc) == {"generation", "revision", "patch", "misses", "suggestions",
                        "unsuggested"}
    assert (doc["generation"], doc["misses"]) == (1, 4)
    by_query = {s["query"]: s for s in doc["suggestions"]}
    assert by_query["q02"] == {
        "query": "q02", "evidence_id": "evidence:icd10-oms", "reason": "purpose_filtered",
        "field": "purposes", "values": ["sql_generation"],
        "path": "evidence/curated/reference/icd10-oms.md",
        "text": "add purpose sql_generation to evidence:icd10-oms"}
    low = by_query["q04"]  # "Quanto tempo aspetta in media un paziente al pronto soccorso?"
    assert (low["evidence_id"], low["reason"], low["field"]) == (
        "evidence:accessi-day-hospital", "ranked_low", "applies_to.concepts")
    # the question's content words in its order, "quanto", "in", "un", "al" left out
    assert low["values"] == ["tempo", "aspetta", "media", "paziente", "pronto", "soccorso"]
    assert {(u["query"], u["reason"]) for u in doc["unsuggested"]} == {
        ("q01", "not_published"), ("q03", "constraint_filtered")}
    assert Path(doc["patch"]).is_file()


def test_the_default_is_the_newest_evaluated_generation_a_failed_gate_included(
        clone: Path) -> None:
    (clone / "evidence" / "evaluation.yaml").write_text(FAILING_EVALUATION, encoding="utf-8")
    commit(clone, "An evaluation query its unit cannot answer")
    assert cli("workspace", "activate", str(clone)).exit_code == 0
    assert cli("workspace", "preprocess", "evidence", str(clone), "--json").exit_code == 1
    doc = suggest_json(clone)
    assert doc["generation"] == 2
    assert [(s["query"], s["field"], s["values"]) for s in doc["suggestions"]] == [
        ("qx", "purposes", ["sql_generation"])]
    assert Path(doc["patch"]).name == "generation-2.patch"
    assert suggest_json(clone, "--generation", "1")["generation"] == 1


def test_without_an_evaluated_generation_it_says_so(tmp_path: Path) -> None:
    ws = create_demo_repo(tmp_path / "ws")
    result = cli("evidence", "suggest", str(ws))
    assert result.exit_code != 0
    assert "no generation has an evaluation yet" in result.stderr
    unknown = cli("evidence", "suggest", str(ws), "--generation", "7", "--json")
    assert unknown.exit_code != 0
    assert "generation 7 does not exist" in unknown.output


def test_a_unit_in_neither_branch_s_list_is_not_retrieved_and_still_gets_its_fix(
        clone: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # branch lists 3 deep instead of 50: q04's second unit is in neither (25 units here, so at
    # depth 50 dense lists them all)
    monkeypatch.setattr(evaluate_module, "RANK_DEPTH", 3)
    result = cli("evidence", "evaluate", str(clone), "--json")
    assert result.exit_code == 0, result.output
    q04 = next(q for q in json.loads(result.stdout)["queries"] if q["id"] == "q04")
    assert q04["ranks"]["evidence:accessi-day-hospital"] == {"dense": None, "bm25": None,
                                                             "fused": None}
    assert q04["misses"] == {"evidence:accessi-day-hospital": {"reason": "not_retrieved"}}
    text = cli("evidence", "evaluate", str(clone))
    assert ("missed q04 evidence:accessi-day-hospital: not_retrieved (in neither dense nor "
            "bm25 top 3)") in text.stdout

    # the gate records it; suggest reads the recorded report
    commit(clone, "published again", allow_empty=True)
    assert cli("workspace", "activate", str(clone)).exit_code == 0
    assert cli("workspace", "preprocess", "evidence", str(clone)).exit_code == 0
    doc = suggest_json(clone)
    assert doc["generation"] == 2
    fix = next(s for s in doc["suggestions"] if s["query"] == "q04")
    assert (fix["reason"], fix["field"]) == ("not_retrieved", "applies_to.concepts")


# --------------------------------------------------------------------------- the library


def test_a_unit_in_neither_branch_is_not_retrieved_and_in_one_is_ranked_low(
        small: Small) -> None:
    q = EvalQuery(id="q", text="Quanto tempo aspetta in media un paziente al pronto soccorso?",
                  profile=Profile.semantic, purpose=EvidencePurpose.sql_generation,
                  expected=("evidence:accessi-day-hospital",))
    ws = load_workspace(small.ws)
    with EvidenceSearcher.for_workspace(ws) as searcher:
        def why(ranks: Ranks) -> Any:
            return explain_miss(searcher, q, q.expected[0], ranks, generation=1,
                                revision=small.revision)

        assert why(Ranks(dense=None, bm25=None, fused=None)) == NotRetrieved()
        assert why(Ranks(dense=31, bm25=None, fused=None)) == RankedLow(dense=31, bm25=None,
                                                                        fused=None)
    assert NotRetrieved().model_dump() == {"reason": "not_retrieved"}
    assert NotRetrieved().describe() == "in neither dense nor bm25 top 50"


def test_the_concepts_suggested_are_the_question_s_words_the_unit_never_uses(
        small: Small) -> None:
    ws = load_workspace(small.ws)
    units = revision_units(ws, small.ws / "evidence")
    unit = units["evidence:minuti-attesa-ps"]
    words = ContentWords("italian")
    question = "Quanti minuti attendono qui i malati al pronto soccorso prima della visita?"
    fix = suggest_one(question, NotRetrieved(), unit, words, query="q")
    assert fix is not None and fix.field == "applies_to.concepts"
    # stop words (BM25's: "quanti", "della"; the longer list's: "qui") and words the unit
    # uses, even inflected, are left out
    assert "minuti" not in fix.values and "quanti" not in fix.values
    assert "della" not in fix.values and "qui" not in fix.values and "malati" in fix.values
    assert words.stems("qui") and not words.stems("quanti")  # BM25 alone would keep "qui"
    assert fix.path == "evidence/curated/formula/minuti-attesa-ps.md"
    # a question made of the unit's own words has no fix: a ranking matter
    assert suggest_one(unit.unit.title, NotRetrieved(), unit, words, query="q") is None
    purpose = PurposeFiltered(purposes=(EvidencePurpose.rewriting,),
                              purpose=EvidencePurpose.schema_linking)
    fixed = suggest_one(question, purpose, unit, words, query="q")
    assert fixed is not None and (fixed.field, fixed.values) == ("purposes", ("schema_linking",))


def test_a_recorded_report_with_other_search_settings_is_still_read(small: Small) -> None:
    gen, recorded = evaluated_generation(load_workspace(small.ws), None)
    assert gen.evaluation is not None and gen.number == recorded.generation == 1
    # e.g. a later version's fusion settings: suggest reads only the misses and BM25's
    changed = {**gen.evaluation, "search_config": {**gen.evaluation["search_config"],
                                                   "fusion": "dbsf", "rrf_k": None}}
    again = RecordedEvaluation.model_validate(changed)
    assert again.misses() == recorded.misses()
    assert [miss.reason for _, _, miss in again.misses()] == [
        "not_published", "purpose_filtered", "constraint_filtered", "ranked_low"]
