"""``tht evidence prepare``: changed sources → curated units, one model call per changed source.

Deterministic intake and normalization, one restructuring call per changed source, validation of
every output, and an all-or-nothing apply of curated files plus manifest (spec §5, §6).
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evidence_pipeline.authoring.apply import Batch, apply_batch, recover
from evidence_pipeline.authoring.backends.base import (
    ModelBackend,
    ModelBackendError,
    ModelReply,
    ModelRequest,
    PreviousUnit,
)
from evidence_pipeline.authoring.backends.factory import make_backend
from evidence_pipeline.authoring.curated_writer import (
    curated_relpath,
    document_from_unit,
    dump_curated,
    render_body,
    to_rt,
)
from evidence_pipeline.authoring.ids import assign_id
from evidence_pipeline.authoring.manifest import (
    MANIFEST_NAME,
    PIPELINE_VERSION,
    Manifest,
    SourceEntry,
    dump_manifest,
    empty_manifest,
    read_manifest,
)
from evidence_pipeline.authoring.normalize import canonical, normalize_text
from evidence_pipeline.authoring.sources import Change, SourceChange, compare, intake
from evidence_pipeline.gitrepo import committed_bytes_with_sha256, require_clean
from evidence_pipeline.lock import workspace_lock
from evidence_pipeline.publishing.fragments import ATOMIC_TOO_LARGE, atomic_problems
from evidence_pipeline.validation.corpus import LoadedUnit, SourceReader, corpus_files
from evidence_pipeline.validation.problems import Problem, Severity, sort_problems
from evidence_pipeline.validation.rules import (
    check_corpus,
    check_unit,
    credential_problems,
    schema_problems,
)
from evidence_pipeline.validation.validator import load_units
from evidence_runtime.curated import CuratedDocument, parse_curated
from evidence_runtime.errors import EvidenceError
from evidence_runtime.units import SCHEMA_VERSION, UnitBase, parse_unit
from evidence_runtime.workspace import Workspace, load_workspace

RETIREMENT_CODE = "source_no_longer_supports_unit"


class PrepareError(EvidenceError):
    """The batch was refused; ``problems`` lists every problem found, nothing was written."""

    code = "prepare_failed"

    def __init__(self, message: str, problems: Sequence[Problem], *,
                 model_calls: int | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.problems = list(problems)
        self.model_calls = model_calls  # calls made before the batch was refused, when known


@dataclass
class SourceReport:
    path: str
    change: Change
    units: list[str] = field(default_factory=list)
    model_seconds: float | None = None
    renamed_from: str | None = None
    # previous ids that code gave back to new units the model did not link (id -> criterion)
    ids_kept_by_code: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "change": self.change.value, "units": self.units,
                "model_seconds": None if self.model_seconds is None
                else round(self.model_seconds, 3),
                "renamed_from": self.renamed_from,
                "ids_kept_by_code": self.ids_kept_by_code}


@dataclass
class PrepareResult:
    status: str  # "unchanged" | "applied" | "recovered"
    sources: list[SourceReport]
    model_calls: int
    written: list[str]
    deleted: list[str]
    diff: str
    recovered: list[str]
    review_items: int
    orphans: list[str]
    retirement_candidates: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "model_calls": self.model_calls,
            "sources": [s.to_json() for s in self.sources],
            "written": self.written,
            "deleted": self.deleted,
            "review_items": self.review_items,
            "orphans": self.orphans,
            "retirement_candidates": self.retirement_candidates,
            "recovered": self.recovered,
            "problems": [],
        }


@dataclass
class _Existing:
    rel_path: str  # relative to evidence/
    doc: CuratedDocument
    unit: UnitBase


Progress = Callable[[SourceReport], None]


def _evidence_rel(ws: Workspace) -> str:
    return ws.config.evidence.root.strip("/")


def load_existing(ws: Workspace) -> tuple[dict[str, _Existing], list[Problem]]:
    """Every current curated unit by id; problems for files that cannot be read."""
    evidence_dir = ws.evidence_dir
    rels = corpus_files(evidence_dir, ws.config.evidence.patterns)
    loaded, problems = load_units(evidence_dir, rels, shown_prefix=f"{_evidence_rel(ws)}/",
                                  sources=SourceReader(evidence_dir), check=False)
    out: dict[str, _Existing] = {}
    unreadable: set[str] = set()
    for item in loaded:
        if item.unit is not None and item.doc is not None:
            out[item.unit.id] = _Existing(item.rel_path, item.doc, item.unit)
        else:
            unreadable.add(f"{_evidence_rel(ws)}/{item.rel_path}")
    # a file that cannot be read as a unit stops prepare (its id is unknown, ids could clash);
    # content problems of readable units are left to validate
    return out, [p for p in problems if p.path in unreadable]


def prepare(root: Path, *, backend: str | None = None, upgrade: bool = False,
            progress: Progress | None = None,
            backend_factory: Callable[[str, dict[str, Any]], ModelBackend] = make_backend,
            ) -> PrepareResult:
    """Run prepare on a workspace; raises :class:`PrepareError` (nothing written) on failure."""
    ws = load_workspace(root)
    local = ws.root / ".tht"
    with workspace_lock(local, what="prepare"):
        recovered = recover(ws.root, local)
        if any(line.startswith("completed") for line in recovered):
            # an interrupted apply was rolled forward: that is this run's change to review
            return recovered_result(recovered)
        plan = plan_prepare(ws, upgrade=upgrade)
        backend_name = backend or ws.config.model.backend
        model: ModelBackend | None = None

        def propose(change: SourceChange) -> SourceProposal:
            nonlocal model
            if model is None:
                model = backend_factory(backend_name, ws.config.model.settings())
            return call_model(model, model_request(plan, change))

        return apply_plan(plan, propose, progress=progress, recovered=recovered)


# --- the stages of prepare (the CLI above and the Dagster assets call these) -------------------

RESTRUCTURED = frozenset({Change.changed, Change.new})


@dataclass
class PreparePlan:
    """What a prepare batch starts from: manifest, curated units and every source's change."""

    ws: Workspace
    manifest: Manifest
    existing: dict[str, _Existing]
    changes: list[SourceChange]
    problems: list[Problem]  # intake refusals and unreadable curated files
    upgrade: bool = False

    def to_restructure(self) -> list[SourceChange]:
        """The changed and new sources: one model call each."""
        return [c for c in self.changes if c.change in RESTRUCTURED]

    def fingerprint(self) -> tuple[tuple[str, str, str | None, str | None], ...]:
        """The changes by path, kind and hash: equal fingerprints plan the same batch."""
        return tuple((c.path, c.change.value, c.source.sha256 if c.source else None,
                      c.renamed_from) for c in self.changes)


