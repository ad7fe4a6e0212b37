"""`prepare` on 1,000 unchanged sources: the no-op time and its peak memory.

    python bench/prepare_noop.py              # table + bench/results/prepare_noop.json
    python bench/prepare_noop.py --sources 5000 --json

A workspace of N small Italian notes (demo sentences recombined, 1–3 sections each) is prepared
once with the structural backend and committed; then prepare runs again with nothing changed,
(a) as the CLI a curator types (`tht evidence prepare <root> --json`, process start included)
and (b) as the library call ``evidence_pipeline.authoring.prepare.prepare`` in a fresh process,
each with its peak RSS; one more library run under tracemalloc gives the peak of Python allocations.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

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


def phase(root: str, trace: bool) -> None:
    from evidence_pipeline.authoring.prepare import prepare

    result, m = measure(lambda: prepare(Path(root), backend="structural"), trace=trace)
    print(json.dumps({**m, "status": result.status, "model_calls": result.model_calls,
                      "sources": len(result.sources)}))


def build(dest: Path, sources: int) -> float:
    rng = random.Random(3)
    sentences = italian_sentences()
    notes = {}
    for i in range(sources):
        lines = [f"# Nota {i:04d}", ""]
        for j in range(rng.randint(1, 3)):
            lines += [f"## Sezione {i:04d}-{j}", "",
                      " ".join(rng.sample(sentences, rng.randint(1, 4))), ""]
        notes[f"area-{i % 20:02d}/nota-{i:04d}.md"] = "\n".join(lines)
    source_workspace(dest, "workspace_id: noop\nlanguage: italian\nmodel:\n  backend: structural\n",
                     "bench/prepare_noop.py\n", notes)
    _, first = tht("evidence", "prepare", str(dest), "--backend", "structural")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "prepared")
    return first


def main(argv: Sequence[str] | None = None) -> int:
    if ran_as_phase(argv, phase):
        return 0
    ap = arguments(__doc__)
    ap.add_argument("--sources", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3, help="no-op runs (the best is kept)")
    ap.add_argument("--no-tracemalloc", action="store_true",
                    help="skip the extra run under tracemalloc (Python allocation peak)")
    args = ap.parse_args(argv)
    info = machine()
    work = Path(tempfile.mkdtemp(prefix="tht-noop-"))
    try:
        root = work / "ws"
        log(f"[prepare_noop] building and preparing {args.sources} sources")
        first = build(root, args.sources)
        log(f"[prepare_noop] first prepare: {first:.1f}s")
        cli = []
        for _ in range(args.repeat):
            doc, secs = tht("evidence", "prepare", str(root), "--backend", "structural")
            assert doc["status"] == "unchanged" and doc["model_calls"] == 0, doc
            cli.append(secs)
        cli_rss = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
        lib = [run_phase(HERE, str(root)) for _ in range(args.repeat)]
        # tracemalloc slows Python several times: its own run, only for the allocation peak
        traced = None if args.no_tracemalloc else run_phase(HERE, str(root), "--trace")
        assert all(r["status"] == "unchanged" for r in lib), lib
        clean = git(root, "status", "--porcelain").strip() == ""
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = min(lib, key=lambda r: r["seconds"])
    report = {"benchmark": "prepare no-op", "machine": info, "sources": args.sources,
              "first_prepare_s": round(first, 2),
              # runs[0] is the first no-op after the prepare, which filled the unit cache in
              # .tht/ with the files it wrote: it is warm too (cli_noop_cold_s in --json)
              "cli_noop_s": {"best": round(min(cli), 3), "runs": [round(x, 3) for x in cli]},
              "noop_over_first": round(min(cli) / first, 3),
              "cli_peak_rss_mib": cli_rss,
              "library_noop": best, "library_runs_s": [r["seconds"] for r in lib],
              "tracemalloc_peak_mib": traced and traced["tracemalloc_peak_mib"],
              "tree_unchanged": clean}
    summary = {"sources": args.sources, "first_prepare_s": report["first_prepare_s"],
               "cli_noop_s": report["cli_noop_s"]["best"],
               "cli_noop_cold_s": report["cli_noop_s"]["runs"][0],
               "noop_over_first": round(min(cli) / first, 3),
               "library_noop_s": best["seconds"],
               "peak_rss_mib": best["peak_rss_mib"],
               "tracemalloc_peak_mib": report["tracemalloc_peak_mib"]}

    def human() -> str:
        rows = [["CLI `tht evidence prepare` (process start included)", min(cli), cli_rss],
                ["library prepare() (fresh process)", best["seconds"], best["peak_rss_mib"]]]
        lines = [table(["no-op prepare on unchanged sources", "seconds", "peak RSS MiB"], rows,
                       f"{args.sources} unchanged sources (first prepare: {first:.1f}s); "
                       f"work tree unchanged: {clean}")]
        if traced:
            lines.append(f"Python allocation peak (tracemalloc, separate run): "
                         f"{traced['tracemalloc_peak_mib']} MiB")
        return "\n".join(lines)

    return finish("prepare_noop.json", report, summary, human, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
