"""Failed searches during the nightly evaluation on the embedded engine (issue 17 item 8).

    python bench/maintenance_window.py                    # thoth.yaml's index.lock_wait_s (5 s)
    python bench/maintenance_window.py --lock-wait 0      # as before: no wait, index_locked
    python bench/maintenance_window.py --searches 40 --evaluations 3 --json

The demo workspace is published once (its vectors seeded from tests/data/demo-vectors.npz, so
nothing is embedded to publish it). Then a searcher process runs N searches, each through a
searcher of its own that opens the embedded shard, queries and closes it — as each CLI search or
a per-request searcher does — while this process runs the Dagster ``evaluate_active`` job (the
nightly evaluation, which holds the shard while it evaluates) back to back. Both sides use
``index.lock_wait_s`` (written into the copy's thoth.yaml with ``--lock-wait``). The table gives
the searches by outcome (target: 0 that are not ``available``), their latency, and the
evaluations (each must succeed). Exit status 1 when a search or an evaluation failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, arguments, log, machine, pct, table

QUESTIONS = ["Quali pazienti sono minorenni?", "Cosa significa il codice di dimissione T?",
             "Come si calcola la durata della degenza?", "Quali accessi al pronto soccorso "
             "sono codici rossi?"]
DROPPED_ENV = ("DAGSTER_HOME", "THT_STATE_DIR", "THT_REGISTRY_URL", "THT_QDRANT_URL",
               "THT_WORKSPACE")


def published_demo(dest: Path, lock_wait: float | None) -> Path:
    """The demo workspace, activated and published (its shipped vectors seeded)."""
    from evidence_pipeline.demo import create_demo_repo, git
    from evidence_pipeline.publishing.publish import activate, preprocess

    ws = create_demo_repo(dest)
    sys.path.insert(0, str(REPO))
    from tests import demo_vectors

    shipped = demo_vectors.load()
    if shipped is not None:
        (ws / ".tht").mkdir(exist_ok=True)
        shipped.write_into(ws / ".tht" / "vectors.sqlite3")
    if lock_wait is not None:
        descriptor = ws / "thoth.yaml"
        text = descriptor.read_text(encoding="utf-8")
        descriptor.write_text(text.replace("  engine: edge\n",
                                           f"  engine: edge\n  lock_wait_s: {lock_wait}\n"),
                              encoding="utf-8")
        git(ws, "add", "thoth.yaml")
        git(ws, "-c", "user.name=bench", "-c", "user.email=bench@thoth.invalid", "commit", "-qm",
            f"index.lock_wait_s: {lock_wait}")
    activate(ws)
    preprocess(ws)
    return ws


def searcher_process(ws: Path, searches: int, pause: float, go: Path, out: Path) -> None:
    """Run in the child process: wait for ``go``, then N searches, one searcher (one open of
    the shard) each; write one JSON line per search to ``out``."""
    from evidence_runtime.embeddings import make_embedder
    from evidence_runtime.search import EvidenceSearcher
    from evidence_runtime.workspace import load_workspace

    workspace = load_workspace(ws)
    cfg = workspace.config.embeddings
    embedder = make_embedder(cfg.model, max_chunk_chars=cfg.max_chunk_chars, threads=cfg.threads)
    embedder.embed_query("riscaldamento")  # the model is loaded before the clock starts
    while not go.exists():
        time.sleep(0.01)
    with out.open("w", encoding="utf-8") as f:
        for i in range(searches):
            started = time.perf_counter()
            with EvidenceSearcher.for_workspace(workspace, embedder=embedder) as searcher:
                outcome = searcher.search(QUESTIONS[i % len(QUESTIONS)], "sql_generation")
            f.write(json.dumps({"at": time.time(), "seconds": time.perf_counter() - started,
                                "status": outcome.status, "code": outcome.code,
                                "message": outcome.message}) + "\n")
            f.flush()
            time.sleep(pause)


def run(ws: Path, *, searches: int, pause: float, evaluations: int) -> dict[str, Any]:
    """Searches in another process while this one runs the nightly evaluation job; the
    figures. ``ws`` is a published workspace (it is used as it is)."""
    import dagster as dg

    from evidence_pipeline.definitions import defs
    from evidence_pipeline.orchestration.resources import (
        EmbedderResource,
        IndexResource,
        ModelBackendResource,
        WorkspaceResource,
    )

    tmp = Path(tempfile.mkdtemp(prefix="tht-window-"))
    go, out = tmp / "go", tmp / "searches.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    child = subprocess.Popen([sys.executable, __file__, "--searcher", str(ws), str(searches),
                              str(pause), str(go), str(out)], env=env)
    job = defs.resolve_job_def("evaluate_active")
    resources = {"workspace": WorkspaceResource(root=str(ws)), "index": IndexResource(),
                 "embedder": EmbedderResource(), "model": ModelBackendResource()}
    job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), resources=resources)  # warm
    runs: list[dict[str, Any]] = []
    go.touch()
    started = time.time()
    try:
        while len(runs) < evaluations or child.poll() is None:
            t = time.perf_counter()
            result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(),
                                            resources=resources, raise_on_error=False)
            failure = next((e.step_failure_data for e in result.all_events if e.is_step_failure),
                           None)
            runs.append({"success": result.success, "seconds": time.perf_counter() - t,
                         "failure": (failure.user_failure_data.description
                                     if failure and failure.user_failure_data
                                     else str(failure.error.message if failure and failure.error
                                              else ""))})
            if len(runs) >= evaluations and child.poll() is not None:
                break
    finally:
        child.wait(timeout=600)
    ended = time.time()
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    during = [r for r in rows if started <= r["at"] <= ended]
    outcomes = Counter(r["code"] or r["status"] for r in rows)
    latencies = [r["seconds"] for r in rows]
    return {
        "searches": len(rows),
        "searches_during_evaluations": len(during),
        "failed_searches": sum(r["status"] != "available" for r in rows),
        "outcomes": dict(sorted(outcomes.items())),
        "failures": sorted({f"{r['code']}: {r['message']}" for r in rows
                            if r["status"] != "available"}),
        "search_seconds": {"p50": round(pct(latencies, 50), 3),
                           "p95": round(pct(latencies, 95), 3),
                           "max": round(max(latencies, default=0.0), 3)},
        "evaluations": len(runs),
        "failed_evaluations": sum(not r["success"] for r in runs),
        "evaluation_seconds": [round(r["seconds"], 2) for r in runs],
        "evaluation_failures": sorted({r["failure"] for r in runs if not r["success"]}),
    }


def main() -> int:
    if sys.argv[1:2] == ["--searcher"]:
        ws, n, pause, go, out = sys.argv[2:7]
        searcher_process(Path(ws), int(n), float(pause), Path(go), Path(out))
        return 0
    parser = arguments(__doc__, json_help="the figures as one JSON document on stdout")
    parser.add_argument("--searches", type=int, default=40)
    parser.add_argument("--pause", type=float, default=0.05,
                        help="seconds between two searches (default 0.05)")
    parser.add_argument("--evaluations", type=int, default=3,
                        help="nightly evaluation runs at least (default 3)")
    parser.add_argument("--lock-wait", type=float, default=None,
                        help="index.lock_wait_s to write into thoth.yaml (default: unset)")
    args = parser.parse_args()
    for var in DROPPED_ENV:
        os.environ.pop(var, None)
    with tempfile.TemporaryDirectory(prefix="tht-window-ws-") as tmp:
        log("publishing the demo workspace…")
        ws = published_demo(Path(tmp) / "ws", args.lock_wait)
        log(f"{args.searches} searches in another process while evaluate_active runs…")
        figures = run(ws, searches=args.searches, pause=args.pause,
                      evaluations=args.evaluations)
    figures["lock_wait_s"] = "thoth.yaml default" if args.lock_wait is None else args.lock_wait
    figures["machine"] = machine()
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(table(["figure", "value"], [
            ["index.lock_wait_s", figures["lock_wait_s"]],
            ["searches (during the evaluations)",
             f"{figures['searches']} ({figures['searches_during_evaluations']})"],
            ["failed searches", figures["failed_searches"]],
            ["outcomes", ", ".join(f"{k} {v}" for k, v in figures["outcomes"].items())],
            ["search s p50 / p95 / max", " / ".join(str(v) for v in
                                                    figures["search_seconds"].values())],
            ["evaluations (failed)", f"{figures['evaluations']} "
                                     f"({figures['failed_evaluations']})"],
            ["evaluation s", ", ".join(map(str, figures["evaluation_seconds"]))],
        ]))
        for line in figures["failures"] + figures["evaluation_failures"]:
            print(f"  {line}")
    return 1 if figures["failed_searches"] or figures["failed_evaluations"] else 0


if __name__ == "__main__":
    sys.exit(main())
