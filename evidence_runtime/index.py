"""Index access: one interface, two engines (Qdrant Edge in-process, Qdrant server).

Data model (spec §8, §9.7), the same on both engines: one collection (an Edge shard or a
server collection) with the *default, unnamed* dense vector (Cosine) shared with Schema and
Memory records, plus the sparse vector ``bm25`` with ``Modifier.IDF`` that only Evidence
fragments carry. Schema/Memory records (``record_kind`` schema_table, schema_column, memory,
solved_question) have only the dense vector; nothing here ever rewrites them, and every
read or delete takes a filter so callers scope it to their own records.

BM25 tokens: on the server, ``qdrant/bm25`` inference with the workspace language (spec §9.3);
in Edge, and with ``QdrantClient(":memory:")``, Edge's ``Bm25`` embedder, documented to produce
the same token ids and formula as the server (k=1.2, b=0.75, avg_len=256 on both sides).

A :data:`Match` is ``{field: value}`` (MatchValue) or ``{field: [values]}`` (MatchAny: the
point's value, or one of its list values, is one of them); all conditions are AND-ed.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import qdrant_edge as qe

from evidence_runtime.errors import (
    ConfigError,
    IndexError_,
    IndexLockedError,
    IndexSchemaError,
    IndexUnavailableError,
)

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

__all__ = [
    "BM25_MODEL",
    "BM25_VECTOR",
    "INDEX_ENGINES",
    "PAYLOAD_INDEXES",
    "EdgeIndex",
    "EvidenceIndex",
    "Hit",
    "IndexPoint",
    "Match",
    "QueryMode",
    "ServerIndex",
    "create_dense_only_collection",
    "create_dense_only_shard",
    "open_index",
]

BM25_VECTOR = "bm25"
BM25_MODEL = "qdrant/bm25"
INDEX_ENGINES = ("edge", "server")

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

_SCROLL_PAGE = 1024

Match = dict[str, str | int | bool | list[str] | list[int]]
QueryMode = Literal["fused", "dense", "bm25"]
DenseRecord = tuple[str | int, Sequence[float], Mapping[str, Any]]


@dataclass(frozen=True)
class IndexPoint:
    """One Evidence fragment to index: its BM25 sparse vector is computed from ``text``."""

    id: str  # a UUID string, derived by the caller with uuid5
    dense: Sequence[float]
    text: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class Hit:
    """One scored point; ``id`` is the point id as a string, ``payload`` a plain dict."""

    id: str
    score: float
    payload: dict[str, Any]


@runtime_checkable
class EvidenceIndex(Protocol):
    """The index operations Evidence needs; both engines implement exactly these."""

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

    def upsert(self, points: Sequence[IndexPoint], *, batch_size: int = 256) -> None:
        """Insert or replace points (dense + BM25 from ``text``); durable on return."""
        ...

    def delete(self, match: Match) -> None:
        """Delete the points matching ``match`` (which must not be empty)."""
        ...

    def count(self, match: Match) -> int:
        """Exact number of points matching ``match`` (``{}``: all points)."""
        ...

    def scroll_ids(self, match: Match) -> list[str]:
        """Ids (as strings, sorted) of the points matching ``match``."""
        ...

    def query(
        self,
        *,
        dense: Sequence[float] | None,
        text: str | None,
        match: Match,
        limit: int,
        mode: QueryMode = "fused",
        prefetch_limit: int = 50,
        rrf_k: int = 60,
    ) -> list[Hit]:
        """Search Evidence fragments.

        ``fused``: a dense prefetch on the default vector and a BM25 prefetch from ``text``, both
        filtered by ``match``, fused by RRF with constant ``rrf_k``; ``dense`` / ``bm25``: one
        branch alone (diagnostics). Hits come best first, ties broken by id.
        """
        ...

    def dense_search(self, vector: Sequence[float], *, match: Match, limit: int) -> list[Hit]:
        """Plain dense search on the default vector over any records (Schema/Memory included)."""
        ...

    def close(self) -> None:
        """Release the engine (Edge: flush and drop the shard lock). Idempotent."""
        ...


# --------------------------------------------------------------------------- shared helpers


def _check_match(match: Match) -> Iterator[tuple[str, Any, bool]]:
    """Yield ``(field, value, is_any)`` for each condition, rejecting malformed ones."""
    for field, value in match.items():
        if isinstance(value, list | tuple):
            if not value:
                raise ValueError(f"filter on {field!r} has an empty list: it would match nothing")
            if all(isinstance(v, str) for v in value) or all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            ):
                yield field, list(value), True
                continue
            raise ValueError(f"filter on {field!r}: a list must hold only str or only int")
        if isinstance(value, str | int | bool):
            yield field, value, False
            continue
        raise ValueError(f"filter on {field!r}: unsupported value {value!r}")


def _as_floats(vector: Sequence[float]) -> list[float]:
    tolist = getattr(vector, "tolist", None)  # numpy arrays: one C call instead of a loop
    return tolist() if tolist is not None else list(vector)


def _sorted_hits(hits: list[Hit]) -> list[Hit]:
    # Engines order equal scores arbitrarily; the id makes the order deterministic (RRF ties
    # are frequent) and identical across engines.
    hits.sort(key=lambda h: (-h.score, h.id))
    return hits


def _check_query_args(
    mode: str, dense: Sequence[float] | None, text: str | None, limit: int
) -> None:
    if mode not in ("fused", "dense", "bm25"):
        raise ValueError(f"unknown query mode {mode!r}")
    if mode in ("fused", "dense") and dense is None:
        raise ValueError(f"query mode {mode!r} needs a dense vector")
    if mode in ("fused", "bm25") and text is None:
        raise ValueError(f"query mode {mode!r} needs the query text")
    if limit < 1:
        raise ValueError("limit must be at least 1")


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


def _bm25_model(language: str) -> qe.Bm25:
    try:
        return qe.Bm25(qe.Bm25Config(language=language))
    except ValueError as exc:
        raise ConfigError(
            f"BM25 cannot use language {language!r}: {exc}", field="language"
        ) from exc


# --------------------------------------------------------------------------- Qdrant Edge

_EDGE_CONFIG_FILE = "edge_config.json"
_EDGE_PAYLOAD_TYPES = {
    "keyword": qe.PayloadSchemaType.Keyword,
    "integer": qe.PayloadSchemaType.Integer,
}


def _edge_filter(match: Match) -> qe.Filter | None:
    must = [
        qe.FieldCondition(key=field, match=qe.MatchAny(value) if is_any else qe.MatchValue(value))
        for field, value, is_any in _check_match(match)
    ]
    return qe.Filter(must=must) if must else None


def _edge_config(dense_dim: int) -> qe.EdgeConfig:
    return qe.EdgeConfig(
        vectors=qe.EdgeVectorParams(size=dense_dim, distance=qe.Distance.Cosine),
        sparse_vectors={BM25_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )


def _edge_open_error(exc: Exception, path: Path) -> IndexError_:
    message = str(exc)
    if "WouldBlock" in message:
        return IndexLockedError(
            "the embedded index is open in another process (Qdrant Edge allows one process "
            "at a time); close it there, or point the workspace at a Qdrant server",
            path=str(path),
        )
    return IndexUnavailableError(f"cannot open the embedded index: {message}", path=str(path))


def _edge_shard_exists(path: Path) -> bool:
    return (path / _EDGE_CONFIG_FILE).is_file()


class EdgeIndex:
    """Qdrant Edge shard in a directory (the embedded default).

    The shard takes an exclusive lock: while this object is open no other process can open the
    same directory (:class:`IndexLockedError`); :meth:`close` releases it.

    Adding ``bm25`` to an existing dense-only shard is supported and non-destructive:
    ``UpdateOperation.create_sparse_vector`` adds the (empty) sparse vector to every segment
    in place, existing points keep their ids, payloads and dense vectors. Edge has no API that
    returns the shard's vector configuration, so :meth:`ensure_schema` reads the configuration
    the engine persists in ``edge_config.json`` (rewritten by the engine on each change).
    """

    def __init__(
        self, path: Path, shard: qe.EdgeShard | None, *, language: str, bm25: qe.Bm25
    ) -> None:
        """Use :meth:`open`."""
        self.path = path
        self.language = language
        self._shard = shard
        self._closed = False
        self._bm25 = bm25  # built once: the per-query cost is only tokenizing the text

    @classmethod
    def open(
        cls,
        path: Path | str,
        *,
        language: str = "italian",
        dense_dim: int | None = None,
        create: bool = True,
    ) -> EdgeIndex:
        """Open the shard at ``path``.

        A missing shard is created with both vectors when ``create`` and ``dense_dim`` are
        given; with ``create`` and no ``dense_dim`` it is created by :meth:`ensure_schema`
        (other calls raise :class:`IndexUnavailableError` until then); without ``create`` a
        missing shard is :class:`IndexUnavailableError`. A shard held by another process is
        :class:`IndexLockedError`.
        """
        path = Path(path)
        bm25 = _bm25_model(language)  # a bad language fails before any file is touched
        if _edge_shard_exists(path):
            try:
                shard = qe.EdgeShard.load(str(path))
            except Exception as exc:  # the binding raises plain Exception for engine errors
                raise _edge_open_error(exc, path) from exc
            return cls(path, shard, language=language, bm25=bm25)
        if not create:
            raise IndexUnavailableError("no embedded index at this path", path=str(path))
        index = cls(path, None, language=language, bm25=bm25)
        if dense_dim is not None:
            index._create(dense_dim)
        return index

    def __enter__(self) -> EdgeIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals

    def _create(self, dense_dim: int) -> None:
        try:
            self._shard = qe.EdgeShard.create(str(self.path), _edge_config(dense_dim))
        except Exception as exc:
            raise _edge_open_error(exc, self.path) from exc

    def _live(self) -> qe.EdgeShard:
        if self._closed:
            raise IndexUnavailableError("the embedded index was closed", path=str(self.path))
        if self._shard is None:
            raise IndexUnavailableError(
                "the embedded index does not exist yet (publish a generation first)",
                path=str(self.path),
            )
        return self._shard

    @contextlib.contextmanager
    def _engine(self, what: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # the binding raises plain Exception/ValueError for the engine
            raise IndexError_(f"{what} failed: {exc}", path=str(self.path)) from exc

    def _persisted_config(self) -> dict[str, Any]:
        config_file = self.path / _EDGE_CONFIG_FILE
        try:
            return json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise IndexUnavailableError(
                f"cannot read the shard configuration: {exc}", path=str(config_file)
            ) from exc

    # -- the interface

    def ensure_schema(
        self, *, dense_dim: int, payload_indexes: Mapping[str, str] | None = None
    ) -> None:
        wanted = _payload_indexes(payload_indexes)
        if self._shard is None and not self._closed:
            self._create(dense_dim)
        shard = self._live()
        config = self._persisted_config()
        where = str(self.path)
        default = (config.get("vectors") or {}).get("")
        if default is None:
            raise IndexSchemaError(
                "the shard has no default (unnamed) dense vector. Nothing was changed",
                path=where,
                field="vectors",
            )
        if default.get("multivector_config"):
            raise IndexSchemaError(
                "the default vector is a multivector. Nothing was changed",
                path=where,
                field="vectors",
            )
        _check_dense_params(
            int(default.get("size", -1)), str(default.get("distance", "?")), dense_dim, where
        )
        if BM25_VECTOR in (config.get("vectors") or {}):
            raise IndexSchemaError(
                f"{BM25_VECTOR!r} exists as a dense vector. Nothing was changed",
                path=where,
                field=f"vectors.{BM25_VECTOR}",
            )
        sparse = (config.get("sparse_vectors") or {}).get(BM25_VECTOR)
        if sparse is not None and str(sparse.get("modifier", "none")).lower() != "idf":
            raise IndexSchemaError(
                f"sparse vector {BM25_VECTOR!r} exists with modifier "
                f"{sparse.get('modifier', 'none')!r}; Evidence needs 'idf'. Nothing was changed",
                path=where,
                field=f"sparse_vectors.{BM25_VECTOR}",
            )
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

    def upsert(self, points: Sequence[IndexPoint], *, batch_size: int = 256) -> None:
        shard = self._live()
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        embed = self._bm25.embed_document
        with self._engine("writing points"):
            for start in range(0, len(points), batch_size):
                batch = [
                    qe.Point(
                        p.id,
                        {"": _as_floats(p.dense), BM25_VECTOR: embed(p.text)},
                        p.payload,
                    )
                    for p in points[start : start + batch_size]
                ]
                shard.update(qe.UpdateOperation.upsert_points(batch))
            shard.flush()

    def delete(self, match: Match) -> None:
        shard = self._live()
        flt = _edge_filter(match)
        if flt is None:
            raise ValueError("delete needs a non-empty filter: it would delete every record")
        with self._engine("deleting points"):
            shard.update(qe.UpdateOperation.delete_points_by_filter(flt))
            shard.flush()

    def count(self, match: Match) -> int:
        shard = self._live()
        with self._engine("counting points"):
            return shard.count(qe.CountRequest(exact=True, filter=_edge_filter(match)))

    def scroll_ids(self, match: Match) -> list[str]:
        shard = self._live()
        flt = _edge_filter(match)
        ids: list[str] = []
        offset: Any = None
        with self._engine("listing points"):
            while True:
                records, offset = shard.scroll(
                    qe.ScrollRequest(
                        offset=offset,
                        limit=_SCROLL_PAGE,
                        filter=flt,
                        with_payload=False,
                        with_vector=False,
                    )
                )
                ids.extend(str(r.id) for r in records)
                if offset is None:
                    break
        ids.sort()
        return ids

    def query(
        self,
        *,
        dense: Sequence[float] | None,
        text: str | None,
        match: Match,
        limit: int,
        mode: QueryMode = "fused",
        prefetch_limit: int = 50,
        rrf_k: int = 60,
    ) -> list[Hit]:
        _check_query_args(mode, dense, text, limit)
        shard = self._live()
        flt = _edge_filter(match)
        if mode == "dense":
            request = qe.QueryRequest(
                limit=limit,
                query=qe.Query.Nearest(_as_floats(dense)),  # type: ignore[arg-type]
                filter=flt,
                with_payload=True,
            )
        elif mode == "bm25":
            request = qe.QueryRequest(
                limit=limit,
                query=qe.Query.Nearest(self._bm25.embed_query(text), using=BM25_VECTOR),  # type: ignore[arg-type]
                filter=flt,
                with_payload=True,
            )
        else:
            request = qe.QueryRequest(
                limit=limit,
                prefetches=[
                    qe.Prefetch(
                        limit=prefetch_limit,
                        query=qe.Query.Nearest(_as_floats(dense)),  # type: ignore[arg-type]
                        filter=flt,
                    ),
                    qe.Prefetch(
                        limit=prefetch_limit,
                        query=qe.Query.Nearest(
                            self._bm25.embed_query(text),  # type: ignore[arg-type]
                            using=BM25_VECTOR,
                        ),
                        filter=flt,
                    ),
                ],
                query=qe.Fusion.Rrf(k=rrf_k),
                with_payload=True,
            )
        with self._engine("searching"):
            points = shard.query(request)
        return _sorted_hits([Hit(str(p.id), p.score, p.payload or {}) for p in points])

    def dense_search(self, vector: Sequence[float], *, match: Match, limit: int) -> list[Hit]:
        shard = self._live()
        request = qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest(_as_floats(vector)),
            filter=_edge_filter(match),
            with_payload=True,
        )
        with self._engine("searching"):
            points = shard.query(request)
        return _sorted_hits([Hit(str(p.id), p.score, p.payload or {}) for p in points])

    def optimize(self) -> None:
        """Merge segments and build the vector indexes (blocking); call after a large load."""
        shard = self._live()
        with self._engine("optimizing"):
            shard.optimize()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        shard, self._shard = self._shard, None
        if shard is not None:
            with contextlib.suppress(Exception):
                shard.flush()
            shard.close()


def create_dense_only_shard(
    path: Path | str, *, dense_dim: int, records: Iterable[DenseRecord] = ()
) -> None:
    """Create an Edge shard holding only the default dense vector, as Schema and Memory have it
    before Evidence's upgrade, optionally with ``(id, dense, payload)`` records; then close it."""
    shard = qe.EdgeShard.create(
        str(path),
        qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=dense_dim, distance=qe.Distance.Cosine)),
    )
    try:
        points = [qe.Point(rid, _as_floats(vec), dict(payload)) for rid, vec, payload in records]
        if points:
            shard.update(qe.UpdateOperation.upsert_points(points))
        shard.flush()
    finally:
        shard.close()


