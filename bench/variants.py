"""Comparisons of issue 16 item 4 that need no change to the library: RRF k, prefetch depth,
per-branch RRF weights, BM25 ``avg_len``, fragments without their header. Used by quality.py.

k and the prefetch depth are ``EvidenceSearcher`` parameters. The others go through the Edge
index's internals (``EdgeIndex._live()``, ``._bm25``, the ``EdgeIndex`` constructor): they are
what the library would have to expose to make them settings: weights in
``EvidenceIndex.query``, and a BM25 ``avg_len`` stored with the generation. A scratch shard is
built for the BM25 and fragment-text variants; the published shard is never changed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import log


@dataclass(frozen=True)
class Variant:
    rrf_k: int | None = None
    prefetch: int | None = None
    weights: tuple[float, float] | None = None
    bm25_avg_len: str | None = None  # a number or "measured"
    no_header: bool = False

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, False)}


def weighted_fused(searcher: Any, text: str, dense: Any, match: dict[str, Any], limit: int,
                   weights: tuple[float, float]) -> list[Any]:
    """RRF with per-branch weights (dense, BM25). ``EvidenceIndex.query`` has no weights, so the
    runtime's fused request is rebuilt on the Edge shard through its internals (``_live``,
    ``_bm25``): what the library would have to expose to make this a setting."""
    import qdrant_edge as qe

    from evidence_runtime.index import BM25_VECTOR, EdgeIndex, Hit
    from evidence_runtime.index.base import as_floats, sorted_hits
    from evidence_runtime.index.edge import edge_filter

    index = searcher.index()
    if not isinstance(index, EdgeIndex):
        raise SystemExit("--weights needs the Edge engine")
    flt = edge_filter(match)
    req = qe.QueryRequest(
        limit=limit,
        prefetches=[
            qe.Prefetch(limit=searcher.prefetch_limit, query=qe.Query.Nearest(as_floats(dense)),
                        filter=flt),
            qe.Prefetch(limit=searcher.prefetch_limit, query=qe.Query.Nearest(
                index._bm25.embed_query(text), using=BM25_VECTOR), filter=flt)],
        query=qe.Fusion.Rrf(k=searcher.rrf_k, weights=list(weights)), with_payload=True)
    return sorted_hits([Hit(str(p.id), p.score, dict(p.payload or {}))
                        for p in index._live().query(req)])


def open_searcher(ws: Path, variant: Variant, embedder: Any, scratch: Path
                  ) -> tuple[Any, dict[str, Any]]:
    """The workspace's searcher with the variant's parameters; for a BM25 or fragment-text
    variant, over a scratch Edge shard holding the same points (the published one is never
    changed). Returns the searcher and what the scratch shard was built with."""
    from evidence_runtime.search import EvidenceSearcher

    searcher = EvidenceSearcher.for_workspace(ws, embedder=embedder)
    if variant.rrf_k is not None:
        searcher.rrf_k = variant.rrf_k
    if variant.prefetch is not None:
        searcher.prefetch_limit = variant.prefetch
    if variant.bm25_avg_len is None and not variant.no_header:
        return searcher, {}
    idx, built = scratch_index(searcher.index(), scratch, language=searcher.language,
                               avg_len=variant.bm25_avg_len,
                               reshape=without_header if variant.no_header else None,
                               embedder=embedder)
    searcher.close()  # releases the published shard
    scratch_searcher = EvidenceSearcher.for_workspace(ws, embedder=embedder, index=idx)
    scratch_searcher.rrf_k, scratch_searcher.prefetch_limit = searcher.rrf_k, \
        searcher.prefetch_limit
    return scratch_searcher, built


def scratch_index(index: Any, path: Path, *, language: str, avg_len: str | None,
                  reshape: Callable[[dict[str, Any]], str] | None, embedder: Any
                  ) -> tuple[Any, dict[str, Any]]:
    """A new Edge shard with the published points: same payloads and dense vectors, BM25 with
    ``avg_len`` (a number, ``measured`` = mean distinct tokens per fragment, or the default
    256); with ``reshape``, each point gets another text, embedded with the passage model."""
    import qdrant_edge as qe

    from evidence_runtime.index import BM25_VECTOR, EdgeIndex

    shard = index._live()
    records: list[Any] = []
    offset = None
    while True:
        page, offset = shard.scroll(qe.ScrollRequest(offset=offset, limit=1024,
                                                     with_payload=True, with_vector=True))
        records.extend(page)
        if offset is None:
            break
    texts = [reshape(dict(r.payload)) if reshape else r.payload["text"] for r in records]
    default = qe.Bm25(qe.Bm25Config(language=language))
    measured = sum(len(default.embed_query(t).indices) for t in texts) / max(1, len(texts))
    length = 256.0 if avg_len is None else float(round(measured)) if avg_len == "measured" \
        else float(avg_len)
    if reshape is not None:
        log(f"[quality] embedding {len(texts)} reshaped fragments")
        dense = [list(map(float, v)) for v in embedder.embed_passages(texts)]
    else:
        dense = [list(r.vector[""] if isinstance(r.vector, dict) else r.vector)
                 for r in records]
    bm25 = qe.Bm25(qe.Bm25Config(language=language, avg_len=length))
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = qe.EdgeShard.create(str(path), qe.EdgeConfig(
        vectors=qe.EdgeVectorParams(size=len(dense[0]), distance=qe.Distance.Cosine),
        sparse_vectors={BM25_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)}))
    points = [qe.Point(r.id, {"": dense[i], BM25_VECTOR: bm25.embed_document(texts[i])},
                       {**dict(r.payload), "text": texts[i]}) for i, r in enumerate(records)]
    for start in range(0, len(points), 256):
        new.update(qe.UpdateOperation.upsert_points(points[start:start + 256]))
    new.flush()
    built = {"fragments": len(points), "bm25_avg_len": length,
             "mean_distinct_tokens": round(measured, 1), "reshaped": reshape is not None}
    return EdgeIndex(path, new, language=language, bm25=bm25), built


def close(searcher: Any, built: dict[str, Any]) -> None:
    """Close the searcher, and the scratch shard it was given (not its own)."""
    if built:
        searcher.index().close()
    searcher.close()


def without_header(payload: dict[str, Any]) -> str:
    """The fragment's content without the labels every fragment of its unit repeats."""
    _head, sep, content = payload["text"].partition("\n\n")
    return content if sep and content.strip() else payload["text"]
