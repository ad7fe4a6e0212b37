"""``tht evidence prepare``: changed sources → curated units, one model call per changed source.

Deterministic intake and normalization, one restructuring call per changed source, validation of
every output, and an all-or-nothing apply of curated files plus manifest (spec §5, §6). The
frame (lock, recovery, clean tree, manifest, current units, apply) is the
:class:`~evidence_pipeline.authoring.session.AuthoringSession`; the batch is built by the
:class:`~evidence_pipeline.authoring.planner.BatchPlanner`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field

from evidence_pipeline.authoring.apply import Batch
from evidence_pipeline.authoring.backends.base import (
    ModelBackend,
    ModelBackendError,
    ModelRequest,
    PreviousUnit,
)
from evidence_pipeline.authoring.backends.factory import make_backend
from evidence_pipeline.authoring.planner import (
    BatchPlanner,
    ModelFailure,
    Progress,
    SourceProposal,
    SourceReport,
)
from evidence_pipeline.authoring.relink import bring_orphans_home, with_orphan_origins
from evidence_pipeline.authoring.session import AuthoringSession, BatchInvalidError, ExistingUnit
from evidence_pipeline.authoring.sources import (
    Change,
    SourceChange,
    SourceError,
    compare,
    intake,
)
from evidence_pipeline.formats.manifest import Manifest, empty_manifest
from evidence_pipeline.formats.normalize import normalize_text
from evidence_pipeline.gitrepo import committed_bytes_with_sha256
from evidence_pipeline.publishing.progress import phase_reporter
from evidence_pipeline.validation.problems import Problem, Severity, sort_problems
from evidence_pipeline.validation.unit_cache import UnitCache
from evidence_runtime.errors import ErrorCode, EvidenceError
from evidence_runtime.workspace import Workspace, load_workspace

__all__ = [
    "MODEL_CALLS",
    "RESTRUCTURED",
    "PrepareError",
    "PreparePlan",
    "PrepareResult",
    "SourceProposal",
    "SourceReport",
    "apply_plan",
    "call_model",
    "model_request",
    "only_source",
    "plan_prepare",
    "prepare",
    "recovered_result",
    "take_in",
]

RESTRUCTURED = frozenset({Change.changed, Change.new})
# the phase and items of the model calls' progress: ``model calls: 3/40 source(s) (7%)``
MODEL_CALLS = ("model calls", "source(s)")


class PrepareError(EvidenceError):
    """The batch was refused; ``problems`` lists every problem found, nothing was written.

    ``not_attempted``: the changed sources never sent to the model because an earlier model
    call failed (the first failure ends the batch, spec §5.3)."""

    code = ErrorCode.prepare_failed

    def __init__(self, message: str, problems: Sequence[Problem], *,
                 model_calls: int | None = None, not_attempted: Sequence[str] = (),
                 **kw: Any) -> None:
        super().__init__(message, **kw)
        self.problems = list(problems)
        self.model_calls = model_calls  # calls made before the batch was refused, when known
        self.not_attempted = list(not_attempted)


class Notice(BaseModel):
    """Something prepare left out on purpose and says so (never an error): ``source_hidden``,
    a hidden file or directory under ``source/`` that is not a source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str
    path: str
    message: str


SOURCE_HIDDEN = "source_hidden"


def hidden_notices(shown: Sequence[str]) -> list[Notice]:
    """One ``source_hidden`` notice for each hidden entry skipped (paths as the user sees them)."""
    return [Notice(code=SOURCE_HIDDEN, path=path if path.isprintable() else ascii(path),
                   message="hidden (its name starts with '.'): not read as a source; rename it "
                           "to make it one") for path in shown]


