"""``tht workspace activate`` (spec §7.2, §13.2): record the revision to publish; a retained
generation of that revision becomes active again at once (explicit rollback)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evidence_pipeline.gitrepo import require_clean, resolve_revision
from evidence_pipeline.publishing.guard import PublishError, open_registry, publish_lock
from evidence_runtime.errors import EvidenceError, IndexMissingError
from evidence_runtime.index import open_index
from evidence_runtime.registry import Generation
from evidence_runtime.search import index_config, missing_points
from evidence_runtime.workspace import Workspace, load_workspace


@dataclass
class ActivationResult:
    revision: str
    reactivated_generation: int | None


def activate(root: Workspace | Path | str, *, revision: str | None = None) -> ActivationResult:
    """Record the activated revision (default: HEAD of a clean tree) of the workspace at
    ``root`` (or of a loaded :class:`Workspace`).

    When a retained generation of that revision exists, it becomes active again at once
    (explicit rollback, §13.2) without re-indexing, once its points are counted in the index,
    under the publish lock (so a concurrent retention cannot delete them meanwhile). When the
    index has lost them (lost or rebuilt since), the revision is activated all the same
    (Evidence is unavailable until it is published again), the generation is recorded as no
    longer retained, and :class:`PublishError` ``generation_missing`` says so.
    """
    ws = root if isinstance(root, Workspace) else load_workspace(root)
    if revision is None:
        require_clean(ws.root, (), what="activate HEAD")
        sha = resolve_revision(ws.root, "HEAD")
    else:
        sha = resolve_revision(ws.root, revision)
    wid = ws.config.workspace_id
    with publish_lock(ws), open_registry(ws) as registry:
        previous = registry.latest_generation_for_revision(wid, sha)
        if previous is not None and not previous.counts.get("points_retained", True):
            previous = None
        lost = None if previous is None else _lost_points(ws, previous)
        registry.activate_revision(wid, sha)
        if previous is None:
            return ActivationResult(sha, None)
        if lost is not None:
            registry.update_generation(wid, previous.number,
                                       counts={**previous.counts, "points_retained": False})
            raise PublishError(
                f"revision {sha[:12]} is activated, but its generation {previous.number} cannot "
                f"be reactivated: {lost}. Evidence is unavailable until `tht workspace "
                "preprocess evidence` publishes the revision again", code="generation_missing",
                path=str(ws.root))
        registry.activate_generation(wid, previous.number)
    return ActivationResult(sha, previous.number)


def _lost_points(ws: Workspace, generation: Generation) -> str | None:
    """Why the index no longer holds ``generation``'s points, or None when it does. An index
    that cannot be read now (locked, unreachable) refuses the activation: nothing changes."""
    try:
        index = open_index(index_config(ws), language=ws.config.language)
    except IndexMissingError as exc:
        return f"the index is gone ({exc})"
    except EvidenceError as exc:
        raise PublishError(f"cannot check that generation {generation.number} still has its "
                           f"points: {exc}", code=exc.code, path=str(ws.root)) from exc
    try:
        return missing_points(index, ws.config.workspace_id, generation)
    except EvidenceError as exc:
        raise PublishError(f"cannot check that generation {generation.number} still has its "
                           f"points: {exc}", code=exc.code, path=str(ws.root)) from exc
    finally:
        index.close()
