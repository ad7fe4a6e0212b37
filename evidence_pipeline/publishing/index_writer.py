"""The publisher's side of the index: creating the Evidence schema, writing and deleting points.

The runtime only reads (``evidence_runtime.index``); these writers extend its two engines.
:meth:`IndexWriter.ensure_schema` makes a collection usable by Evidence without touching the
records of others: it verifies the default dense vector (Cosine), adds the sparse vector
``bm25`` with IDF in place when missing and creates the missing payload indexes. Nothing here
ever rewrites Schema or Memory records; every delete takes a filter.

:meth:`IndexWriter.build_search_index` builds the dense vector index (HNSW) of a large
generation at publication: an embedded shard as written is scanned point by point (23 ms a query
at 100k fragments), its HNSW graph answers in ~1–2 ms but costs a blocking build. The threshold,
:data:`SEARCH_INDEX_MIN_POINTS`, was measured by ``bench/large_generation.py``.

BM25 tokens: on the server, ``qdrant/bm25`` inference with the workspace language (spec §9.3);
in Edge, and with ``QdrantClient(":memory:")``, Edge's ``Bm25`` embedder.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, Self, runtime_checkable

import qdrant_edge as qe

from evidence_runtime.errors import DiskFullError, IndexSchemaError, IndexUnavailableError
from evidence_runtime.index import (
    BM25_MODEL,
    BM25_VECTOR,
    EdgeIndex,
    EvidenceIndex,
    IndexConfig,
    Match,
    ServerIndex,
)
from evidence_runtime.index.base import Bm25Settings, as_floats, bm25_model, cached_bm25
from evidence_runtime.index.config import server_client
from evidence_runtime.index.edge import (
    EDGE_CONFIG_FILE,
    OPEN_MARGIN_BYTES,
    edge_filter,
    edge_open_error,
    shard_lock,
    shard_space,
)
from evidence_runtime.index.edge import shard_exists as edge_shard_exists

__all__ = [
    "PAYLOAD_INDEXES",
    "SEARCH_INDEX_MIN_POINTS",
    "EdgeIndexWriter",
    "IndexPoint",
    "IndexWriter",
    "ServerIndexWriter",
    "check_publish_space",
    "open_index_writer",
    "publish_space_needed",
]

# Payload fields that filters use (spec §9.6), with their index type. vector_generation is an
# integer; everything else is a keyword (lists of keywords for purposes/concepts/tables/columns).
PAYLOAD_INDEXES: Mapping[str, Literal["keyword", "integer"]] = {
    "workspace_id": "keyword",
    "workspace_revision": "keyword",
    "vector_generation": "integer",
    "record_kind": "keyword",
    "evidence_id": "keyword",
    "evidence_kind": "keyword",
    "purposes": "keyword",
    "concepts": "keyword",
    "tables": "keyword",
    "columns": "keyword",
    "language": "keyword",
    "source_file": "keyword",
}


# A generation of at least this many points gets its HNSW graph built when it is published: from
# here on an unindexed query takes 10-50 ms and ~3 ms after the build, which repays itself within
# a few thousand queries; at 10k the build (~25 s) saves ~1 ms, and under ~6,500 points the engine
# indexes nothing anyway (bench/README.md, "Large generations").
SEARCH_INDEX_MIN_POINTS = 20_000


@dataclass(frozen=True)
class IndexPoint:
    """One Evidence fragment to index: its BM25 sparse vector is computed from ``text``."""

    id: str  # a UUID string, derived by the caller with uuid5
    dense: Sequence[float]
    text: str
    payload: dict[str, Any]


@runtime_checkable
class IndexWriter(EvidenceIndex, Protocol):
    """The reader's interface plus what publishing needs; both engines implement these."""

    def ensure_schema(
        self, *, dense_dim: int, payload_indexes: Mapping[str, str] | None = None
    ) -> None:
        """Make the collection usable by Evidence without touching existing records.

        Verifies the default dense vector (size ``dense_dim``, Cosine), adds the sparse vector
        ``bm25`` with IDF when missing, and creates the missing payload indexes. Raises
        :class:`IndexSchemaError` and changes nothing when the dense vector differs or ``bm25``
        exists with another configuration.
        """
        ...

    def upsert(self, points: Sequence[IndexPoint], *, batch_size: int = 256,
               bm25: Bm25Settings | None = None) -> None:
        """Insert or replace points (dense + BM25 from ``text``, tokenized with the
        generation's ``bm25`` settings; None: the language's defaults); durable on return."""
        ...

    def delete(self, match: Match) -> None:
        """Delete the points matching ``match`` (which must not be empty)."""
        ...

    def build_search_index(self, *, points: int,
                           announce: Callable[[str], None] | None = None) -> float | None:
        """Build the dense vector index now when a generation of ``points`` points is large
        enough that it pays (blocking; ``announce`` is told first, as it can take minutes):
        the seconds it took, or None when nothing was built."""
        ...