class PrepareResult(BaseModel):
    """What a prepare run did; ``model_dump(mode="json")`` is ``prepare --json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: str  # "unchanged" | "applied" | "recovered"
    model_calls: int
    sources: list[SourceReport]
    written: list[str]
    deleted: list[str]
    review_items: int
    orphans: list[str]
    retirement_candidates: list[str]
    recovered: list[str]
    notices: list[Notice] = Field(default_factory=list[Notice])
    diff: str = Field(exclude=True)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def problems(self) -> list[Any]:
        """Always empty: a refused batch raises :class:`PrepareError` with its problems."""
        return []


def prepare(root: Path, *, backend: str | None = None, upgrade: bool = False,
            progress: Progress | None = None,
            backend_factory: Callable[[str, dict[str, Any]], ModelBackend] = make_backend,
            model_progress: Callable[[Any], None] | None = None,
            ) -> PrepareResult:
    """Run prepare on a workspace; raises :class:`PrepareError` (nothing written) on failure.

    ``progress`` hears each source's report; ``model_progress`` how many of the changed
    sources' model calls are done (``PhaseProgress`` ``model calls``, see :func:`take_in`)."""
    ws = load_workspace(root)
    with AuthoringSession.open(ws, what="prepare") as session:
        if session.rolled_forward:
            # an interrupted apply was rolled forward: that is this run's change to review
            return recovered_result(session.recovered)
        plan = plan_prepare(session, upgrade=upgrade)
        backend_name = backend or ws.config.model.backend
        model: ModelBackend | None = None

        def propose(change: SourceChange) -> SourceProposal:
            nonlocal model
            if model is None:
                model = backend_factory(backend_name, ws.config.model.settings())
            return call_model(model, model_request(plan, change))

        return apply_plan(plan, propose, progress=progress, model_progress=model_progress)


# --- the stages of prepare (the CLI above and the Dagster assets call these) -------------------


@dataclass
class PreparePlan:
    """What a prepare batch starts from: the session (manifest, curated units) and every
    source's change."""

    session: AuthoringSession
    manifest: Manifest
    changes: list[SourceChange]
    problems: list[Problem]  # intake refusals and unreadable curated files
    only: str | None = None  # a prepare of this one source (see only_source)
    notices: list[Notice] = field(default_factory=list[Notice])  # what was left out, and why

    @property
    def ws(self) -> Workspace:
        return self.session.ws

    @property
    def existing(self) -> dict[str, ExistingUnit]:
        return self.session.existing

    def to_restructure(self) -> list[SourceChange]:
        """The changed and new sources: one model call each."""
        return [c for c in self.changes if c.change in RESTRUCTURED]

    def fingerprint(self) -> tuple[tuple[str, str, str | None, str | None], ...]:
        """The changes by path, kind and hash: equal fingerprints plan the same batch."""
        return tuple((c.path, c.change.value, c.source.sha256 if c.source else None,
                      c.renamed_from) for c in self.changes)


def recovered_result(recovered: Sequence[str]) -> PrepareResult:
    """The result of a run whose only change is a rolled-forward, interrupted apply."""
    return PrepareResult(status="recovered", sources=[], model_calls=0, written=[], deleted=[],
                         diff="", recovered=list(recovered), review_items=0, orphans=[],
                         retirement_candidates=[])


def plan_prepare(session: AuthoringSession, *, upgrade: bool = False) -> PreparePlan:
    """Load the session (clean tree, manifest, curated units) and classify every source (hash
    against manifest); raises :class:`EvidenceError` when prepare must not run."""
    session.load(upgrade=upgrade)
    hidden: list[str] = []
    sources, intake_errors = intake(session.ws.evidence_dir, hidden)
    problems: list[Problem] = [
        Problem(e.code, Severity.error, session.shown(e.path) if e.path else None, None,
                e.message) for e in intake_errors]
    problems.extend(session.unreadable)
    manifest = with_orphan_origins(session.manifest or empty_manifest(), session.existing)
    changes = bring_orphans_home(compare(sources, manifest, everything=upgrade), manifest)
    return PreparePlan(session, manifest, changes, problems,
                       notices=hidden_notices([session.shown(h) for h in hidden]))


