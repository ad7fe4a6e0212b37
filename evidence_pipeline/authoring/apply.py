"""All-or-nothing application of a batch of file changes to the work tree (spec §5.5).

A batch is staged completely beside the work tree (``.tht/staging/<name>/``): the new bytes of
every file it writes, a copy of every file it replaces or deletes, and a plan giving each file's
hash before and after. The commit point is one atomic rename of the marker ``COMMITTED``; only
then are the files swapped in, each by an atomic ``os.replace``. Then the batch directory is
renamed away in one atomic step (``<name>.applied``) and only then deleted.

- A crash before the commit point leaves the tree untouched; the next run discards the staging.
- A crash after it is rolled forward by the next run (:func:`recover`), but only over files that
  are still exactly as they were when the batch was staged. A file changed since (a curator's
  uncommitted edit) stops recovery with ``recovery_conflict``, naming the file and
  keeping both the edit and the batch, until :func:`finish` or :func:`drop` settles it
  (``tht evidence recover``).
- A crash during the cleanup leaves ``<name>.applied``: the batch is applied, and the next run
  reports it as completed.
So any crash ends as untouched, or as applied and reported, never mixed and never over an edit.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from evidence_runtime.errors import ErrorCode, EvidenceError
from evidence_runtime.workspace import STATE_DIR_NAME

STAGING = "staging"
PLAN = "plan.json"
COMMITTED = "COMMITTED"
APPLIED = ".applied"  # a batch directory renamed away after its apply, being deleted
DISCARDED = ".discarded"  # a batch directory renamed away unapplied, being deleted
CONFLICTS = "conflicts"  # <state>/conflicts/<batch>/<path>: edits set aside by ``finish``

# Test hook: called with a step name at each step of the apply (fault injection).
_STEP_HOOK: Callable[[str], None] | None = None
# ``THT_FAULT_APPLY_STEP=<step>`` kills the process (-9) there; the steps, in order:
# stage_file, before_commit, after_commit, swap_file, delete_file, before_cleanup, during_cleanup


def recovery_conflict(root: Path, batch: str, paths: list[str]) -> EvidenceError:
    """A staged batch would replace files changed since it was staged; nothing was changed."""
    more = f" (and {len(paths) - 1} more: {', '.join(paths[1:])})" if len(paths) > 1 else ""
    return EvidenceError(
        f"changed since the interrupted batch {batch} was staged{more}; nothing was "
        f"changed, the edit and the batch are both kept. Keep the edit and drop the batch "
        f"with `tht evidence recover {root} --drop`, or apply the batch over it with "
        f"`tht evidence recover {root} --finish` (the edited file is first copied to "
        f"{STATE_DIR_NAME}/{CONFLICTS}/{batch}/)", code=ErrorCode.recovery_conflict, path=paths[0])


@dataclass
class Batch:
    """Files to write (path relative to the workspace root → bytes) and files to delete."""

    writes: dict[str, bytes] = field(default_factory=dict)
    deletes: set[str] = field(default_factory=set)
    # written path → the source file its unit comes from (relative to evidence/), for messages
    origins: dict[str, str] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not self.writes and not self.deletes


class PendingBatch(BaseModel):
    """A batch an interrupted run left in the staging area, as :func:`inspect` finds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    # "staged" (never committed) | "committed" (to finish or drop) | "applied" | "discarded"
    # (the last two: its deletion was interrupted)
    state: str
    files: int  # files the batch writes or deletes
    done: int  # of those, already swapped in or deleted
    conflicts: list[str]  # files changed since the batch was staged, not yet replaced


def _step(name: str) -> None:
    hook = _STEP_HOOK
    if hook is not None:
        hook(name)
    env = os.environ.get("THT_FAULT_APPLY_STEP")
    if env and env == name:
        os.kill(os.getpid(), 9)


def _digest(data: bytes | None) -> str | None:
    return None if data is None else "sha256:" + hashlib.sha256(data).hexdigest()


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() and not path.is_symlink() else None


def _current(path: Path) -> str | None:
    """The hash of a work-tree file as a plan records it (None: absent; a symlink or directory
    is never the file a plan saw)."""
    if path.is_symlink() or path.is_dir():
        return "not a regular file"
    return _digest(_read(path))


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


