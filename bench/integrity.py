"""A damaged index and a full disk (issue 28 items 1-3): time to detect and to repair, and what
the checks cost.

    python bench/integrity.py                   # the demo, and a 10,000-point shard
    python bench/integrity.py --points 2000 --json

The demo workspace is published once (its vectors seeded from tests/data/demo-vectors.npz).
Then, for each damage of issue 28 (the shard's ``vector_storage``, ``vector_storage-bm25`` or
``payload_storage`` deleted), a copy of it is damaged and ``tht workspace check`` runs: the time
it takes to find the damage (``check_s``), then with ``--repair`` the time to rebuild the
generation from Git and the vector cache (``repair_s``), the fragments embedded again (target
0) and whether the repaired index answers the probe questions exactly as the intact one did.

Costs: the searcher's check of a generation, once per searcher and generation, as it was (one
count: ``missing_points``) and as it is (plus the counts per named vector and the payload fields
read back: ``damaged_points``), on the demo and on a synthetic shard of ``--points`` points; the
space check an open of the embedded shard makes (``check_shard_space``: a walk of its files);
and the shard's size on disk and apparent (unchanged by the check: no file is allocated).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, arguments, finish, log, machine, table
from maintenance_window import QUESTIONS, published_demo

DAMAGES = ("vector_storage", "vector_storage-bm25", "payload_storage")


def answers(ws: Path) -> list[tuple[str, list[str]]]:
    from evidence_runtime.search import EvidenceSearcher

    with EvidenceSearcher.for_workspace(ws) as searcher:
        out = []
        for q in QUESTIONS:
            o = searcher.search(q, "sql_generation")
            out.append((o.code or o.status, o.evidence_ids))
        return out


def damage_trial(demo: Path, work: Path, part: str, intact: list[Any]) -> dict[str, Any]:
    from evidence_pipeline.publishing.check import check_workspace
    from evidence_runtime.index.edge import copy_sparse
    from evidence_runtime.workspace import load_workspace

    ws = Path(shutil.copytree(demo, work / part, symlinks=True, copy_function=copy_sparse))
    for segment in (ws / ".tht" / "index" / "segments").iterdir():
        shutil.rmtree(segment / part)
    damaged = answers(ws)
    found = check_workspace(load_workspace(ws))
    repaired = check_workspace(load_workspace(ws), repair=True)
    return {"damage": part, "search_when_damaged": sorted({code for code, _ in damaged}),
            "findings": [f.code for f in found.findings], "detect_s": found.timings["check_s"],
            "status_after_repair": repaired.status,
            "repair_s": repaired.timings.get("repair_s"), "embedded": repaired.embedded,
            "same_answers": answers(ws) == intact}


def median_ms(fn: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def check_costs(label: str, shard: Path, generation: Any, wid: str, runs: int,
                ) -> dict[str, Any]:
    from evidence_runtime.index.edge import EdgeIndex, check_shard_space
    from evidence_runtime.search import damaged_points, missing_points

    with EdgeIndex.open(shard) as index:
        before = median_ms(lambda: missing_points(index, wid, generation), runs)
        after = median_ms(lambda: (missing_points(index, wid, generation),
                                   damaged_points(index, wid, generation)), runs)
    space = median_ms(lambda: check_shard_space(shard, margin=0), runs)
    return {"shard": label, "generation_check_before_ms": round(before, 3),
            "generation_check_after_ms": round(after, 3),
            "open_space_check_ms": round(space, 3)}


def synthetic_shard(dest: Path, points: int) -> tuple[Path, Any]:
    """A shard of ``points`` Evidence fragments of one generation (random 384-d vectors)."""
    import numpy as np

    from evidence_pipeline.publishing.index_writer import IndexPoint, open_index_writer
    from evidence_runtime.index import IndexConfig
    from evidence_runtime.registry import Generation, GenerationStatus

    rng = np.random.default_rng(28)
    vectors = rng.standard_normal((points, 384)).astype(np.float32)
    words = ["degenza", "reparto", "ricovero", "paziente", "dimissione", "triage", "codice"]
    batch = [IndexPoint(id=f"00000000-0000-5000-8000-{i:012d}", dense=vectors[i],
                        text=" ".join(words[(i + k) % len(words)] for k in range(30)),
                        payload={"workspace_id": "bench", "vector_generation": 1,
                                 "record_kind": "evidence_fragment",
                                 "evidence_id": f"evidence:u{i}", "evidence_kind": "domain",
                                 "source_file": "source/x.md", "source_sha256": "0" * 64,
                                 "text": "x" * 400, "title": f"u{i}"})
             for i in range(points)]
    path = dest / "shard"
    index = open_index_writer(IndexConfig(engine="edge", path=str(path)), dense_dim=384)
    try:
        index.ensure_schema(dense_dim=384)  # the payload indexes a publication creates
        index.upsert(batch)
    finally:
        index.close()
    gen = Generation(workspace_id="bench", number=1, revision="r",
                     status=GenerationStatus.active, config={},
                     counts={"fragments": points, "vectors": {"dense": points, "bm25": points}},
                     evaluation=None, created_at="", activated_at=None)
    return path, gen


def disk(path: Path) -> dict[str, float]:
    def du(*flags: str) -> float:
        out = subprocess.run(["du", "-s", "--block-size=1", *flags, str(path)],
                             capture_output=True, text=True, check=True).stdout
        return round(int(out.split()[0]) / 1e6, 1)

    return {"on_disk_mb": du(), "apparent_mb": du("--apparent-size")}


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--points", type=int, default=10_000,
                        help="points of the synthetic shard (default 10000)")
    parser.add_argument("--runs", type=int, default=20, help="repetitions of each timing")
    args = parser.parse_args(argv)
    from evidence_runtime.registry import Registry

    with tempfile.TemporaryDirectory(prefix="tht-integrity-") as tmp:
        work = Path(tmp)
        log("publishing the demo")
        demo = published_demo(work / "demo", None)
        intact = answers(demo)
        trials = []
        for part in DAMAGES:
            log(f"damage: {part}")
            trials.append(damage_trial(demo, work, part, intact))
        with Registry.open(f"sqlite:///{demo / '.tht' / 'registry.sqlite3'}") as reg:
            gen = reg.get_generation("psd", 1)
        costs = [check_costs("demo (80 points)", demo / ".tht" / "index", gen, "psd",
                             args.runs)]
        log(f"a synthetic shard of {args.points} points")
        shard, sgen = synthetic_shard(work, args.points)
        costs.append(check_costs(f"synthetic ({args.points} points)", shard, sgen, "bench",
                                 max(3, args.runs // 4)))
        sizes = {"demo .tht/index": disk(demo / ".tht" / "index"),
                 f"synthetic {args.points}": disk(shard)}
    document = {"machine": machine(), "commit": subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
        text=True, check=False).stdout.strip(), "damages": trials, "costs": costs,
        "sizes": sizes}

    def human() -> str:
        return "\n\n".join([
            table(["damage", "search when damaged", "findings", "detect s", "after repair",
                   "repair s", "embedded", "same answers"],
                  [[t["damage"], ",".join(t["search_when_damaged"]), ",".join(t["findings"]),
                    t["detect_s"], t["status_after_repair"], t["repair_s"], t["embedded"],
                    t["same_answers"]] for t in trials], "detect and repair (the demo)"),
            table(["shard", "generation check before ms", "after ms", "open space check ms"],
                  [[c["shard"], c["generation_check_before_ms"],
                    c["generation_check_after_ms"], c["open_space_check_ms"]] for c in costs],
                  "costs (median)"),
            table(["shard", "on disk MB", "apparent MB"],
                  [[k, v["on_disk_mb"], v["apparent_mb"]] for k, v in sizes.items()],
                  "size (the space check allocates nothing)")])

    ok = all(t["status_after_repair"] == "repaired" and t["same_answers"]
             and t["search_when_damaged"] == ["index_corrupt"] for t in trials)
    finish("integrity.json", document, {"damages": trials, "costs": costs, "sizes": sizes},
           human, args.json)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
