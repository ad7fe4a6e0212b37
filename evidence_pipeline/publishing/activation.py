"""``tht workspace activate`` (spec §7.2, §13.2): record the revision to publish; a retained
generation of that revision becomes active again at once (explicit rollback).
:func:`list_generations` (``tht workspace generations``) says which generations and revisions
such a rollback can reach."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evidence_pipeline.gitrepo import open_repo, require_clean, resolve_revision
from evidence_pipeline.publishing.guard import PublishError, open_registry, publish_lock
from evidence_runtime.errors import EvidenceError, IndexMissingError
from evidence_runtime.index import open_index
from evidence_runtime.registry import Generation, GenerationStatus, Registry
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


@dataclass(frozen=True)
class GenerationRow:
    """One generation as ``tht workspace generations`` lists it.

    ``state``: ``serving`` (active, built from the activated revision), ``active`` (active, but
    another revision is activated: the maintenance window of ``activate``), ``retained``
    (retired, its points kept: a rollback target), ``discarded`` (retired, its points deleted
    by retention), ``failed`` or ``candidate``. ``rollback``: ``tht workspace activate
    --revision <revision>`` would make this generation serve again at once (it is the newest
    retained generation of its revision, and it is not serving now).
    """

    number: int
    revision: str
    subject: str | None  # the commit's first line; None when the clone does not have it
    state: str
    active: bool
    rollback: bool
    evaluated: bool
    gate_passed: bool | None
    hit_at_5: int | None
    hit_at_10: int | None
    queries: int | None
    units: int | None
    fragments: int | None
    created_at: str
    activated_at: str | None


@dataclass(frozen=True)
class GenerationsReport:
    """The generations of a workspace, newest first, and the two registry pointers; what
    ``tht workspace generations --json`` prints and the Dagster asset metadata shows."""

    workspace_id: str
    activated_revision: str | None
    active_generation: int | None
    generations: list[GenerationRow] = field(default_factory=list[GenerationRow])

    @property
    def rollback_targets(self) -> list[GenerationRow]:
        """The generations a rollback can reach, one per revision, newest first."""
        return [g for g in self.generations if g.rollback]

    def to_json(self) -> dict[str, Any]:
        return {"workspace_id": self.workspace_id,
                "activated_revision": self.activated_revision,
                "active_generation": self.active_generation,
                "serving": self.activated_revision is not None and any(
                    g.state == "serving" for g in self.generations),
                "generations": [asdict(g) for g in self.generations],
                "rollback_revisions": [g.revision for g in self.rollback_targets]}


def list_generations(root: Workspace | Path | str) -> GenerationsReport:
    """Every generation of the workspace at ``root`` with its state, evaluation and whether a
    rollback (``tht workspace activate --revision``) reaches it; reads the registry only
    (nothing is written; a registry never written to lists nothing)."""
    ws = root if isinstance(root, Workspace) else load_workspace(root)
    wid = ws.config.workspace_id
    with Registry.open(ws.registry_url) as registry:
        revision, active = registry.active_state(wid)
        generations = registry.generations(wid)
    subjects = _subjects(ws.root, {g.revision for g in generations})
    seen: set[str] = set()  # revisions whose newest retained generation was met
    rows: list[GenerationRow] = []
    for g in generations:  # newest first, as the rollback looks them up
        retained = g.counts.get("points_retained", True) is not False
        is_active = active is not None and g.number == active.number
        if is_active:
            state = "serving" if g.revision == revision else "active"
        elif g.status is GenerationStatus.retired:
            state = "retained" if retained else "discarded"
        else:
            state = g.status.value
        reachable = g.status in (GenerationStatus.active, GenerationStatus.retired) and retained
        rollback = reachable and g.revision not in seen and state != "serving"
        if reachable:
            seen.add(g.revision)
        summary = (g.evaluation or {}).get("summary") or {}
        rows.append(GenerationRow(
            number=g.number, revision=g.revision, subject=subjects.get(g.revision), state=state,
            active=is_active, rollback=rollback, evaluated=g.evaluation is not None,
            gate_passed=summary.get("gate_passed"), hit_at_5=summary.get("hit_at_5"),
            hit_at_10=summary.get("hit_at_10"), queries=summary.get("queries"),
            units=g.counts.get("units"), fragments=g.counts.get("fragments"),
            created_at=g.created_at, activated_at=g.activated_at))
    return GenerationsReport(wid, revision, None if active is None else active.number, rows)


def _subjects(root: Path, revisions: set[str]) -> dict[str, str]:
    """The first line of each revision's commit message (best effort: a revision the clone
    lacks, or no repository at all, is left out)."""
    out: dict[str, str] = {}
    if not revisions:
        return out
    with contextlib.suppress(EvidenceError), open_repo(root) as repo:
        for sha in revisions:
            with contextlib.suppress(Exception):  # GitPython raises ValueError/BadName
                message = repo.commit(sha).message
                text = message.decode("utf-8", "replace") if isinstance(message, bytes) \
                    else message
                out[sha] = text.strip().splitlines()[0] if text.strip() else ""
    return out
