"""A persistent cache of dense vectors, so that unchanged fragments are never embedded twice.

Keyed by ``sha256(model_id + "\\0" + text)``: the key derives from content and model identity,
so a changed text or another model is simply a miss. SQLite in WAL mode with a busy timeout:
Dagster runs steps in separate processes, which may share one cache file.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from evidence_runtime.errors import EmbedderError, EvidenceError

__all__ = [
    "CacheStats",
    "EmbeddingProgress",
    "PassageEmbedder",
    "VectorCache",
    "VectorCacheError",
    "cache_key",
    "embed_with_cache",
]

_DTYPE = np.dtype("<f4")  # stored little-endian float32, whatever the machine
_CHUNK = 500  # keys per SELECT, under SQLite's bound-variable limit everywhere
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class EmbeddingProgress:
    """How far the embedding of the passages the cache did not have is: ``done`` of
    ``total``. The CLI draws it as a progress bar, a Dagster step logs it as a line."""

    done: int
    total: int

    def line(self) -> str:
        percent = 100 * self.done // self.total if self.total else 100
        return f"embedding: {self.done}/{self.total} new fragment(s) ({percent}%)"


PROGRESS_BATCH = 16  # passages per embedding call when progress is reported (as fast: measured)


class VectorCacheError(EvidenceError):
    """The vector cache file cannot be opened, read or written."""

    code = "vector_cache_error"


class PassageEmbedder(Protocol):
    model_id: str
    dim: int

    def embed_passages(self, texts: list[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int


def cache_key(model_id: str, text: str) -> str:
    """The content key of one (model, text) pair."""
    return hashlib.sha256(f"{model_id}\0{text}".encode()).hexdigest()


CACHE_NAME = "vectors.sqlite3"


class VectorCache:
    """Vectors by (model, text) in one SQLite file; safe to share between threads."""

    @classmethod
    def in_state_dir(cls, state_dir: Path) -> VectorCache:
        """The workspace's vector cache (``<state dir>/vectors.sqlite3``)."""
        return cls(state_dir / CACHE_NAME)

    def __init__(self, path: str | Path, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                str(self.path), timeout=timeout, isolation_level=None, check_same_thread=False
            )
            self._conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            # A lost cache entry costs one re-embedding, so the cheaper sync level is enough.
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS vectors ("
                " key TEXT PRIMARY KEY, model_id TEXT NOT NULL, dim INTEGER NOT NULL,"
                " vector BLOB NOT NULL)"
            )
        except (sqlite3.Error, OSError) as exc:
            raise VectorCacheError(
                f"cannot open the vector cache: {exc}", path=str(self.path)
            ) from None

    def __enter__(self) -> VectorCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def stats(self) -> CacheStats:
        """Hits and misses counted by ``get_many`` on this object."""
        with self._lock:
            return CacheStats(hits=self._hits, misses=self._misses)

    def get_many(self, model_id: str, texts: Sequence[str]) -> dict[int, np.ndarray]:
        """Cached vectors by index in ``texts``; absent indexes are misses."""
        positions: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            positions.setdefault(cache_key(model_id, text), []).append(i)
        keys = list(positions)
        found: dict[int, np.ndarray] = {}
        with self._lock:
            try:
                for start in range(0, len(keys), _CHUNK):
                    chunk = keys[start : start + _CHUNK]
                    marks = ", ".join("?" for _ in chunk)
                    rows = self._conn.execute(
                        f"SELECT key, dim, vector FROM vectors WHERE model_id = ? "
                        f"AND key IN ({marks})",
                        (model_id, *chunk),
                    ).fetchall()
                    for key, dim, blob in rows:
                        if len(blob) != dim * _DTYPE.itemsize:
                            continue  # a damaged entry is a miss and will be overwritten
                        vector = np.frombuffer(blob, dtype=_DTYPE).astype(np.float32)
                        for i in positions[key]:
                            found[i] = vector
            except sqlite3.Error as exc:
                raise VectorCacheError(
                    f"cannot read the vector cache: {exc}", path=str(self.path)
                ) from None
            self._hits += len(found)
            self._misses += len(texts) - len(found)
        return found

    def put_many(self, model_id: str, texts: Sequence[str], vectors: np.ndarray) -> None:
        """Store one vector per text (rows of a ``(len(texts), dim)`` array), in one transaction."""
        if not texts:
            return
        array = np.asarray(vectors)
        if array.ndim != 2 or array.shape[0] != len(texts):
            raise VectorCacheError(
                f"expected {len(texts)} vectors as a 2-D array, got shape {array.shape}",
                path=str(self.path),
            )
        if not np.isfinite(array).all():
            raise VectorCacheError("refusing to cache non-finite vectors", path=str(self.path))
        dim = int(array.shape[1])
        rows = [
            (cache_key(model_id, text), model_id, dim, row.astype(_DTYPE).tobytes())
            for text, row in zip(texts, array, strict=True)
        ]
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    self._conn.executemany(
                        "INSERT OR REPLACE INTO vectors (key, model_id, dim, vector) "
                        "VALUES (?, ?, ?, ?)",
                        rows,
                    )
                except BaseException:
                    # SQLite may already have rolled back (SQLITE_FULL does): a second ROLLBACK
                    # would fail and hide the real error ("database or disk is full")
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise VectorCacheError(
                    f"cannot write the vector cache: {exc}", path=str(self.path)
                ) from None


def embed_with_cache(
    embedder: PassageEmbedder,
    texts: Sequence[str],
    cache: VectorCache,
    *,
    batch_size: int = 256,
    progress: Callable[[EmbeddingProgress], None] | None = None,
) -> tuple[np.ndarray, int]:
    """Vectors for ``texts`` as a ``(n, dim)`` float32 array, and how many texts were embedded.

    Only the distinct misses go to ``embedder.embed_passages``, in batches that are cached as
    soon as they are computed, so an interrupted run keeps its progress. ``progress`` hears
    how many of them are done, before the first batch and after each (batches of
    :data:`PROGRESS_BATCH` then).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if progress is not None:
        batch_size = min(batch_size, PROGRESS_BATCH)
    dim = int(embedder.dim)
    out = np.empty((len(texts), dim), dtype=np.float32)
    hits = cache.get_many(embedder.model_id, texts)
    for i, vector in hits.items():
        if vector.shape == (dim,):
            out[i] = vector
    missing: dict[str, list[int]] = {}
    for i, text in enumerate(texts):
        if i not in hits or hits[i].shape != (dim,):
            missing.setdefault(text, []).append(i)
    todo = list(missing)
    if progress is not None and todo:
        progress(EmbeddingProgress(0, len(todo)))
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        vectors = np.asarray(embedder.embed_passages(batch))
        if vectors.shape != (len(batch), dim):
            raise EmbedderError(
                f"embedder {embedder.model_id!r} returned shape {vectors.shape} for "
                f"{len(batch)} passages, expected ({len(batch)}, {dim})"
            )
        if not np.isfinite(vectors).all():
            raise EmbedderError(f"embedder {embedder.model_id!r} returned non-finite values")
        vectors = vectors.astype(np.float32, copy=False)
        cache.put_many(embedder.model_id, batch, vectors)
        for text, vector in zip(batch, vectors, strict=True):
            out[missing[text]] = vector
        if progress is not None:
            progress(EmbeddingProgress(start + len(batch), len(todo)))
    return out, len(todo)
