"""The embedded engine: a Qdrant Edge shard in a directory, opened for reading.

BM25 tokens come from Edge's ``Bm25`` embedder, documented to produce the same token ids and
formula as the server's ``qdrant/bm25`` (k=1.2, b=0.75, avg_len=256 on both sides). The
publisher's writer (``evidence_pipeline.publishing.index_writer``) extends :class:`EdgeIndex`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any, Self

import qdrant_edge as qe

from evidence_runtime.errors import (
    DiskFullError,
    IndexError_,
    IndexLockedError,
    IndexMissingError,
    IndexUnavailableError,
)
from evidence_runtime.index.base import (
    BM25_VECTOR,
    DENSE_VECTOR,
    SCROLL_PAGE,
    Bm25Settings,
    EvidenceIndex,
    Hit,
    Match,
    PointCounts,
    ScrollPage,
    Search,
    as_floats,
    bm25_model,
    cached_bm25,
    check_match,
)

__all__ = [
    "DEFAULT_LOCK_WAIT_S",
    "EDGE_CONFIG_FILE",
    "EdgeIndex",
    "copy_sparse",
    "edge_filter",
    "edge_open_error",
    "shard_exists",
    "shard_lock",
    "shard_space",
]

EDGE_CONFIG_FILE = "edge_config.json"
# How long an open waits for another process to release the shard (``index.lock_wait_s``): a
# maintenance step (an upload, an evaluation, a search in another process) holds it for a
# moment, and a short wait hides that from searchers instead of answering index_locked.
DEFAULT_LOCK_WAIT_S = 5.0
LOCK_POLL_S = 0.02
_COPY_CHUNK = 1 << 20  # copy_sparse reads a data region in pieces of this size
# Room an open needs beyond the shard's holes: the engine may start a write-ahead-log segment
# (a 32 MiB sparse file it maps and writes into) when it loads the shard.
OPEN_MARGIN_BYTES = 32 << 20


def edge_filter(match: Match, *extra: Any) -> qe.Filter | None:
    """The Edge filter of ``match`` and the ``extra`` conditions (None when both are empty)."""
    must: list[Any] = [
        qe.FieldCondition(key=field, match=qe.MatchAny(value) if is_any else qe.MatchValue(value))
        for field, value, is_any in check_match(match)
    ]
    must.extend(extra)
    return qe.Filter(must=must) if must else None


def edge_open_error(exc: Exception, path: Path, *, waited: float = 0.0) -> IndexError_:
    """The typed error of a failed open: another process holds the shard (still after
    ``waited`` seconds), or it is unusable."""
    message = str(exc)
    if "WouldBlock" in message:
        return _locked_error(path, waited)
    return IndexUnavailableError(f"cannot open the embedded index: {message}", path=str(path))


def _locked_error(path: Path, waited: float) -> IndexLockedError:
    after = f"; still after waiting {waited:g} s (index.lock_wait_s)" if waited else ""
    return IndexLockedError(
        "the embedded index is open in another process (Qdrant Edge allows one process "
        f"at a time){after}; close it there, or point the workspace at a Qdrant server",
        path=str(path),
    )


def shard_lock(path: Path, lock_wait_s: float = 0.0) -> int:
    """Take the exclusive ``flock`` on ``<shard>.lock`` (beside the shard directory) that every
    open of the shard holds until the shard is closed; returns its descriptor (close it to
    release). :class:`IndexLockedError` when another open holds it longer than ``lock_wait_s``.

    The engine's own lock covers only the shard's WAL, taken partway through a load and dropped
    partway through a close: without this one, a process could load the segments while another
    was still writing them (seen as points without their payload in a search during a
    publication). Released by the kernel when the process dies, so never stale.
    """
    lock_path = path.with_name(path.name + ".lock")
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise IndexUnavailableError(f"cannot open the index lock: {exc.strerror}",
                                    path=str(lock_path)) from None
    deadline = time.monotonic() + max(lock_wait_s, 0.0)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                os.close(fd)
                raise _locked_error(path, lock_wait_s) from None
        except OSError as exc:
            os.close(fd)
            raise IndexUnavailableError(f"cannot take the index lock: {exc.strerror}",
                                        path=str(lock_path)) from None
        time.sleep(min(LOCK_POLL_S, left))


def shard_exists(path: Path) -> bool:
    """Whether a shard was created at ``path`` (the engine writes its configuration file)."""
    return (path / EDGE_CONFIG_FILE).is_file()


def shard_space(path: Path) -> tuple[int, int]:
    """``(holes, free)``: the bytes of the shard's files at ``path`` that no disk block backs
    yet (apparent size minus allocated size: Qdrant maps sparse files and writes into them),
    and the bytes free on its filesystem for this user."""
    holes = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue  # removed meanwhile
            holes += max(st.st_size - st.st_blocks * 512, 0)
    vfs = os.statvfs(path)
    return holes, vfs.f_bavail * vfs.f_frsize


def check_shard_space(path: Path, *, margin: int = OPEN_MARGIN_BYTES) -> None:
    """:class:`DiskFullError` unless the filesystem of the shard at ``path`` has room for every
    hole of its files (plus ``margin``): touching a hole with no space left raises SIGBUS, which
    kills the whole process, the application that imported the runtime included."""
    holes, free = shard_space(path)
    if free < holes + margin:
        mib = 1 << 20
        raise DiskFullError(
            f"the filesystem of the embedded index has {free / mib:.1f} MiB free, and the "
            f"engine may need up to {(holes + margin) / mib:.1f} MiB (its files are sparse and "
            "it writes into them); free some space, or move the index (index.path)",
            path=str(path))


def copy_sparse(src: str, dst: str) -> str:
    """``shutil.copy2`` that writes only the data regions of ``src`` (found with ``SEEK_DATA`` /
    ``SEEK_HOLE``) and leaves its holes holes; a plain copy where the system cannot tell."""
    seek_data: int | None = getattr(os, "SEEK_DATA", None)
    seek_hole: int | None = getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return shutil.copy2(src, dst)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fin.fileno(), pos, seek_data)
            except OSError as exc:  # ENXIO: nothing but a hole after pos
                if exc.errno == errno.ENXIO:
                    break
                raise
            end = os.lseek(fin.fileno(), start, seek_hole)
            fin.seek(start)
            fout.seek(start)
            left = end - start
            while left > 0:
                chunk = fin.read(min(left, _COPY_CHUNK))
                if not chunk:
                    break
                fout.write(chunk)
                left -= len(chunk)
            pos = end
        fout.truncate(size)
    shutil.copystat(src, dst)
    return dst


def _hits(points: Sequence[qe.ScoredPoint]) -> list[Hit]:
    return [Hit(str(p.id), p.score, dict(p.payload or {})) for p in points]


class EdgeIndex(EvidenceIndex):
    """A Qdrant Edge shard (the embedded default), read-only.

    The shard takes an exclusive lock: while this object is open no other process can open the
    same directory (:class:`IndexLockedError`); :meth:`close` releases it.
    """

    def __init__(
        self, path: Path, shard: qe.EdgeShard | None, *, language: str, bm25: qe.Bm25
    ) -> None:
        """Use :meth:`open`."""
        self.path = path
        self.language = language
        self._shard = shard
        self._closed = False
        self._bm25 = bm25  # built once: the per-query cost is only tokenizing the text
        self._bm25_models: dict[Bm25Settings, qe.Bm25] = {}  # other generations' settings
        self._lock_fd: int | None = None  # shard_lock's, held while the shard is open

    @classmethod
    def open(
        cls, path: Path | str, *, language: str = "italian", lock_wait_s: float = 0.0
    ) -> Self:
        """Open the existing shard at ``path``: :class:`IndexMissingError` (an
        :class:`IndexUnavailableError`) when there is none, :class:`IndexLockedError` when
        another process holds it for longer than ``lock_wait_s`` seconds (until then the
        open is retried every few milliseconds)."""
        path = Path(path)
        bm25 = bm25_model(language)  # a bad language fails before any file is touched
        if not shard_exists(path):
            raise IndexMissingError("no embedded index at this path", path=str(path))
        check_shard_space(path)  # before the engine maps anything: never a SIGBUS
        started = time.monotonic()
        fd = shard_lock(path, lock_wait_s)
        try:
            left = max(lock_wait_s - (time.monotonic() - started), 0.0)
            index = cls(path, cls._load(path, left), language=language, bm25=bm25)
        except BaseException:
            os.close(fd)
            raise
        index._lock_fd = fd
        return index

    @staticmethod
    def _load(path: Path, lock_wait_s: float = 0.0) -> qe.EdgeShard:
        deadline = time.monotonic() + max(lock_wait_s, 0.0)
        while True:
            try:
                return qe.EdgeShard.load(str(path))
            except Exception as exc:  # the binding raises plain Exception for engine errors
                error = edge_open_error(exc, path, waited=lock_wait_s)
                left = deadline - time.monotonic()
                if not isinstance(error, IndexLockedError) or left <= 0:
                    raise error from exc
            time.sleep(min(LOCK_POLL_S, left))

    def _live(self) -> qe.EdgeShard:
        if self._closed:
            raise IndexUnavailableError("the embedded index was closed", path=str(self.path))
        if self._shard is None:
            raise IndexUnavailableError(
                "the embedded index does not exist yet (publish a generation first)",
                path=str(self.path),
            )
        return self._shard

    @contextlib.contextmanager
    def _engine(self, what: str) -> Generator[None, None, None]:
        try:
            yield
        except Exception as exc:  # the binding raises plain Exception/ValueError for the engine
            raise IndexError_(f"{what} failed: {exc}", path=str(self.path)) from exc

    def count(self, match: Match) -> int:
        shard = self._live()
        with self._engine("counting points"):
            return shard.count(qe.CountRequest(exact=True, filter=edge_filter(match)))

    def point_counts(self, match: Match, *, payload_fields: Sequence[str] = ()) -> PointCounts:
        shard = self._live()

        def count(*extra: Any) -> int:
            return shard.count(qe.CountRequest(exact=True, filter=edge_filter(match, *extra)))

        with self._engine("counting points"):
            points = count()
            dense = count(qe.HasVectorCondition(DENSE_VECTOR))
            sparse = count(qe.HasVectorCondition(BM25_VECTOR))
            lacking = max((count(qe.IsEmptyCondition(f)) for f in payload_fields), default=0)
        return PointCounts(points, dense, sparse, points - min(lacking, points))

    def _scroller(self, match: Match) -> ScrollPage:
        shard = self._live()
        flt = edge_filter(match)

        def page(offset: Any) -> tuple[list[str], Any]:
            records, after = shard.scroll(qe.ScrollRequest(
                offset=offset, limit=SCROLL_PAGE, filter=flt, with_payload=False,
                with_vector=False))
            return [str(r.id) for r in records], after
        return page

    def _search(self, search: Search) -> list[Hit]:
        shard = self._live()
        flt = edge_filter(search.match)
        tokens = cached_bm25(self._bm25_models, self._bm25, search.bm25)
        dense, text, limit = search.dense, search.text, search.limit
        if search.mode == "dense":
            assert dense is not None
            request = qe.QueryRequest(
                limit=limit, query=qe.Query.Nearest(as_floats(dense)), filter=flt,
                with_payload=True,
            )
        else:
            assert text is not None
            request = qe.QueryRequest(
                limit=limit,
                query=qe.Query.Nearest(tokens.embed_query(text), using=BM25_VECTOR),
                filter=flt,
                with_payload=True,
            )
        with self._engine("searching"):
            return _hits(shard.query(request))

    def _query_terms(self, text: str, bm25: Bm25Settings | None) -> int:
        return len(cached_bm25(self._bm25_models, self._bm25, bm25).embed_query(text).indices)

    def copy_to(self, dest: Path | str) -> None:
        """Copy the shard's files to ``dest`` (a new directory) while this process holds the
        shard, so nobody writes meanwhile: a private copy that another reader can open and
        query at leisure while this one closes the shard at once. The shard's files are mostly
        holes (the demo's: 1.4 MB of data in 250 MB): the copy keeps them holes."""
        self._live()
        shutil.copytree(self.path, dest, copy_function=copy_sparse)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        shard, self._shard = self._shard, None
        try:
            if shard is not None:
                with contextlib.suppress(Exception):
                    shard.flush()
                shard.close()
        finally:
            fd, self._lock_fd = self._lock_fd, None
            if fd is not None:
                os.close(fd)  # only once the engine has let go of every file