@dataclass(frozen=True)
class ModelFailure:
    """A model step that failed for one source (timeout, process, HTTP, invalid reply)."""

    code: str
    message: str
    evidence_id: str | None = None
    field: str | None = None


@dataclass(frozen=True)
class SourceProposal:
    """The model step's answer for one changed source, before ids are assigned or checked."""

    request: ModelRequest
    reply: ModelReply | None
    failure: ModelFailure | None
    seconds: float

    @property
    def path(self) -> str:
        return self.request.source_file


def recovered_result(recovered: list[str]) -> PrepareResult:
    """The result of a run whose only change is a rolled-forward, interrupted apply."""
    return PrepareResult(status="recovered", sources=[], model_calls=0, written=[], deleted=[],
                         diff="", recovered=recovered, review_items=0, orphans=[],
                         retirement_candidates=[])


def plan_prepare(ws: Workspace, *, upgrade: bool = False) -> PreparePlan:
    """Check the work tree and manifest and classify every source (hash against manifest).

    Call with the workspace lock held; raises :class:`EvidenceError` when prepare must not run.
    """
    ev = _evidence_rel(ws)
    if upgrade:
        require_clean(ws.root, (), what="prepare --upgrade")
    else:
        require_clean(ws.root, (f"{ev}/curated", f"{ev}/{MANIFEST_NAME}"), what="prepare")
    manifest = read_manifest(ws.evidence_dir, shown=f"{ev}/{MANIFEST_NAME}")
    if manifest is None:
        manifest = empty_manifest()
    elif manifest.pipeline_version != PIPELINE_VERSION and not upgrade:
        raise EvidenceError(
            f"manifest pipeline_version {manifest.pipeline_version} is not compatible with "
            f"this installation ({PIPELINE_VERSION}); nothing was written. Run "
            "`tht evidence prepare --upgrade` on a clean repository to reprocess everything",
            path=f"{ev}/{MANIFEST_NAME}", field="pipeline_version",
            code="pipeline_version_incompatible")
    sources, intake_errors = intake(ws.evidence_dir)
    problems: list[Problem] = [
        Problem(e.code, Severity.error, f"{ev}/{e.path}" if e.path else None, None,
                e.message) for e in intake_errors]
    existing, fatal = load_existing(ws)
    problems.extend(fatal)
    changes = compare(sources, manifest, everything=upgrade)
    return PreparePlan(ws, manifest, existing, changes, problems, upgrade)


