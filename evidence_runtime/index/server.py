"""The server engine: a collection on a Qdrant server (or qdrant-client's local mode), read-only.

``bm25="server"`` sends ``Document(model="qdrant/bm25", options={"language": ...})`` and lets
the server compute the sparse vectors (spec §9.3); ``bm25="client"`` computes them with Edge's
``Bm25`` embedder (same token ids), which also works in qdrant-client's local mode, where
server-side inference does not exist. The two must not be mixed on one collection. The
publisher's writer (``evidence_pipeline.publishing.index_writer``) extends :class:`ServerIndex`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from evidence_runtime.errors import ConfigError, IndexError_, IndexUnavailableError
from evidence_runtime.index.base import (
    BM25_MODEL,
    BM25_VECTOR,
    DENSE_VECTOR,
    SCROLL_PAGE,
    Bm25Settings,
    EvidenceIndex,
    Hit,
    Match,
    PointCounts,
    ScrollPage,
    Search,
    as_floats,
    bm25_model,
    cached_bm25,
    check_match,
)

if TYPE_CHECKING:
    import qdrant_edge as qe
    from qdrant_client import QdrantClient, models

__all__ = ["ServerIndex"]

Bm25Mode = Literal["server", "client"]


class ServerIndex(EvidenceIndex):
    """A collection on a Qdrant server (or ``QdrantClient(":memory:")`` / ``path=``), read-only.

    :meth:`close` closes the client.
    """

    def __init__(
        self,
        client: QdrantClient,
        collection: str,
        *,
        language: str = "italian",
        bm25: Bm25Mode = "server",
    ) -> None:
        from qdrant_client import models

        if bm25 not in ("server", "client"):
            raise ConfigError(f"unknown bm25 mode {bm25!r}", field="index.bm25")
        self.client = client
        self.collection = collection
        self.language = language
        self.bm25: Bm25Mode = bm25
        self._m = models
        self._bm25 = bm25_model(language)  # also checks the language in server mode
        self._doc_options = {"language": language}
        self._bm25_models: dict[Bm25Settings, qe.Bm25] = {}  # other generations' settings

    @contextlib.contextmanager
    def _engine(self, what: str) -> Generator[None, None, None]:
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

    def _filter(self, match: Match, *extra: Any) -> models.Filter | None:
        m = self._m
        must: list[Any] = [
            m.FieldCondition(
                key=field, match=m.MatchAny(any=value) if is_any else m.MatchValue(value=value)
            )
            for field, value, is_any in check_match(match)
        ]
        must.extend(extra)
        return m.Filter(must=must) if must else None

    def _query_vector(self, text: str, settings: Bm25Settings | None = None,
                      ) -> models.Document | models.SparseVector:
        """The BM25 query of ``text`` with a generation's ``settings`` (None: the language's
        defaults): server-side inference with the same options, or Edge's embedder."""
        if self.bm25 == "server":
            options = self._doc_options if settings is None else settings.server_options()
            return self._m.Document(text=text, model=BM25_MODEL, options=options)
        sv = cached_bm25(self._bm25_models, self._bm25, settings).embed_query(text)
        return self._m.SparseVector(indices=sv.indices, values=sv.values)

    def _query_terms(self, text: str, bm25: Bm25Settings | None) -> int:
        """Counted with Edge's embedder (the same tokens as the server's ``qdrant/bm25``)."""
        return len(cached_bm25(self._bm25_models, self._bm25, bm25).embed_query(text).indices)

    def exists(self) -> bool:
        """Whether the collection exists (:class:`IndexUnavailableError` when unreachable)."""
        with self._engine("opening the collection"):
            return self.client.collection_exists(self.collection)

    def count(self, match: Match) -> int:
        with self._engine("counting points"):
            return self.client.count(
                self.collection, count_filter=self._filter(match), exact=True
            ).count

    def point_counts(self, match: Match, *, payload_fields: Sequence[str] = ()) -> PointCounts:
        m = self._m

        def count(*extra: Any) -> int:
            return self.client.count(self.collection, count_filter=self._filter(match, *extra),
                                     exact=True).count

        with self._engine("counting points"):
            points = count()
            dense = count(m.HasVectorCondition(has_vector=DENSE_VECTOR))
            sparse = count(m.HasVectorCondition(has_vector=BM25_VECTOR))
            lacking = max((count(m.IsEmptyCondition(is_empty=m.PayloadField(key=f)))
                           for f in payload_fields), default=0)
        return PointCounts(points, dense, sparse, points - min(lacking, points))

    def _scroller(self, match: Match) -> ScrollPage:
        flt = self._filter(match)

        def page(offset: Any) -> tuple[list[str], Any]:
            records, after = self.client.scroll(
                self.collection, scroll_filter=flt, limit=SCROLL_PAGE, offset=offset,
                with_payload=False, with_vectors=False)
            return [str(r.id) for r in records], after
        return page

    def _search(self, search: Search) -> list[Hit]:
        flt = self._filter(search.match)
        dense, text, bm25 = search.dense, search.text, search.bm25
        kwargs: dict[str, Any]
        if search.mode == "dense":
            assert dense is not None
            kwargs = {"query": as_floats(dense), "query_filter": flt}
        else:
            assert text is not None
            kwargs = {"query": self._query_vector(text, bm25), "using": BM25_VECTOR,
                      "query_filter": flt}
        with self._engine("searching"):
            points = self.client.query_points(
                self.collection, limit=search.limit, with_payload=True, **kwargs
            ).points
        return [Hit(str(p.id), p.score, p.payload or {}) for p in points]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