def model_request(plan: PreparePlan, change: SourceChange) -> ModelRequest:
    """What the model sees for one changed source: normalized text and its previous units (a
    source back at its path with other content: the orphans it had)."""
    src = change.source
    assert src is not None
    entry = plan.manifest.previous_entry(src.path)
    previous_ids = entry.units if entry is not None else []
    previous = tuple(
        PreviousUnit(id=eid, data=plan.existing[eid].doc.data(),
                     body=plan.existing[eid].doc.body)
        for eid in previous_ids if eid in plan.existing)
    return ModelRequest(
        source_file=src.path, source_sha256=src.sha256, normalized_text=src.normalized,
        language=plan.ws.config.language_code, previous_units=previous,
        max_chunk_chars=plan.ws.config.embeddings.max_chunk_chars,
        previous_text=previous_source_text(plan, change) if previous else None)


def previous_source_text(plan: PreparePlan, change: SourceChange) -> str | None:
    """The normalized text the source had at the last prepare (found in Git by its recorded
    hash), so the model can tell what changed; None when Git no longer has it."""
    entry = plan.manifest.previous_entry(change.path)
    if entry is None:
        return None
    raw = committed_bytes_with_sha256(plan.ws.root, plan.session.shown(change.path),
                                      entry.sha256)
    if raw is None:
        return None
    try:
        return normalize_text(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None


def call_model(model: ModelBackend, request: ModelRequest) -> SourceProposal:
    """One restructuring call, timed; a backend error becomes the source's failure, no retry."""
    started = time.perf_counter()
    try:
        reply = model.restructure(request)
    except ModelBackendError as exc:
        return SourceProposal(request, None, ModelFailure(exc.code, exc.message,
                                                          exc.evidence_id, exc.field),
                              time.perf_counter() - started, model.name)
    return SourceProposal(request, reply, None, time.perf_counter() - started, model.name)


def _planner(plan: PreparePlan, progress: Progress | None) -> BatchPlanner:
    return BatchPlanner(plan.ws, plan.manifest, plan.existing, plan.session.taken_ids(),
                        progress)


def apply_plan(plan: PreparePlan, propose: Callable[[SourceChange], SourceProposal], *,
               progress: Progress | None = None,
               stop_at_model_failure: bool = True,
               model_progress: Callable[[Any], None] | None = None) -> PrepareResult:
    """Take in every change in order (``propose`` answers for each changed source), check the
    whole batch and apply it all or nothing; raises :class:`PrepareError`, nothing written.

    The first model failure (timeout, process or HTTP error, invalid reply) ends the batch: no
    later source is proposed, and the error names them (spec §5.3; a slow endpoint must not
    cost one timeout per changed source). Problems in valid replies do not stop it: every one
    is reported. ``stop_at_model_failure=False``: every proposal is taken in (the Dagster job,
    whose model steps have all run already). Call inside the plan's session.
    """
    planner = take_in(plan, propose, progress=progress,
                      stop_at_model_failure=stop_at_model_failure,
                      model_progress=model_progress)
    batch, diff = planner.batch()
    try:
        plan.session.apply(batch)
    except BatchInvalidError as exc:  # a file validate would refuse: the source is named
        raise PrepareError(f"prepare refused: {len(exc.problems)} problem(s); the work tree "
                           "was not changed", exc.problems, model_calls=planner.model_calls,
                           code=exc.code) from None
    remember_written(plan, planner, batch)
    if not batch.is_empty():
        planner.save_proposals()  # the model backends' proposals: the bases of the next merge
    new_manifest = planner.manifest
    return PrepareResult(
        status="applied" if not batch.is_empty() else "unchanged",
        sources=planner.reports,
        model_calls=planner.model_calls,
        written=sorted(batch.writes),
        deleted=sorted(batch.deletes),
        diff=diff,
        recovered=list(plan.session.recovered),
        notices=list(plan.notices),
        review_items=planner.review_items,
        orphans=sorted(new_manifest.orphans),
        retirement_candidates=sorted(new_manifest.retirement_candidates),
    )


def remember_written(plan: PreparePlan, planner: BatchPlanner, batch: Batch) -> None:
    """Put the curated files just written into the unit cache (``.tht/units-cache.json``), from
    the documents they were dumped from: the next prepare, validate or publish finds them
    without parsing them (a file edited since has another blob id and is read again)."""
    if not batch.writes:
        return
    docs = {plan.session.shown(rel): doc for rel, doc in planner.outputs.items()
            if doc is not None}
    cache = UnitCache.in_state_dir(plan.ws.state_dir)
    cache.remember_written(batch.writes, docs, deleted=batch.deletes)
    cache.save()


def take_in(plan: PreparePlan, propose: Callable[[SourceChange], SourceProposal], *,
            progress: Progress | None = None,
            stop_at_model_failure: bool = True,
            model_progress: Callable[[Any], None] | None = None) -> BatchPlanner:
    """Every change of the plan taken in and the whole batch checked, as :func:`apply_plan`
    does before it writes (same arguments): the planner holds the new curated files and
    manifest (``planner.batch()``: the file changes and their diff); raises
    :class:`PrepareError`. Nothing is written.

    ``model_progress`` hears ``PhaseProgress`` ``model calls``: 0 of N (the changed sources)
    before the first call, then the count as each call returns (about every fiftieth of the
    way in a large batch); a model failure that ends the batch ends it short of N. Nothing
    when no source needs a call."""
    planner = _planner(plan, progress)
    calls = phase_reporter(model_progress, *MODEL_CALLS)
    total = len(plan.to_restructure()) if calls is not None else 0
    if calls is not None and total:
        calls(0, total)
    called = 0
    problems = list(plan.problems)
    failed: SourceProposal | None = None
    not_attempted: list[str] = []
    for change in plan.changes:
        if change.change in RESTRUCTURED:
            if failed is not None:
                not_attempted.append(change.path)
                continue
            proposal = propose(change)
            called += 1
            if calls is not None:
                calls(called, total)
            problems.extend(planner.restructure(change, proposal))
            if proposal.failure is not None and stop_at_model_failure:
                failed = proposal
        elif change.change in (Change.renamed, Change.restored):
            planner.rename(change)
        elif change.change is Change.removed:
            planner.remove(change)
        else:
            planner.unchanged(change)
    if not problems:
        problems.extend(p for p in planner.check_batch()
                        if plan.only is None or p.code not in PENDING)
    errors = [p for p in problems if p.severity is Severity.error]
    if errors:
        stopped = ""
        if failed is not None and not_attempted:
            listed = ", ".join(not_attempted[:10]) + (
                f" and {len(not_attempted) - 10} more" if len(not_attempted) > 10 else "")
            stopped = (f"; the model failed on {failed.path}, so {len(not_attempted)} "
                       f"source(s) were not sent to it: {listed}")
        raise PrepareError(
            f"prepare refused: {len(errors)} problem(s); the work tree was not changed{stopped}",
            sort_problems(errors), model_calls=planner.model_calls, not_attempted=not_attempted)
    return planner


# the changes a one-source prepare leaves for later: the other sources' manifest entries keep
# the hash of their last prepare, as they had before it
PENDING = frozenset({"manifest_source_changed", "manifest_source_missing"})


def only_source(plan: PreparePlan, path: str) -> PreparePlan:
    """The plan of a prepare of the source at ``path`` alone (a curator's choice in the UI).

    That source's change is taken in as prepare would; every other source keeps its manifest
    entry as it is (a changed, removed or renamed one stays so for the next prepare; a new one
    stays out of the manifest). :class:`SourceError` when ``path`` is not a source.
    """
    if not any(c.path == path for c in plan.changes):
        raise SourceError("no such source file", path=path, code="source_missing")
    changes: list[SourceChange] = []
    for change in plan.changes:
        kept = change.renamed_from if change.change is Change.renamed else change.path
        if change.path == path:
            changes.append(change)
        elif kept is not None and kept in plan.manifest.sources:
            changes.append(SourceChange(kept, Change.unchanged, None))
    changes.sort(key=lambda c: c.path)
    return dataclasses.replace(plan, changes=changes, only=path)