def _replace_durable(target: Path, data: bytes) -> None:
    """Write ``target`` atomically (a temporary file beside it, then one rename)."""
    tmp = target.with_name(f".{target.name}.tht-tmp")
    _write_durable(tmp, data)
    os.replace(tmp, target)


def staging_root(local_dir: Path) -> Path:
    return local_dir / STAGING


def pending(local_dir: Path) -> list[Path]:
    """Staged batches left by an interrupted run (committed or not, or being deleted)."""
    root = staging_root(local_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir())


def _base_name(batch_dir: Path) -> str:
    return batch_dir.name.removesuffix(APPLIED).removesuffix(DISCARDED)


def _retire(batch_dir: Path, suffix: str) -> None:
    """Rename the batch directory away in one atomic step, then delete it: a crash in between
    leaves ``<name><suffix>``, whose fate is known, never a half-deleted batch."""
    gone = batch_dir.with_name(batch_dir.name + suffix)
    if gone.exists():
        shutil.rmtree(gone, ignore_errors=True)
    os.replace(batch_dir, gone)
    _fsync_dir(batch_dir.parent)
    if suffix == APPLIED:
        (gone / COMMITTED).unlink(missing_ok=True)
        _step("during_cleanup")
    shutil.rmtree(gone, ignore_errors=True)


def _plan(batch_dir: Path) -> list[dict[str, Any]]:
    ops = json.loads((batch_dir / PLAN).read_text(encoding="utf-8"))["ops"]
    return list(ops)


def _done(root: Path, batch_dir: Path, op: dict[str, Any]) -> bool:
    if op["op"] == "write":  # the staged file is moved in by the swap
        return not (batch_dir / "files" / op["staged"]).exists()
    target = root / op["path"]
    return not (target.exists() or target.is_symlink())


def _conflicts(root: Path, batch_dir: Path, ops: list[dict[str, Any]]) -> list[str]:
    """Files a committed plan has still to replace or delete that changed since it was staged.

    A plan staged before hashes were recorded (no ``before``) is trusted as it is.
    """
    return [op["path"] for op in ops
            if "before" in op and not _done(root, batch_dir, op)
            and _current(root / op["path"]) != op["before"]]


def inspect(root: Path, local_dir: Path) -> list[PendingBatch]:
    """What is left in the staging area, and which of its files were edited since (read-only)."""
    out: list[PendingBatch] = []
    for batch_dir in pending(local_dir):
        name = _base_name(batch_dir)
        if batch_dir.name.endswith((APPLIED, DISCARDED)):
            state = "applied" if batch_dir.name.endswith(APPLIED) else "discarded"
            out.append(PendingBatch(name=name, state=state, files=0, done=0, conflicts=[]))
            continue
        committed = (batch_dir / COMMITTED).is_file()
        try:
            ops = _plan(batch_dir)
        except (OSError, ValueError, KeyError):
            ops = []  # staged before its plan was written: nothing was committed
        if not committed:
            out.append(PendingBatch(name=name, state="staged", files=len(ops), done=0,
                                    conflicts=[]))
            continue
        done = sum(_done(root, batch_dir, op) for op in ops)
        out.append(PendingBatch(name=name, state="committed", files=len(ops), done=done,
                                conflicts=_conflicts(root, batch_dir, ops)))
    return out


def recover(root: Path, local_dir: Path) -> list[str]:
    """Finish committed batches, discard uncommitted ones; returns what was done, per batch.

    Raises ``recovery_conflict`` (and changes nothing of that batch) when a committed
    batch would replace a file changed since it was staged.
    """
    done: list[str] = []
    for batch_dir in pending(local_dir):
        name = _base_name(batch_dir)
        if batch_dir.name.endswith(APPLIED):
            shutil.rmtree(batch_dir, ignore_errors=True)
            done.append(f"completed interrupted apply {name}")
        elif batch_dir.name.endswith(DISCARDED):
            shutil.rmtree(batch_dir, ignore_errors=True)
            done.append(f"discarded unfinished staging {name}")
        elif (batch_dir / COMMITTED).is_file():
            _apply_plan(root, batch_dir)
            _retire(batch_dir, APPLIED)
            done.append(f"completed interrupted apply {name}")
        else:
            _retire(batch_dir, DISCARDED)
            done.append(f"discarded unfinished staging {name}")
    return done