# --------------------------------------------------------------------------- Qdrant server


class ServerIndex:
    """A collection on a Qdrant server (or ``QdrantClient(":memory:")`` / ``path=``).

    ``bm25="server"`` sends ``Document(model="qdrant/bm25", options={"language": ...})`` and
    lets the server compute the sparse vectors (spec §9.3); ``bm25="client"`` computes them with
    Edge's ``Bm25`` embedder (same token ids), which also works in qdrant-client's local mode,
    where server-side inference does not exist. The two must not be mixed on one collection.
    :meth:`close` closes the client.
    """

    def __init__(
        self,
        client: QdrantClient,
        collection: str,
        *,
        language: str = "italian",
        bm25: Literal["server", "client"] = "server",
    ) -> None:
        from qdrant_client import models

        if bm25 not in ("server", "client"):
            raise ConfigError(f"unknown bm25 mode {bm25!r}", field="index.bm25")
        self.client = client
        self.collection = collection
        self.language = language
        self.bm25 = bm25
        self._m = models
        self._bm25 = _bm25_model(language)  # also checks the language in server mode
        self._doc_options = {"language": language}

    def __enter__(self) -> ServerIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals

    @contextlib.contextmanager
    def _engine(self, what: str) -> Iterator[None]:
        from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

        where = f"collection {self.collection}"
        try:
            yield
        except UnexpectedResponse as exc:
            detail = exc.content.decode("utf-8", "replace")[:300] if exc.content else ""
            if exc.status_code == 404:
                raise IndexUnavailableError(f"{what}: not found {detail}", path=where) from exc
            raise IndexError_(
                f"{what} failed: HTTP {exc.status_code} {detail}".rstrip(), path=where
            ) from exc
        except (ResponseHandlingException, OSError) as exc:  # refused, reset, timed out
            raise IndexUnavailableError(
                f"{what}: the Qdrant server cannot be reached: {exc}", path=where
            ) from exc
        except ValueError as exc:  # local mode reports a missing collection as ValueError
            if "not found" in str(exc):
                raise IndexUnavailableError(f"{what}: {exc}", path=where) from exc
            raise IndexError_(f"{what} failed: {exc}", path=where) from exc
        except Exception as exc:
            if type(exc).__module__.startswith("grpc"):
                raise IndexUnavailableError(f"{what}: {exc}", path=where) from exc
            raise

    def _filter(self, match: Match) -> Any:
        m = self._m
        must = [
            m.FieldCondition(
                key=field, match=m.MatchAny(any=value) if is_any else m.MatchValue(value=value)
            )
            for field, value, is_any in _check_match(match)
        ]
        return m.Filter(must=must) if must else None

    def _doc_vector(self, text: str) -> Any:
        if self.bm25 == "server":
            return self._m.Document(text=text, model=BM25_MODEL, options=self._doc_options)
        sv = self._bm25.embed_document(text)
        return self._m.SparseVector(indices=sv.indices, values=sv.values)

    def _query_vector(self, text: str) -> Any:
        if self.bm25 == "server":
            return self._m.Document(text=text, model=BM25_MODEL, options=self._doc_options)
        sv = self._bm25.embed_query(text)
        return self._m.SparseVector(indices=sv.indices, values=sv.values)

    # -- the interface

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
            raise IndexSchemaError(
                f"the collection has no default (unnamed) dense vector, only {names}. "
                "Nothing was changed",
                path=where,
                field="vectors",
            )
        if vectors.multivector_config is not None:
            raise IndexSchemaError(
                "the default vector is a multivector. Nothing was changed",
                path=where,
                field="vectors",
            )
        distance = getattr(vectors.distance, "value", str(vectors.distance))
        _check_dense_params(vectors.size, distance, dense_dim, where)
        sparse = (info.config.params.sparse_vectors or {}).get(BM25_VECTOR)
        if sparse is not None and sparse.modifier != m.Modifier.IDF:
            found = getattr(sparse.modifier, "value", sparse.modifier) or "none"
            raise IndexSchemaError(
                f"sparse vector {BM25_VECTOR!r} exists with modifier {found!r}; Evidence needs "
                "'idf'. Nothing was changed",
                path=where,
                field=f"sparse_vectors.{BM25_VECTOR}",
            )
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

    def upsert(self, points: Sequence[IndexPoint], *, batch_size: int = 256) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        m = self._m
        with self._engine("writing points"):
            for start in range(0, len(points), batch_size):
                batch = [
                    m.PointStruct(
                        id=p.id,
                        vector={"": _as_floats(p.dense), BM25_VECTOR: self._doc_vector(p.text)},
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

    def count(self, match: Match) -> int:
        with self._engine("counting points"):
            return self.client.count(
                self.collection, count_filter=self._filter(match), exact=True
            ).count

    def scroll_ids(self, match: Match) -> list[str]:
        flt = self._filter(match)
        ids: list[str] = []
        offset: Any = None
        with self._engine("listing points"):
            while True:
                records, offset = self.client.scroll(
                    self.collection,
                    scroll_filter=flt,
                    limit=_SCROLL_PAGE,
                    offset=offset,
                    with_payload=False,
                    with_vectors=False,
                )
                ids.extend(str(r.id) for r in records)
                if offset is None:
                    break
        ids.sort()
        return ids

    def query(
        self,
        *,
        dense: Sequence[float] | None,
        text: str | None,
        match: Match,
        limit: int,
        mode: QueryMode = "fused",
        prefetch_limit: int = 50,
        rrf_k: int = 60,
    ) -> list[Hit]:
        _check_query_args(mode, dense, text, limit)
        m = self._m
        flt = self._filter(match)
        kwargs: dict[str, Any]
        if mode == "dense":
            kwargs = {"query": _as_floats(dense), "query_filter": flt}  # type: ignore[arg-type]
        elif mode == "bm25":
            kwargs = {
                "query": self._query_vector(text),  # type: ignore[arg-type]
                "using": BM25_VECTOR,
                "query_filter": flt,
            }
        else:
            kwargs = {
                "prefetch": [
                    m.Prefetch(query=_as_floats(dense), filter=flt, limit=prefetch_limit),  # type: ignore[arg-type]
                    m.Prefetch(
                        query=self._query_vector(text),  # type: ignore[arg-type]
                        using=BM25_VECTOR,
                        filter=flt,
                        limit=prefetch_limit,
                    ),
                ],
                "query": m.RrfQuery(rrf=m.Rrf(k=rrf_k)),
            }
        with self._engine("searching"):
            points = self.client.query_points(
                self.collection, limit=limit, with_payload=True, **kwargs
            ).points
        return _sorted_hits([Hit(str(p.id), p.score, p.payload or {}) for p in points])

    def dense_search(self, vector: Sequence[float], *, match: Match, limit: int) -> list[Hit]:
        with self._engine("searching"):
            points = self.client.query_points(
                self.collection,
                query=_as_floats(vector),
                query_filter=self._filter(match),
                limit=limit,
                with_payload=True,
            ).points
        return _sorted_hits([Hit(str(p.id), p.score, p.payload or {}) for p in points])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


def create_dense_only_collection(
    client: QdrantClient,
    collection: str,
    *,
    dense_dim: int,
    records: Iterable[DenseRecord] = (),
) -> None:
    """Create a collection holding only the default dense vector, as Schema and Memory have it
    before Evidence's upgrade, optionally with ``(id, dense, payload)`` records."""
    from qdrant_client import models

    client.create_collection(
        collection,
        vectors_config=models.VectorParams(size=dense_dim, distance=models.Distance.COSINE),
    )
    points = [
        models.PointStruct(id=rid, vector=_as_floats(vec), payload=dict(payload))
        for rid, vec, payload in records
    ]
    if points:
        client.upsert(collection, points=points, wait=True)


# --------------------------------------------------------------------------- factory


def open_index(
    config: Mapping[str, Any],
    *,
    language: str = "italian",
    dense_dim: int | None = None,
    create: bool = True,
) -> EvidenceIndex:
    """Open the index named by the workspace's ``index`` block.

    ``{"engine": "edge", "path": ...}`` opens (or, with ``create``, prepares) a Qdrant Edge
    shard; ``{"engine": "server", "url": ..., "collection": ...}`` a server collection, with
    optional ``api_key`` (or ``api_key_env``, the name of the variable holding it), ``bm25``
    (``server`` | ``client``), ``timeout`` and ``prefer_grpc``. ``url: ":memory:"`` is
    qdrant-client's in-process mode, which needs ``bm25: client`` (its default there). Keys
    that are ``None`` count as absent and other keys are ignored, so a whole validated
    ``index`` section can be passed; relative paths are the caller's to resolve. An unknown
    engine or a missing value is :class:`ConfigError`.
    """
    values = {k: v for k, v in config.items() if v is not None}
    engine = values.get("engine", "edge")
    if engine not in INDEX_ENGINES:
        raise ConfigError(
            f"unknown index engine {engine!r}; expected one of: {', '.join(INDEX_ENGINES)}",
            field="index.engine",
        )
    if engine == "edge":
        path = values.get("path")
        if not path:
            raise ConfigError("the edge index needs a path", field="index.path")
        return EdgeIndex.open(Path(path), language=language, dense_dim=dense_dim, create=create)

    url = values.get("url")
    collection = values.get("collection")
    if not url:
        raise ConfigError("the server index needs a url", field="index.url")
    if not collection:
        raise ConfigError("the server index needs a collection", field="index.collection")
    in_memory = url == ":memory:"
    bm25 = values.get("bm25", "client" if in_memory else "server")
    if bm25 not in ("server", "client"):
        raise ConfigError(f"bm25 must be 'server' or 'client', not {bm25!r}", field="index.bm25")
    if in_memory and bm25 == "server":
        raise ConfigError(
            "qdrant-client's in-memory mode cannot run qdrant/bm25; use bm25: client",
            field="index.bm25",
        )
    api_key = values.get("api_key")
    if api_key is None and "api_key_env" in values:
        api_key = os.environ.get(values["api_key_env"])
        if not api_key:
            raise ConfigError(
                f"environment variable {values['api_key_env']} (the Qdrant API key) is not set",
                field="index.api_key_env",
            )
    from qdrant_client import QdrantClient

    if in_memory:
        client = QdrantClient(location=":memory:")
    else:
        try:
            client = QdrantClient(
                url=url,
                api_key=api_key,
                timeout=int(values.get("timeout", 10)),
                prefer_grpc=bool(values.get("prefer_grpc", False)),
            )
        except Exception as exc:  # bad URL shapes are raised at construction
            raise ConfigError(f"cannot use index url {url!r}: {exc}", field="index.url") from exc
    index = ServerIndex(client, collection, language=language, bm25=bm25)
    if not create:
        with index._engine("opening the collection"):
            exists = client.collection_exists(collection)
        if not exists:
            index.close()
            raise IndexUnavailableError("the collection does not exist", path=collection)
    elif dense_dim is not None:
        index.ensure_schema(dense_dim=dense_dim)
    return index
