"""One authoring command at a time per workspace (prepare, resolve, imports).

An OS file lock (``flock``): released by the kernel when the process dies, so a kill -9 never
leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from evidence_pipeline.state import ensure_state_dir
from evidence_runtime.errors import EvidenceError


class WorkspaceBusyError(EvidenceError):
    code = "workspace_busy"


@contextmanager
def workspace_lock(state_dir: Path, *, what: str) -> Iterator[None]:
    """Hold the workspace's authoring lock or refuse at once with a clear message."""
    ensure_state_dir(state_dir)
    path = state_dir / "authoring.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            raise WorkspaceBusyError(
                f"another authoring command is running on this workspace ({holder}); "
                f"{what} refused, try again when it has finished",
                path=str(state_dir.parent),
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what}, pid {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)