def finish(root: Path, local_dir: Path, batch_dir: Path) -> list[str]:
    """Apply a committed batch even over files changed since it was staged; each such file is
    first copied to ``<local_dir>/conflicts/<batch>/<path>``. Returns those copies."""
    ops = _plan(batch_dir)
    saved: list[str] = []
    for rel in _conflicts(root, batch_dir, ops):
        data = _read(root / rel)
        if data is None:
            continue  # deleted (or not a regular file): nothing to set aside
        copy = local_dir / CONFLICTS / batch_dir.name / rel
        _write_durable(copy, data)
        saved.append(str(copy.relative_to(root)) if copy.is_relative_to(root) else str(copy))
    _apply_plan(root, batch_dir, force=True)
    _retire(batch_dir, APPLIED)
    return saved


def drop(root: Path, batch_dir: Path) -> tuple[list[str], list[str]]:
    """Discard a batch. Files it already replaced or deleted are put back as they were when it
    was staged, unless changed since (those are kept as they are). Returns (restored, kept)."""
    restored: list[str] = []
    kept: list[str] = []
    if (batch_dir / COMMITTED).is_file():
        for op in _plan(batch_dir):
            if "before" not in op or not _done(root, batch_dir, op):
                continue
            target = root / op["path"]
            expected_now = op.get("after") if op["op"] == "write" else None
            if _current(target) != expected_now:
                kept.append(op["path"])
                continue
            backup = batch_dir / "files" / op["backup"] if op.get("backup") else None
            if backup is not None and backup.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                _replace_durable(target, backup.read_bytes())
            elif op["before"] is None:
                target.unlink(missing_ok=True)
                _prune_empty_dirs(target.parent, root)
            else:
                kept.append(op["path"])
                continue
            restored.append(op["path"])
    _retire(batch_dir, DISCARDED)
    return restored, kept


def apply_batch(root: Path, local_dir: Path, batch: Batch, *, name: str) -> None:
    """Apply ``batch`` to the work tree at ``root`` all or nothing."""
    if batch.is_empty():
        return
    for rel in [*batch.writes, *batch.deletes]:
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise EvidenceError("refusing to write outside the workspace", path=rel,
                                code=ErrorCode.apply_failed)
    batch_dir = staging_root(local_dir) / name
    if batch_dir.exists():
        shutil.rmtree(batch_dir)
    files_dir = batch_dir / "files"
    try:
        ops: list[dict[str, Any]] = []
        targets = [("write", rel, data) for rel, data in sorted(batch.writes.items())]
        targets += [("delete", rel, None) for rel in sorted(batch.deletes)]
        for i, (kind, rel, data) in enumerate(targets):
            old = _read(root / rel)
            op: dict[str, Any] = {"op": kind, "path": rel, "before": _current(root / rel)}
            if old is not None:  # kept to put the file back if the batch is dropped
                op["backup"] = f"b{i:05d}"
                _write_durable(files_dir / op["backup"], old)
            if data is not None:
                op["staged"] = f"{i:05d}"
                op["after"] = _digest(data)
                _write_durable(files_dir / op["staged"], data)
                _step("stage_file")
            ops.append(op)
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
        raise EvidenceError(f"cannot stage the batch ({exc.strerror}); nothing was changed",
                            code=ErrorCode.apply_failed, path=str(batch_dir)) from None
    _fsync_dir(batch_dir)
    _step("after_commit")
    _apply_plan(root, batch_dir)
    _step("before_cleanup")
    _retire(batch_dir, APPLIED)


def _apply_plan(root: Path, batch_dir: Path, *, force: bool = False) -> None:
    """Idempotent roll-forward of a committed plan; first, unless ``force``, refuse with
    ``recovery_conflict`` if any file it has still to replace changed since staging."""
    ops = _plan(batch_dir)
    if not force:
        conflicts = _conflicts(root, batch_dir, ops)
        if conflicts:
            raise recovery_conflict(root, batch_dir.name, conflicts)
    touched_dirs: set[Path] = set()
    for op in ops:
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
