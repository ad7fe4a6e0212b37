"""Fusion of the two prefetch lists (dense, BM25) into one ranking, computed here in Python.

Both engines run the two branches as plain queries (same filter, ``prefetch_limit`` each) and
hand the two lists to :func:`fuse`, so a fused search ranks identically on Qdrant Edge and on a
server (spec §9.5; issue 26 item 2). Each list is first put in a fixed order (score, then id),
so engines that order tied scores differently still fuse alike.

Methods (``index.fusion`` in thoth.yaml):

- ``rrf``: weighted Reciprocal Rank Fusion, ``Σ w / (k + rank)`` with ranks from 1. (Qdrant's
  own weighted RRF is not this: reproduced from Edge's scores, a branch there contributes
  ``1 / (k − 1 + rank / w)``, so with k=5 a weight of 2 barely moves a branch's first hit:
  0.222 against 0.200. Equal weights give the same order on both, k shifted by one.)
- ``convex``: ``d · dense + (1 − d) · bm25`` over scores min-max normalised per list (the
  list's worst score 0, its best 1; a fragment absent from a list scores 0 there), ``d`` the
  ``dense_weight``.
- ``dbsf``: Qdrant's distribution-based score fusion, unweighted: each list's scores mapped
  from ``[mean − 3σ, mean + 3σ]`` to [0, 1] (clipped) and summed.
- ``adaptive`` (default): ``convex`` whose dense weight follows the query's lexical strength,
  the BM25 list's best score divided by the number of BM25 query terms. At or below
  ``bm25_strength[0]`` (the words match weakly: a paraphrase) the dense weight is
  ``weak_dense_weight``; at or above ``bm25_strength[1]`` (a code, an identifier, a column
  name matched strongly) it is ``dense_weight``; linear in between.

The defaults were chosen by measurement on the Italian dev set and BIRD (bench/README.md,
"Issue 26").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from evidence_runtime.index.base import Hit, sorted_hits

__all__ = [
    "DEFAULT_BM25_STRENGTH",
    "DEFAULT_DENSE_WEIGHT",
    "DEFAULT_FUSION",
    "DEFAULT_WEAK_DENSE_WEIGHT",
    "FUSION_METHODS",
    "Fusion",
    "FusionMethod",
    "adaptive_dense_weight",
    "fuse",
]

FusionMethod = Literal["rrf", "convex", "dbsf", "adaptive"]
FUSION_METHODS: tuple[str, ...] = get_args(FusionMethod)
DEFAULT_FUSION: FusionMethod = "adaptive"
DEFAULT_DENSE_WEIGHT = 0.4  # convex; adaptive: when BM25 matches strongly
DEFAULT_WEAK_DENSE_WEIGHT = 0.9  # adaptive: when BM25 matches weakly
DEFAULT_BM25_STRENGTH = (1.0, 2.0)  # adaptive: BM25 best score per query term, weak → strong


@dataclass(frozen=True)
class Fusion:
    """How a fused search combines its two lists (see the module's docstring).

    ``rrf_k`` and ``weights`` (dense, BM25; None: equal) are read by ``rrf`` only;
    ``dense_weight`` by ``convex`` and ``adaptive``; ``weak_dense_weight`` and
    ``bm25_strength`` by ``adaptive`` only.
    """

    method: FusionMethod = "rrf"
    rrf_k: int = 60
    weights: tuple[float, float] | None = None
    dense_weight: float = DEFAULT_DENSE_WEIGHT
    weak_dense_weight: float = DEFAULT_WEAK_DENSE_WEIGHT
    bm25_strength: tuple[float, float] = DEFAULT_BM25_STRENGTH

    def __post_init__(self) -> None:
        if self.method not in FUSION_METHODS:
            raise ValueError(f"unknown fusion {self.method!r}; expected one of: "
                             f"{', '.join(FUSION_METHODS)}")
        if self.rrf_k < 0:
            raise ValueError(f"rrf_k must be at least 0, not {self.rrf_k}")
        w = self.weights
        if w is not None and (len(w) != 2 or any(x <= 0 for x in w)):
            raise ValueError(f"RRF weights are two positive numbers (dense, BM25), not {w!r}")
        for name in ("dense_weight", "weak_dense_weight"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, not {value!r}")
        lo, hi = self.bm25_strength
        if not 0.0 <= lo < hi:
            raise ValueError(f"bm25_strength must be two numbers 0 <= weak < strong, "
                             f"not {self.bm25_strength!r}")


def adaptive_dense_weight(fusion: Fusion, bm25_best: float | None, terms: int) -> float:
    """The dense weight of an ``adaptive`` fusion for a query whose BM25 list's best score is
    ``bm25_best`` (None: BM25 found nothing) over ``terms`` BM25 query terms."""
    if bm25_best is None or terms <= 0:
        return fusion.weak_dense_weight
    strength = bm25_best / terms
    lo, hi = fusion.bm25_strength
    share = min(max((strength - lo) / (hi - lo), 0.0), 1.0)
    return fusion.weak_dense_weight + share * (fusion.dense_weight - fusion.weak_dense_weight)


def fuse(dense: Sequence[Hit], bm25: Sequence[Hit], fusion: Fusion, *, limit: int,
         terms: int = 0) -> list[Hit]:
    """The fused ranking of two prefetch lists, best first (ties by id), at most ``limit``.

    ``terms`` is the number of BM25 query terms (``adaptive`` only). A hit's payload is taken
    from the list that has it (the same point: the same payload).
    """
    lists = (sorted_hits(list(dense)), sorted_hits(list(bm25)))
    if fusion.method == "rrf":
        w = fusion.weights or (1.0, 1.0)
        scores = [{h.id: w[b] / (fusion.rrf_k + r) for r, h in enumerate(hits, 1)}
                  for b, hits in enumerate(lists)]
        weights = (1.0, 1.0)
    elif fusion.method == "dbsf":
        scores = [_dbsf(hits) for hits in lists]
        weights = (1.0, 1.0)
    else:
        scores = [_min_max(hits) for hits in lists]
        d = fusion.dense_weight
        if fusion.method == "adaptive":
            best = lists[1][0].score if lists[1] else None
            d = adaptive_dense_weight(fusion, best, terms)
        weights = (d, 1.0 - d)
    fused: dict[str, float] = {}
    payloads: dict[str, Hit] = {}
    for b, hits in enumerate(lists):
        for h in hits:
            fused[h.id] = fused.get(h.id, 0.0) + weights[b] * scores[b][h.id]
            payloads.setdefault(h.id, h)
    out = [Hit(pid, score, payloads[pid].payload) for pid, score in fused.items()]
    return sorted_hits(out)[:limit]


def _min_max(hits: Sequence[Hit]) -> dict[str, float]:
    """Scores mapped to [0, 1]: the list's worst 0, its best 1 (all 1 when they are equal)."""
    if not hits:
        return {}
    top, bottom = hits[0].score, hits[-1].score
    span = top - bottom
    if span <= 0:
        return {h.id: 1.0 for h in hits}
    return {h.id: (h.score - bottom) / span for h in hits}


def _dbsf(hits: Sequence[Hit]) -> dict[str, float]:
    """Qdrant's DBSF normalisation: ``[mean − 3σ, mean + 3σ]`` → [0, 1], clipped."""
    if not hits:
        return {}
    values = [h.score for h in hits]
    mean = sum(values) / len(values)
    sigma = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    if sigma <= 0:
        return {h.id: 0.5 for h in hits}
    low, span = mean - 3 * sigma, 6 * sigma
    return {h.id: min(max((h.score - low) / span, 0.0), 1.0) for h in hits}
