"""The one lock primitive of the pipeline, and the workspace's authoring lock built on it.

An OS file lock (``flock``): released by the kernel when the process dies, so a kill -9 never
leaves a stale lock behind. ``workspace_lock`` keeps to one authoring command per workspace
(prepare, resolve, recover, the imports); ``publishing.publish.publish_lock`` keeps to one
publisher per state directory. Both take ``exclusive_lock``.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from evidence_pipeline.state import ensure_state_dir
from evidence_runtime.errors import ErrorCode, EvidenceError

AUTHORING_LOCK = "authoring.lock"

_held: dict[str, tuple[int, int]] = {}  # reentrant locks held by this process: path -> (fd, depth)
_held_guard = threading.Lock()


@contextmanager
def exclusive_lock(path: Path, *, holder: str, busy: Callable[[str], Exception],
                   reentrant: bool = False) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` or raise ``busy(<who holds it>)`` at once.

    The holder text (``holder``) is written into the file so that a refused process can say who
    holds it. ``reentrant``: a process that already holds the lock takes it again (depth counted,
    released by the last exit); otherwise a second take in the same process is refused too, as
    ``flock`` works per open file description.
    """
    key = str(path)
    with _held_guard:
        held = _held.get(key) if reentrant else None
        if held is None:
            fd = _take(path, holder=holder, busy=busy)
            held = (fd, 0)
        if reentrant:
            _held[key] = (held[0], held[1] + 1)
    try:
        yield
    finally:
        if not reentrant:
            os.close(held[0])  # closing the descriptor releases the flock
        else:
            with _held_guard:
                fd, depth = _held.pop(key)
                if depth > 1:
                    _held[key] = (fd, depth - 1)
                else:
                    os.close(fd)


def _take(path: Path, *, holder: str, busy: Callable[[str], Exception]) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise EvidenceError(f"cannot open the lock file: {exc.strerror}", path=str(path),
                            code=ErrorCode.lock_unavailable) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        found = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
        os.close(fd)
        raise busy(found or "another process") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{holder}, pid {os.getpid()}".encode(), 0)
    return fd


@contextmanager
def workspace_lock(state_dir: Path, *, what: str) -> Iterator[None]:
    """Hold the workspace's authoring lock or refuse at once with a clear message."""
    ensure_state_dir(state_dir)  # state_dir_unwritable naming it when it cannot be written

    def busy(holder: str) -> EvidenceError:
        # workspace_busy: refused at once, nothing was changed
        return EvidenceError(
            f"another authoring command is running on this workspace ({holder}); "
            f"{what} refused, try again when it has finished", code=ErrorCode.workspace_busy,
            path=str(state_dir.parent))

    with exclusive_lock(state_dir / AUTHORING_LOCK, holder=what, busy=busy):
        yield