def model_request(plan: PreparePlan, change: SourceChange) -> ModelRequest:
    """What the model sees for one changed source: normalized text and its previous units."""
    src = change.source
    assert src is not None
    previous_ids = plan.manifest.sources.get(src.path, SourceEntry(sha256=src.sha256)).units
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
    entry = plan.manifest.sources.get(change.path)
    if entry is None:
        return None
    ev = plan.ws.config.evidence.root.strip("/")
    raw = committed_bytes_with_sha256(plan.ws.root, f"{ev}/{change.path}", entry.sha256)
    if raw is None:
        return None
    try:
        return normalize_text(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None


def relink_dropped_units(request: ModelRequest, reply: ModelReply) -> dict[int, tuple[str, str]]:
    """New units (no id) that are unmistakably a previous unit the reply dropped.

    Small models often rewrite a previous unit without returning its id; the unit would get a
    new id and the old one would become a retirement candidate. A previous unit that the reply
    neither kept nor proposed for retirement is given back its id when exactly one new unit has
    its title, or else exactly its supporting excerpts (in the validator's comparison form, case
    aside) — and that new unit matches no other dropped unit. Returns ``{unit index: (previous
    id, criterion)}``.
    """
    kept = {u.id for u in reply.units if u.id is not None}
    retired = {c.id for c in reply.retirement_candidates}
    dropped = {u.id: u.data for u in request.previous_units if u.id not in kept | retired}
    new = {i: u.data for i, u in enumerate(reply.units) if u.id is None}
    out: dict[int, tuple[str, str]] = {}

    def squeeze(text: Any) -> str:
        return canonical(str(text)).casefold()  # the validator's comparison form

    def title_key(data: dict[str, Any]) -> Any:
        return squeeze(data.get("title") or "") or None

    def excerpts_key(data: dict[str, Any]) -> Any:
        quotes = data.get("supporting_excerpts")
        if quotes is None:
            quotes = (data.get("provenance") or {}).get("supporting_excerpts")
        return frozenset(squeeze(q) for q in quotes or ()) or None

    for criterion, key in (("title", title_key), ("supporting_excerpts", excerpts_key)):
        prev_by: dict[Any, list[str]] = {}
        for eid, data in dropped.items():
            prev_by.setdefault(key(data), []).append(eid)
        new_by: dict[Any, list[int]] = {}
        for index, data in new.items():
            new_by.setdefault(key(data), []).append(index)
        for k, eids in prev_by.items():
            if k is None or len(eids) != 1 or len(new_by.get(k, ())) != 1:
                continue
            index = new_by[k][0]
            out[index] = (eids[0], criterion)
            del dropped[eids[0]], new[index]
    return out


def call_model(model: ModelBackend, request: ModelRequest) -> SourceProposal:
    """One restructuring call, timed; a backend error becomes the source's failure, no retry."""
    started = time.perf_counter()
    try:
        reply = model.restructure(request)
    except ModelBackendError as exc:
        return SourceProposal(request, None, ModelFailure(exc.code, exc.message,
                                                          exc.evidence_id, exc.field),
                              time.perf_counter() - started)
    return SourceProposal(request, reply, None, time.perf_counter() - started)


def apply_plan(plan: PreparePlan, propose: Callable[[SourceChange], SourceProposal], *,
               progress: Progress | None = None, recovered: Sequence[str] = ()
               ) -> PrepareResult:
    """Take in every change in order (``propose`` answers for each changed source), check the
    whole batch and apply it all or nothing; raises :class:`PrepareError`, nothing written.

    Call with the workspace lock held.
    """
    ws = plan.ws
    planner = _Planner(ws, plan.manifest, plan.existing, progress)
    problems = list(plan.problems)
    for change in plan.changes:
        if change.change in RESTRUCTURED:
            problems.extend(planner.restructure(change, propose(change)))
        elif change.change is Change.renamed:
            planner.rename(change)
        elif change.change is Change.removed:
            planner.remove(change)
        else:
            planner.unchanged(change)
    if not problems:
        problems.extend(planner.check_batch())
    errors = [p for p in problems if p.severity is Severity.error]
    if errors:
        raise PrepareError(
            f"prepare refused: {len(errors)} problem(s); the work tree was not changed",
            sort_problems(errors), model_calls=planner.model_calls)
    batch, diff = planner.batch()
    if plan.upgrade or not batch.is_empty():
        apply_batch(ws.root, ws.root / ".tht", batch, name=f"prepare-{time.time_ns()}")
    new_manifest = planner.manifest
    return PrepareResult(
        status="applied" if not batch.is_empty() else "unchanged",
        sources=planner.reports,
        model_calls=planner.model_calls,
        written=sorted(batch.writes),
        deleted=sorted(batch.deletes),
        diff=diff,
        recovered=list(recovered),
        review_items=planner.review_items,
        orphans=sorted(new_manifest.orphans),
        retirement_candidates=sorted(new_manifest.retirement_candidates),
    )


def check_proposal(plan: PreparePlan, change: SourceChange, proposal: SourceProposal
                   ) -> tuple[SourceReport, list[Problem], int]:
    """One source's proposal taken in on its own: its report, problems and review items.

    A per-source preview (ids of new units may differ in the whole batch, where sources are
    taken in together in path order); nothing is written.
    """
    planner = _Planner(plan.ws, plan.manifest, plan.existing, None)
    problems = planner.restructure(change, proposal)
    return planner.reports[-1], problems, planner.review_items


class _Planner:
    """Accumulates the new state of curated files and manifest for one prepare batch."""

    def __init__(self, ws: Workspace, manifest: Manifest, existing: dict[str, _Existing],
                 progress: Progress | None) -> None:
        self.ws = ws
        self.ev = _evidence_rel(ws)
        self.old_manifest = manifest
        self.manifest = Manifest(
            pipeline_version=PIPELINE_VERSION,
            sources={},
            orphans=list(manifest.orphans),
            retirement_candidates=list(manifest.retirement_candidates),
        )
        self.existing = existing
        self.progress = progress
        self.reports: list[SourceReport] = []
        self.model_calls = 0
        self.review_items = 0
        self.taken: set[str] = set(existing) | manifest.all_unit_ids() | set(manifest.orphans)
        # evidence-relative path → new document (None = delete)
        self.outputs: dict[str, CuratedDocument | None] = {}
        self.touched_ids: set[str] = set()
        self.sources = SourceReader(ws.evidence_dir)

    # --- per source ----------------------------------------------------------------------

    def _report(self, report: SourceReport) -> None:
        self.reports.append(report)
        if self.progress:
            self.progress(report)

    def unchanged(self, change: SourceChange) -> None:
        entry = self.old_manifest.sources[change.path]
        self.manifest.sources[change.path] = SourceEntry(sha256=entry.sha256,
                                                         units=list(entry.units))
        self._report(SourceReport(change.path, Change.unchanged, sorted(entry.units)))

    def remove(self, change: SourceChange) -> None:
        entry = self.old_manifest.sources[change.path]
        for eid in entry.units:
            if eid not in self.manifest.orphans:
                self.manifest.orphans.append(eid)
        self._report(SourceReport(change.path, Change.removed, sorted(entry.units)))

    def rename(self, change: SourceChange) -> None:
        assert change.source is not None and change.renamed_from is not None
        old = self.old_manifest.sources[change.renamed_from]
        for eid in old.units:
            item = self.existing.get(eid)
            if item is None:
                continue
            doc = _copy_doc(item.doc)
            doc.front["provenance"]["source_file"] = change.path
            doc.front["provenance"]["source_sha256"] = change.source.sha256
            self.outputs[item.rel_path] = doc
            self.touched_ids.add(eid)
        self.manifest.sources[change.path] = SourceEntry(sha256=change.source.sha256,
                                                         units=list(old.units))
        self._report(SourceReport(change.path, Change.renamed, sorted(old.units),
                                  renamed_from=change.renamed_from))

    def restructure(self, change: SourceChange, proposal: SourceProposal) -> list[Problem]:
        """Take in the model's answer for one changed source: ids, units, checks, manifest."""
        src = change.source
        assert src is not None
        shown_src = f"{self.ev}/{src.path}"
        previous_ids = list(self.old_manifest.sources.get(src.path, SourceEntry(
            sha256=src.sha256)).units)
        request = proposal.request
        self.model_calls += 1
        if (request.source_file, request.source_sha256) != (src.path, src.sha256):
            self._report(SourceReport(src.path, change.change, [], proposal.seconds))
            return [Problem("source_changed", Severity.error, shown_src, None,
                            "the source changed while prepare ran; run prepare again")]
        if proposal.reply is None:
            failure = proposal.failure
            assert failure is not None
            self._report(SourceReport(src.path, change.change, [], proposal.seconds))
            return [Problem(failure.code, Severity.error, shown_src, failure.evidence_id,
                            failure.message, failure.field)]
        reply = proposal.reply
        elapsed = proposal.seconds
        problems: list[Problem] = []
        unit_ids: list[str] = []
        returned: set[str] = set()
        # whatever the backend checked: only the ids it was given, only this source (§5.3)
        for cand in reply.retirement_candidates:
            if cand.id not in request.allowed_ids:
                problems.append(Problem("model_unknown_id", Severity.error, shown_src, cand.id,
                                        "a retirement candidate names an id that was not "
                                        "given for this source"))
        relinked = relink_dropped_units(request, reply)
        for index, proposed in enumerate(reply.units):
            eid = proposed.id if index not in relinked else relinked[index][0]
            if eid is not None and eid not in request.allowed_ids:
                problems.append(Problem("model_unknown_id", Severity.error, shown_src, eid,
                                        f"unit {index + 1}: the id was not given for this "
                                        "source; new units carry no id"))
                continue
            cited = _cited_sources(proposed.data) - {src.path}
            if cited:
                problems.append(Problem("model_invalid_output", Severity.error, shown_src, eid,
                                        f"unit {index + 1} cites another source "
                                        f"({', '.join(map(repr, sorted(cited)))}); a unit may "
                                        f"only come from {src.path!r}", "source_file"))
                continue
            if eid is not None and eid in returned:
                problems.append(Problem("model_invalid_output", Severity.error, shown_src, eid,
                                        f"unit {index + 1}: the same id is returned twice"))
                continue
            if eid is None:
                title = str(proposed.data.get("title") or "unit")
                eid = assign_id(title, self.taken)
            returned.add(eid)
            data = dict(proposed.data)
            excerpts = data.pop("supporting_excerpts", None)
            data.pop("source_file", None)
            full = {
                "schema_version": SCHEMA_VERSION,
                "id": eid,
                **{k: v for k, v in data.items() if k not in {"schema_version", "id",
                                                              "language", "provenance"}},
                "language": self.ws.config.language_code,
                "provenance": {"source_file": src.path, "source_sha256": src.sha256,
                               "supporting_excerpts": excerpts},
            }
            full.setdefault("review_items", [])
            try:
                unit = parse_unit(full)
            except ValidationError as exc:
                shown = f"{self.ev}/curated/{data.get('kind', '?')}/{eid.split(':', 1)[1]}.md"
                problems.extend(schema_problems(exc, path=shown, evidence_id=eid))
                continue
            unit = _flag_atomic_too_large(unit, full, proposed.body,
                                          self.ws.config.embeddings.max_chunk_chars)
            new_rel = curated_relpath(unit)
            old = self.existing.get(eid)
            if old is not None:
                keep_rel = old.rel_path
                # a reclassification keeps the id and moves the file to its kind directory
                if not keep_rel.startswith(f"curated/{unit.kind.value}/"):
                    self.outputs[keep_rel] = None
                    keep_rel = new_rel
                new_rel = keep_rel
            body = proposed.body if proposed.body.strip() else None
            doc = document_from_unit(unit, render_body(unit, body) if body is not None
                                     else render_body(unit))
            if old is not None and _same_content(old.doc, doc):
                doc = old.doc  # nothing changed for this unit: keep its bytes
            shown = f"{self.ev}/{new_rel}"
            problems.extend(credential_problems(doc.data(), doc.body, path=shown,
                                                evidence_id=eid))
            problems.extend(p for p in check_unit(unit, rel_path=new_rel, sources=self.sources,
                                                  shown_path=shown, body=doc.body)
                            if p.severity is Severity.error)
            self.review_items += len(unit.review_items)
            self.outputs[new_rel] = doc
            self.touched_ids.add(eid)
            unit_ids.append(eid)
            if eid in self.manifest.retirement_candidates and not any(
                    r.code == RETIREMENT_CODE for r in unit.review_items):
                self.manifest.retirement_candidates.remove(eid)

        # previous units: proposed for retirement, or silently dropped by the model — both
        # become retirement candidates; a reviewed unit is never deleted by prepare
        retire = {r.id: r.message for r in reply.retirement_candidates}
        for eid in previous_ids:
            if eid in returned:
                continue
            message = retire.get(eid) or "the restructured source no longer yields this unit"
            item = self.existing.get(eid)
            if item is not None:
                doc = _copy_doc(item.doc)
                items = doc.front.setdefault("review_items", [])
                if not any(str(i.get("code")) == RETIREMENT_CODE for i in items):
                    items.append(to_rt({"code": RETIREMENT_CODE, "message": message}))
                    self.outputs[item.rel_path] = doc
                    self.touched_ids.add(eid)
                self.review_items += 1
            if eid not in self.manifest.retirement_candidates:
                self.manifest.retirement_candidates.append(eid)
            unit_ids.append(eid)
        self.manifest.sources[src.path] = SourceEntry(sha256=src.sha256, units=sorted(unit_ids))
        self._report(SourceReport(src.path, change.change, sorted(unit_ids), elapsed,
                                  ids_kept_by_code=dict(relinked.values())))
        return problems

    # --- whole batch ---------------------------------------------------------------------

    def check_batch(self) -> list[Problem]:
        """Corpus rules on the would-be state (ids unique, manifest consistent)."""
        by_rel: dict[str, LoadedUnit] = {}
        for eid, item in self.existing.items():
            by_rel[item.rel_path] = LoadedUnit(item.rel_path, item.doc, item.unit)
            del eid
        for rel, doc in self.outputs.items():
            if doc is None:
                by_rel.pop(rel, None)
            else:
                by_rel[rel] = LoadedUnit(rel, doc, doc.unit())
        problems = check_corpus(list(by_rel.values()), self.manifest,
                                shown_prefix=f"{self.ev}/", sources=self.sources)
        return [p for p in problems if p.severity is Severity.error]

    def batch(self) -> tuple[Batch, str]:
        """The file changes (relative to the workspace root) and a unified diff of them."""
        batch = Batch()
        diff_parts: list[str] = []
        for rel, doc in sorted(self.outputs.items()):
            target = f"{self.ev}/{rel}"
            path = self.ws.root / target
            old = path.read_bytes() if path.is_file() else None
            if doc is None:
                if old is not None:
                    batch.deletes.add(target)
                    diff_parts.append(_diff(target, old, None))
                continue
            new = dump_curated(doc).encode("utf-8")
            if new != old:
                batch.writes[target] = new
                diff_parts.append(_diff(target, old, new))
        manifest_rel = f"{self.ev}/{MANIFEST_NAME}"
        mpath = self.ws.root / manifest_rel
        old_m = mpath.read_bytes() if mpath.is_file() else None
        self.manifest.orphans = sorted(set(self.manifest.orphans))
        self.manifest.retirement_candidates = sorted(set(self.manifest.retirement_candidates))
        if old_m is None or self.manifest.to_data() != self.old_manifest.to_data() \
                or batch.writes or batch.deletes:
            new_m = dump_manifest(self.manifest).encode("utf-8")
            if new_m != old_m:
                batch.writes[manifest_rel] = new_m
                diff_parts.append(_diff(manifest_rel, old_m, new_m))
        return batch, "".join(diff_parts)


def _flag_atomic_too_large(unit: UnitBase, full: dict[str, Any], body: str,
                           max_chunk_chars: int) -> UnitBase:
    """Add the review item ``atomic_content_too_large`` (spec §9.8) when an atomic element
    cannot fit in one fragment, whatever the backend said."""
    rendered = render_body(unit, body if body.strip() else None)
    found = atomic_problems(unit, rendered, max_chunk_chars)
    if not found or any(r.code == ATOMIC_TOO_LARGE for r in unit.review_items):
        return unit
    items = [*full["review_items"],
             *({"code": ATOMIC_TOO_LARGE, "message": message, "field": field}
               for field, message in found)]
    return parse_unit({**full, "review_items": items})


def _cited_sources(data: dict[str, Any]) -> set[str]:
    """Source files a proposed unit names itself (it should name none, or its own)."""
    provenance = data.get("provenance")
    named = [data.get("source_file"),
             provenance.get("source_file") if isinstance(provenance, dict) else None]
    return {str(s) for s in named if s is not None}


def _copy_doc(doc: CuratedDocument) -> CuratedDocument:
    return parse_curated(dump_curated(doc), path=doc.path)


def _same_content(old: CuratedDocument, new: CuratedDocument) -> bool:
    return old.data() == new.data() and old.body == new.body


def _diff(rel: str, old: bytes | None, new: bytes | None) -> str:
    a = old.decode("utf-8", "replace").splitlines(keepends=True) if old is not None else []
    b = new.decode("utf-8", "replace").splitlines(keepends=True) if new is not None else []
    lines = difflib.unified_diff(a, b, fromfile=f"a/{rel}" if old is not None else "/dev/null",
                                 tofile=f"b/{rel}" if new is not None else "/dev/null")
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return text