def _check_dense_params(size: int, distance: str, dense_dim: int, where: str) -> None:
    if size != dense_dim or distance.lower() != "cosine":
        raise IndexSchemaError(
            f"the default dense vector is size {size} with {distance} distance; Evidence needs "
            f"size {dense_dim} with Cosine distance. Nothing was changed",
            path=where,
            field="vectors",
        )


def _payload_indexes(given: Mapping[str, str] | None) -> Mapping[str, str]:
    wanted = PAYLOAD_INDEXES if given is None else given
    for field, kind in wanted.items():
        if kind not in ("keyword", "integer"):
            raise ValueError(f"payload index {field!r}: type {kind!r} is not keyword or integer")
    return wanted


def _check_batch(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")


def _no_default_vector(where: str, detail: str = "") -> IndexSchemaError:
    return IndexSchemaError(
        f"the {'collection' if detail else 'shard'} has no default (unnamed) dense vector"
        f"{detail}. Nothing was changed",
        path=where,
        field="vectors",
    )


def _multivector(where: str) -> IndexSchemaError:
    return IndexSchemaError(
        "the default vector is a multivector. Nothing was changed", path=where, field="vectors"
    )


def _wrong_modifier(found: object, where: str) -> IndexSchemaError:
    return IndexSchemaError(
        f"sparse vector {BM25_VECTOR!r} exists with modifier {found!r}; Evidence needs "
        "'idf'. Nothing was changed",
        path=where,
        field=f"sparse_vectors.{BM25_VECTOR}",
    )


# --------------------------------------------------------------------------- Qdrant Edge

_EDGE_PAYLOAD_TYPES = {
    "keyword": qe.PayloadSchemaType.Keyword,
    "integer": qe.PayloadSchemaType.Integer,
}


def _edge_config(dense_dim: int) -> qe.EdgeConfig:
    return qe.EdgeConfig(
        vectors=qe.EdgeVectorParams(size=dense_dim, distance=qe.Distance.Cosine),
        sparse_vectors={BM25_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )


class EdgeIndexWriter(EdgeIndex):
    """A Qdrant Edge shard opened by the publisher (one process at a time, like any open).

    Adding ``bm25`` to an existing dense-only shard is supported and non-destructive:
    ``UpdateOperation.create_sparse_vector`` adds the (empty) sparse vector to every segment
    in place, existing points keep their ids, payloads and dense vectors. Edge has no API that
    returns the shard's vector configuration, so :meth:`ensure_schema` reads the configuration
    the engine persists in ``edge_config.json`` (rewritten by the engine on each change).
    """

    @classmethod
    def open(
        cls,
        path: Path | str,
        *,
        language: str = "italian",
        dense_dim: int | None = None,
        create: bool = True,
        lock_wait_s: float = 0.0,
    ) -> Self:
        """Open the shard at ``path`` (waiting up to ``lock_wait_s`` s while another process
        holds it).

        A missing shard is created with both vectors when ``create`` and ``dense_dim`` are
        given; with ``create`` and no ``dense_dim`` it is created by :meth:`ensure_schema`
        (other calls raise :class:`IndexUnavailableError` until then); without ``create`` a
        missing shard is :class:`IndexUnavailableError`. A shard held by another process is
        :class:`IndexLockedError`.
        """
        path = Path(path)
        bm25 = bm25_model(language)  # a bad language fails before any file is touched
        if edge_shard_exists(path) or not create:
            return super().open(path, language=language, lock_wait_s=lock_wait_s)
        index = cls(path, None, language=language, bm25=bm25)
        if dense_dim is not None:
            index._create(dense_dim)
        return index

    def _create(self, dense_dim: int) -> None:
        if self._lock_fd is None:
            self._lock_fd = shard_lock(self.path)  # held until close, as by every open
        try:
            self._shard = qe.EdgeShard.create(str(self.path), _edge_config(dense_dim))
        except Exception as exc:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise edge_open_error(exc, self.path) from exc

    def _persisted_config(self) -> dict[str, Any]:
        config_file = self.path / EDGE_CONFIG_FILE
        try:
            return json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise IndexUnavailableError(
                f"cannot read the shard configuration: {exc}", path=str(config_file)
            ) from exc

    def ensure_schema(
        self, *, dense_dim: int, payload_indexes: Mapping[str, str] | None = None
    ) -> None:
        wanted = _payload_indexes(payload_indexes)
        if self._shard is None and not self._closed:
            self._create(dense_dim)
        shard = self._live()
        config = self._persisted_config()
        where = str(self.path)
        vectors: dict[str, Any] = config.get("vectors") or {}
        default: dict[str, Any] | None = vectors.get("")
        if default is None:
            raise _no_default_vector(where)
        if default.get("multivector_config"):
            raise _multivector(where)
        _check_dense_params(
            int(default.get("size", -1)), str(default.get("distance", "?")), dense_dim, where
        )
        if BM25_VECTOR in vectors:
            raise IndexSchemaError(
                f"{BM25_VECTOR!r} exists as a dense vector. Nothing was changed",
                path=where,
                field=f"vectors.{BM25_VECTOR}",
            )
        sparse: dict[str, Any] | None = (config.get("sparse_vectors") or {}).get(BM25_VECTOR)
        if sparse is not None and str(sparse.get("modifier", "none")).lower() != "idf":
            raise _wrong_modifier(sparse.get("modifier", "none"), where)
        existing = set(shard.info().payload_schema)
        with self._engine("updating the index schema"):
            if sparse is None:
                shard.update(
                    qe.UpdateOperation.create_sparse_vector(BM25_VECTOR, modifier=qe.Modifier.Idf)
                )
            for field, kind in wanted.items():
                if field not in existing:
                    shard.update(
                        qe.UpdateOperation.create_field_index(field, _EDGE_PAYLOAD_TYPES[kind])
                    )
            shard.flush()

    def upsert(self, points: Sequence[IndexPoint], *, batch_size: int = 256,
               bm25: Bm25Settings | None = None) -> None:
        shard = self._live()
        _check_batch(batch_size)
        embed = cached_bm25(self._bm25_models, self._bm25, bm25).embed_document
        with self._engine("writing points"):
            for start in range(0, len(points), batch_size):
                batch = [
                    qe.Point(p.id, {"": as_floats(p.dense), BM25_VECTOR: embed(p.text)}, p.payload)
                    for p in points[start : start + batch_size]
                ]
                shard.update(qe.UpdateOperation.upsert_points(batch))
            shard.flush()

    def delete(self, match: Match) -> None:
        shard = self._live()
        flt = edge_filter(match)
        if flt is None:
            raise ValueError("delete needs a non-empty filter: it would delete every record")
        with self._engine("deleting points"):
            shard.update(qe.UpdateOperation.delete_points_by_filter(flt))
            shard.flush()

    def optimize(self) -> None:
        """Merge segments and build the vector indexes (blocking); call after a large load."""
        shard = self._live()
        with self._engine("optimizing"):
            shard.optimize()

    search_index_min_points = SEARCH_INDEX_MIN_POINTS

    def build_search_index(self, *, points: int,
                           announce: Callable[[str], None] | None = None) -> float | None:
        """:meth:`optimize` when ``points`` reaches :attr:`search_index_min_points`."""
        if points < self.search_index_min_points:
            return None
        if announce is not None:
            announce(f"building the search index (HNSW) of {points} point(s); "
                     "a large generation takes minutes")
        started = time.perf_counter()
        self.optimize()
        return time.perf_counter() - started


# What a new shard's files add up to as the engine creates them, holes included (an empty
# shard with the Evidence schema: 228 MB apparent; the published demo: 262 MB): the engine
# maps them and fills the holes as it writes, so the space must be there before it does.
NEW_SHARD_BYTES = 256 << 20
# Generous room per point written (a 384-float vector is 1.5 KB; its text, payload, BM25
# tokens, write-ahead-log record and payload-index entries a few KB more).
POINT_BYTES = 16 << 10


def publish_space_needed(path: Path, points: int) -> int:
    """The free bytes publishing ``points`` points into the shard at ``path`` needs: the holes
    of its files (a new shard's whole size), a write-ahead-log segment, and room per point."""
    holes = shard_space(path)[0] if edge_shard_exists(path) else NEW_SHARD_BYTES
    return holes + OPEN_MARGIN_BYTES + points * POINT_BYTES


def check_publish_space(path: Path, points: int) -> None:
    """:class:`DiskFullError` (``disk_full``) when the filesystem of the shard at ``path`` (or
    of its parent, before it exists) has less room than :func:`publish_space_needed`: checked
    before anything is written, as a write into a mapped hole with no space left would kill
    the publisher (SIGBUS) instead of failing it."""
    where = path if path.exists() else next((p for p in path.parents if p.exists()), path)
    vfs = os.statvfs(where)
    free = vfs.f_bavail * vfs.f_frsize
    needed = publish_space_needed(path, points)
    if free < needed:
        mib = 1 << 20
        raise DiskFullError(
            f"publishing {points} point(s) needs about {needed / mib:.0f} MiB free on the "
            f"filesystem of the embedded index, which has {free / mib:.1f} MiB; free some "
            "space, or move the index (index.path). Nothing was changed", path=str(path))


# --------------------------------------------------------------------------- Qdrant server


class ServerIndexWriter(ServerIndex):
    """A server collection written by the publisher; see :class:`ServerIndex` for ``bm25``."""

    def _doc_vector(self, text: str, settings: Bm25Settings | None = None) -> Any:
        if self.bm25 == "server":
            options = self._doc_options if settings is None else settings.server_options()
            return self._m.Document(text=text, model=BM25_MODEL, options=options)
        sv = cached_bm25(self._bm25_models, self._bm25, settings).embed_document(text)
        return self._m.SparseVector(indices=sv.indices, values=sv.values)

    def ensure_schema(
        self, *, dense_dim: int, payload_indexes: Mapping[str, str] | None = None
    ) -> None:
        m = self._m
        wanted = _payload_indexes(payload_indexes)
        where = f"collection {self.collection}"
        with self._engine("reading the collection"):
            exists = self.client.collection_exists(self.collection)
        if not exists:
            with self._engine("creating the collection"):
                self.client.create_collection(
                    self.collection,
                    vectors_config=m.VectorParams(size=dense_dim, distance=m.Distance.COSINE),
                    sparse_vectors_config={
                        BM25_VECTOR: m.SparseVectorParams(modifier=m.Modifier.IDF)
                    },
                )
        with self._engine("reading the collection"):
            info = self.client.get_collection(self.collection)
        vectors = info.config.params.vectors
        if not isinstance(vectors, m.VectorParams):
            names = sorted(vectors or {})
            raise _no_default_vector(where, f", only {names}")
        if vectors.multivector_config is not None:
            raise _multivector(where)
        distance = getattr(vectors.distance, "value", str(vectors.distance))
        _check_dense_params(vectors.size, distance, dense_dim, where)
        sparse = (info.config.params.sparse_vectors or {}).get(BM25_VECTOR)
        if sparse is not None and sparse.modifier != m.Modifier.IDF:
            raise _wrong_modifier(getattr(sparse.modifier, "value", sparse.modifier) or "none",
                                  where)
        existing = set(info.payload_schema or {})
        types = {"keyword": m.PayloadSchemaType.KEYWORD, "integer": m.PayloadSchemaType.INTEGER}
        with self._engine("updating the collection schema"):
            if sparse is None:
                # Adds the named vector in place: existing points keep everything they have.
                self.client.create_vector_name(
                    self.collection,
                    BM25_VECTOR,
                    m.SparseVectorNameConfig(sparse=m.SparseVectorConfig(modifier=m.Modifier.IDF)),
                    wait=True,
                )
            with warnings.catch_warnings():
                # local mode keeps no payload indexes and says so; the server does
                warnings.filterwarnings("ignore", message="Payload indexes have no effect")
                for field, kind in wanted.items():
                    if field not in existing:
                        self.client.create_payload_index(
                            self.collection, field, field_schema=types[kind], wait=True
                        )

    def upsert(self, points: Sequence[IndexPoint], *, batch_size: int = 256,
               bm25: Bm25Settings | None = None) -> None:
        _check_batch(batch_size)
        m = self._m
        with self._engine("writing points"):
            for start in range(0, len(points), batch_size):
                batch = [
                    m.PointStruct(
                        id=p.id,
                        vector={"": as_floats(p.dense),
                                BM25_VECTOR: self._doc_vector(p.text, bm25)},
                        payload=p.payload,
                    )
                    for p in points[start : start + batch_size]
                ]
                self.client.upsert(self.collection, points=batch, wait=True)

    def delete(self, match: Match) -> None:
        flt = self._filter(match)
        if flt is None:
            raise ValueError("delete needs a non-empty filter: it would delete every record")
        with self._engine("deleting points"):
            self.client.delete(
                self.collection, points_selector=self._m.FilterSelector(filter=flt), wait=True
            )

    def build_search_index(self, *, points: int,
                           announce: Callable[[str], None] | None = None) -> float | None:
        """Never: a Qdrant server indexes a collection in the background by itself."""
        return None


# --------------------------------------------------------------------------- factory


def open_index_writer(
    config: IndexConfig | Mapping[str, Any],
    *,
    language: str = "italian",
    dense_dim: int | None = None,
    create: bool = True,
) -> IndexWriter:
    """Open the index named by the workspace's ``index`` block for publishing.

    With ``create`` a missing Edge shard is prepared (created now when ``dense_dim`` is given)
    and a server collection gets the Evidence schema (when ``dense_dim`` is given); without
    it, a missing shard or collection is :class:`IndexUnavailableError`. Configuration faults
    are :class:`ConfigError`, as for :func:`evidence_runtime.index.open_index`.
    """
    cfg = IndexConfig.of(config)
    if cfg.engine == "edge":
        return EdgeIndexWriter.open(
            cfg.edge_path(), language=language, dense_dim=dense_dim, create=create,
            lock_wait_s=cfg.lock_wait_s,
        )
    client, collection = server_client(cfg)
    index = ServerIndexWriter(client, collection, language=language, bm25=cfg.bm25_mode)
    if not create:
        if not index.exists():
            index.close()
            raise IndexUnavailableError("the collection does not exist", path=collection)
    elif dense_dim is not None:
        index.ensure_schema(dense_dim=dense_dim)
    return index
