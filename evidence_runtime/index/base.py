"""The read interface of the index, its record types and the helpers both engines share.

Data model (spec §8, §9.7), the same on both engines: one collection (an Edge shard or a
server collection) with the *default, unnamed* dense vector (Cosine) shared with Schema and
Memory records, plus the sparse vector ``bm25`` with ``Modifier.IDF`` that only Evidence
fragments carry. Schema/Memory records (``record_kind`` schema_table, schema_column, memory,
solved_question) have only the dense vector; every read takes a filter so callers scope it to
their own records.

A :data:`Match` is ``{field: value}`` (MatchValue) or ``{field: [values]}`` (MatchAny: the
point's value, or one of its list values, is one of them); all conditions are AND-ed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self, cast, runtime_checkable

import numpy.typing as npt
import qdrant_edge as qe

from evidence_runtime.errors import ConfigError

if TYPE_CHECKING:
    from evidence_runtime.index.fusion import Fusion

__all__ = [
    "BM25_MODEL",
    "BM25_VECTOR",
    "DEFAULT_BM25_AVG_LEN",
    "DEFAULT_RRF_K",
    "DEFAULT_RRF_WEIGHTS",
    "DENSE_VECTOR",
    "Bm25Settings",
    "EvidenceIndex",
    "Hit",
    "Match",
    "PointCounts",
    "QueryMode",
    "Search",
    "Vector",
    "as_floats",
    "bm25_model",
    "cached_bm25",
    "check_match",
    "check_query_args",
    "sorted_hits",
]

BM25_VECTOR = "bm25"
DENSE_VECTOR = ""  # the default, unnamed dense vector
BM25_MODEL = "qdrant/bm25"
SCROLL_PAGE = 1024
DEFAULT_BM25_AVG_LEN = 256.0  # qdrant/bm25's and Edge's default
# RRF's settings of the search, chosen by measurement on the Italian dev set and BIRD (issue
# 16, bench/README.md): k=5 and the dense branch weighted twice BM25. They apply when
# index.fusion is rrf (the default fusion is adaptive: evidence_runtime.index.fusion).
# thoth.yaml's index section overrides them; EvidenceIndex.query itself stays plain RRF
# (k=60, equal weights) unless given a Fusion.
DEFAULT_RRF_K = 5
DEFAULT_RRF_WEIGHTS = (2.0, 1.0)

Weights = tuple[float, float]  # RRF weights of the (dense, BM25) prefetches

Match = dict[str, str | int | bool | list[str] | list[int]]
QueryMode = Literal["fused", "dense", "bm25"]
Vector = Sequence[float] | npt.NDArray[Any]  # a dense vector: numbers, or the embedder's array


@dataclass(frozen=True)
class Hit:
    """One scored point; ``id`` is the point id as a string, ``payload`` a plain dict."""

    id: str
    score: float
    payload: dict[str, Any]


@dataclass(frozen=True)
class PointCounts:
    """How many of the points matching a filter hold each thing a search relies on: the dense
    vector, the BM25 vector and the payload fields asked for (all of them)."""

    points: int
    dense: int
    bm25: int
    payload: int

    def as_dict(self) -> dict[str, int]:
        return {"points": self.points, "dense": self.dense, BM25_VECTOR: self.bm25,
                "payload": self.payload}


@dataclass(frozen=True)
class Bm25Settings:
    """How BM25 turns a text into tokens and weights them, for documents and queries alike.

    A generation's fragments are tokenized with these settings when they are published, so a
    search of that generation must use the same ones (the publisher records them with the
    generation, see ``Generation.bm25``). ``avg_len`` is BM25's expected document length in
    tokens (length normalization); ``stopwords`` are extra words ignored on top of the
    language's own list. The same settings give Edge's ``Bm25Config`` and the server's
    ``qdrant/bm25`` options (the two engines' JSON shapes are the same).
    """

    language: str = "italian"
    avg_len: float = DEFAULT_BM25_AVG_LEN
    stopwords: tuple[str, ...] = ()

    def edge_config(self) -> qe.Bm25Config:
        if not self.stopwords:
            return qe.Bm25Config(language=self.language, avg_len=self.avg_len)
        language = _stopword_language(self.language)
        stop = qe.StopwordsSet(languages={language} if language is not None else None,
                               custom=set(self.stopwords))
        return qe.Bm25Config(language=self.language, avg_len=self.avg_len, stopwords=stop)

    def server_options(self) -> dict[str, Any]:
        """The ``options`` of a ``qdrant/bm25`` Document (only what differs from defaults)."""
        options: dict[str, Any] = {"language": self.language}
        if self.avg_len != DEFAULT_BM25_AVG_LEN:
            options["avg_len"] = self.avg_len
        if self.stopwords:
            languages = [self.language] if _stopword_language(self.language) else []
            options["stopwords"] = {"languages": languages, "custom": sorted(self.stopwords)}
        return options

    def as_dict(self) -> dict[str, Any]:
        return {"language": self.language, "avg_len": self.avg_len,
                "stopwords": list(self.stopwords)}


def _stopword_language(language: str) -> qe.Language | None:
    """Edge's stop-word list of ``language`` (``italian`` → ``Language.Italian``), if any."""
    return getattr(qe.Language, language.capitalize(), None)


@dataclass(frozen=True)
class Search:
    """One branch's checked query (dense or BM25), as an engine receives it: a fused search is
    two of them, fused by :mod:`evidence_runtime.index.fusion`."""

    mode: Literal["dense", "bm25"]
    dense: Vector | None
    text: str | None
    match: Match
    limit: int
    bm25: Bm25Settings | None


# A page reader of :meth:`EvidenceIndex.scroll_ids`: the ids after ``offset`` and the next offset.
ScrollPage = Callable[[Any], tuple[list[str], Any]]


@runtime_checkable
class EvidenceIndex(Protocol):
    """What a reader of the index can do; both engines implement exactly these.

    The engines subclass it: :meth:`query`, :meth:`dense_search`, :meth:`scroll_ids` and the
    context manager are written here once, over three engine hooks (``_engine``, ``_scroller``,
    ``_search``).
    """

    def count(self, match: Match) -> int:
        """Exact number of points matching ``match`` (``{}``: all points)."""
        ...

    def point_counts(self, match: Match, *, payload_fields: Sequence[str] = ()) -> PointCounts:
        """How many points match ``match``, how many of them hold the dense vector, the BM25
        vector, and all of ``payload_fields`` (points less those lacking the field most often
        missing). A damaged shard can lose one of these alone (issue 28); a lost payload store
        shows in a field without a payload index (its indexes outlive it), such as
        ``source_sha256``."""
        ...

    def scroll_ids(self, match: Match) -> list[str]:
        """Ids (as strings, sorted) of the points matching ``match``."""
        page = self._scroller(match)
        ids: list[str] = []
        offset: Any = None
        with self._engine("listing points"):
            while True:
                found, offset = page(offset)
                ids.extend(found)
                if offset is None:
                    break
        ids.sort()
        return ids

    def query(
        self,
        *,
        dense: Vector | None,
        text: str | None,
        match: Match,
        limit: int,
        mode: QueryMode = "fused",
        prefetch_limit: int = 50,
        rrf_k: int = 60,
        weights: Weights | None = None,
        bm25: Bm25Settings | None = None,
        fusion: Fusion | None = None,
    ) -> list[Hit]:
        """Search Evidence fragments.

        ``fused``: a dense query on the default vector and a BM25 query from ``text``, both
        filtered by ``match`` and cut at ``prefetch_limit``, fused by ``fusion`` (None: plain
        RRF with constant ``rrf_k`` and the per-branch ``weights``, dense and BM25, None
        equal), computed by :func:`~evidence_runtime.index.fusion.fuse` the same way on both
        engines; ``dense`` / ``bm25``: one branch alone. ``bm25``: the tokenizer settings of
        the generation searched (None: the index language's defaults). Hits come best first,
        ties broken by id.
        """
        from evidence_runtime.index.fusion import Fusion, fuse

        check_query_args(mode, dense, text, limit, weights)
        if mode != "fused":
            return sorted_hits(self._search(Search(mode, dense, text, match, limit, bm25)))
        assert text is not None
        fusion = fusion or Fusion("rrf", rrf_k=rrf_k, weights=weights)
        if prefetch_limit < 1:
            raise ValueError("prefetch_limit must be at least 1")
        dense_hits = self._search(Search("dense", dense, None, match, prefetch_limit, bm25))
        bm25_hits = self._search(Search("bm25", None, text, match, prefetch_limit, bm25))
        terms = self._query_terms(text, bm25) if fusion.method == "adaptive" else 0
        return fuse(dense_hits, bm25_hits, fusion, limit=limit, terms=terms)

    def dense_search(self, vector: Vector, *, match: Match, limit: int) -> list[Hit]:
        """Plain dense search on the default vector over any records (Schema/Memory included)."""
        return sorted_hits(self._search(Search("dense", vector, None, match, limit, None)))

    def close(self) -> None:
        """Release the engine (Edge: drop the shard lock). Idempotent."""
        ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _engine(self, what: str) -> AbstractContextManager[None]:
        """Turns the engine's own exceptions raised inside it into typed index errors."""
        ...

    def _scroller(self, match: Match) -> ScrollPage:
        """The page reader of the points matching ``match`` (checked before any read)."""
        ...

    def _search(self, search: Search) -> list[Hit]:
        """The hits of one checked branch query, in any order."""
        ...

    def _query_terms(self, text: str, bm25: Bm25Settings | None) -> int:
        """How many BM25 terms the query ``text`` has, tokenized with ``bm25``."""
        ...


def check_match(match: Match) -> Iterator[tuple[str, Any, bool]]:
    """Yield ``(field, value, is_any)`` for each condition, rejecting malformed ones."""
    for field, value in match.items():
        if isinstance(value, list):
            items: list[Any] = list(value)
            if not items:
                raise ValueError(f"filter on {field!r} has an empty list: it would match nothing")
            if all(isinstance(v, str) for v in items) or all(
                isinstance(v, int) and not isinstance(v, bool) for v in items
            ):
                yield field, items, True
                continue
            raise ValueError(f"filter on {field!r}: a list must hold only str or only int")
        if isinstance(value, str | int | bool):  # pyright: ignore[reportUnnecessaryIsInstance]
            yield field, value, False
            continue
        raise ValueError(f"filter on {field!r}: unsupported value {value!r}")


def as_floats(vector: Vector) -> list[float]:
    """A plain list of floats (numpy arrays: one C call instead of a loop)."""
    if isinstance(vector, Sequence):
        return list(vector)
    return cast(list[float], vector.tolist())


def sorted_hits(hits: list[Hit]) -> list[Hit]:
    """Best first; equal scores (frequent with RRF) ordered by id, identically on both engines."""
    hits.sort(key=lambda h: (-h.score, h.id))
    return hits


def check_query_args(
    mode: str, dense: Vector | None, text: str | None, limit: int,
    weights: Weights | None = None,
) -> None:
    if mode not in ("fused", "dense", "bm25"):
        raise ValueError(f"unknown query mode {mode!r}")
    if mode in ("fused", "dense") and dense is None:
        raise ValueError(f"query mode {mode!r} needs a dense vector")
    if mode in ("fused", "bm25") and text is None:
        raise ValueError(f"query mode {mode!r} needs the query text")
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if weights is not None and (len(weights) != 2 or any(w <= 0 for w in weights)):
        raise ValueError(f"RRF weights are two positive numbers (dense, BM25), not {weights!r}")


def cached_bm25(cache: dict[Bm25Settings, qe.Bm25], default: qe.Bm25,
                settings: Bm25Settings | None) -> qe.Bm25:
    """``default`` when ``settings`` is None, else the embedder of ``settings``, built once."""
    if settings is None:
        return default
    model = cache.get(settings)
    if model is None:
        model = cache[settings] = bm25_model(settings)
    return model


def bm25_model(settings: str | Bm25Settings) -> qe.Bm25:
    """Edge's BM25 embedder for a language (its defaults) or for full settings;
    :class:`ConfigError` for an unknown language."""
    if isinstance(settings, str):
        settings = Bm25Settings(language=settings)
    try:
        return qe.Bm25(settings.edge_config())
    except ValueError as exc:
        raise ConfigError(
            f"BM25 cannot use language {settings.language!r}: {exc}", field="language"
        ) from exc
