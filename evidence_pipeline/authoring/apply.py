"""All-or-nothing application of a batch of file changes to the work tree (spec §5.5).

A batch is staged completely beside the work tree (``.tht/staging/``) and described by a plan.
The commit point is one atomic rename of the plan to ``COMMITTED``; only then are the files
swapped in, each by an atomic ``os.replace``. A crash before the commit point leaves the tree
untouched (the staging area is discarded by the next run); a crash after it is rolled forward
by the next run (``recover``), so the tree ends unchanged or fully applied, never mixed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from evidence_runtime.errors import EvidenceError

STAGING = "staging"
PLAN = "plan.json"
COMMITTED = "COMMITTED"

# Test hook: called with a step name at each step of the apply (fault injection).
_STEP_HOOK: Callable[[str], None] | None = None


class ApplyError(EvidenceError):
    code = "apply_failed"


@dataclass
class Batch:
    """Files to write (path relative to the workspace root → bytes) and files to delete."""

    writes: dict[str, bytes] = field(default_factory=dict)
    deletes: set[str] = field(default_factory=set)

    def is_empty(self) -> bool:
        return not self.writes and not self.deletes


def _step(name: str) -> None:
    hook = _STEP_HOOK
    if hook is not None:
        hook(name)
    env = os.environ.get("THT_FAULT_APPLY_STEP")
    if env and env == name:
        os.kill(os.getpid(), 9)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def staging_root(local_dir: Path) -> Path:
    return local_dir / STAGING


def pending(local_dir: Path) -> list[Path]:
    """Staged batches left by an interrupted run (committed or not)."""
    root = staging_root(local_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir())


def recover(root: Path, local_dir: Path) -> list[str]:
    """Finish committed batches, discard uncommitted ones; returns what was done, per batch."""
    done: list[str] = []
    for batch_dir in pending(local_dir):
        if (batch_dir / COMMITTED).is_file():
            _apply_plan(root, batch_dir)
            done.append(f"completed interrupted apply {batch_dir.name}")
        else:
            done.append(f"discarded unfinished staging {batch_dir.name}")
        shutil.rmtree(batch_dir, ignore_errors=True)
    return done


def apply_batch(root: Path, local_dir: Path, batch: Batch, *, name: str) -> None:
    """Apply ``batch`` to the work tree at ``root`` all or nothing."""
    if batch.is_empty():
        return
    for rel in [*batch.writes, *batch.deletes]:
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise ApplyError("refusing to write outside the workspace", path=rel)
    batch_dir = staging_root(local_dir) / name
    if batch_dir.exists():
        shutil.rmtree(batch_dir)
    files_dir = batch_dir / "files"
    try:
        ops: list[dict[str, str]] = []
        for i, (rel, data) in enumerate(sorted(batch.writes.items())):
            staged = files_dir / f"{i:05d}"
            _write_durable(staged, data)
            ops.append({"op": "write", "path": rel, "staged": staged.name})
            _step("stage_file")
        for rel in sorted(batch.deletes):
            ops.append({"op": "delete", "path": rel})
        _write_durable(batch_dir / PLAN, json.dumps({"ops": ops}, indent=1).encode())
        _fsync_dir(files_dir if files_dir.exists() else batch_dir)
        _fsync_dir(batch_dir)
        _step("before_commit")
        # the commit point: one atomic rename (its marker is the last write that can fail on a
        # full disk: before the rename nothing is committed, so the batch is discarded)
        marker_tmp = batch_dir / (COMMITTED + ".tmp")
        _write_durable(marker_tmp, b"committed\n")
        os.replace(marker_tmp, batch_dir / COMMITTED)
    except OSError as exc:
        shutil.rmtree(batch_dir, ignore_errors=True)
        raise ApplyError(f"cannot stage the batch ({exc.strerror}); nothing was changed",
                         path=str(batch_dir)) from None
    _fsync_dir(batch_dir)
    _step("after_commit")
    _apply_plan(root, batch_dir)
    _step("before_cleanup")
    shutil.rmtree(batch_dir, ignore_errors=True)


def _apply_plan(root: Path, batch_dir: Path) -> None:
    """Idempotent roll-forward of a committed plan."""
    plan = json.loads((batch_dir / PLAN).read_text(encoding="utf-8"))
    touched_dirs: set[Path] = set()
    for op in plan["ops"]:
        target = root / op["path"]
        if op["op"] == "write":
            staged = batch_dir / "files" / op["staged"]
            if staged.exists():  # absent: already moved in by an earlier, interrupted run
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, target)
                touched_dirs.add(target.parent)
                _step("swap_file")
        else:
            if target.exists() or target.is_symlink():
                target.unlink()
                touched_dirs.add(target.parent)
                _step("delete_file")
            _prune_empty_dirs(target.parent, root)
    for d in touched_dirs:
        _fsync_dir(d)


def _prune_empty_dirs(directory: Path, root: Path) -> None:
    # kind directories emptied by a move are removed, but never above evidence/curated/<kind>
    while directory != root and directory.is_dir() and not any(directory.iterdir()):
        if directory.name == "curated" or directory.parent == root:
            return
        directory.rmdir()
        directory = directory.parent

