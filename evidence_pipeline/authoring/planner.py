"""The prepare batch planner: the new state of curated files and manifest, source by source.

prepare (CLI and Dagster) takes every change in path order into one :class:`BatchPlanner`:
unchanged and renamed sources without a model call, each changed source from its model reply
(ids given back or minted, every unit checked), then the whole would-be corpus is checked and
turned into one :class:`Batch` and its diff.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer

from evidence_pipeline.authoring.apply import Batch
from evidence_pipeline.authoring.backends.base import ModelReply, ModelRequest, ProposedUnit
from evidence_pipeline.authoring.ids import assign_id
from evidence_pipeline.authoring.merge import (
    LAST_PROPOSALS,
    LastProposals,
    Side,
    curated_side,
    match_base,
    merge_unit,
    proposed_side,
    structural_bases,
)
from evidence_pipeline.authoring.relink import cite_source, copy_doc, relink_dropped_units
from evidence_pipeline.authoring.session import ExistingUnit, authoring_dir, evidence_rel
from evidence_pipeline.authoring.sources import Change, SourceChange
from evidence_pipeline.formats.curated_writer import (
    curated_relpath,
    document_from_unit,
    dump_curated,
    render_body,
    to_rt,
)
from evidence_pipeline.formats.fragments import ATOMIC_TOO_LARGE, atomic_problems
from evidence_pipeline.formats.manifest import (
    MANIFEST_NAME,
    PIPELINE_VERSION,
    RETIREMENT_CODE,
    Manifest,
    SourceEntry,
    dump_manifest,
)
from evidence_pipeline.validation.corpus import LoadedUnit, SourceReader
from evidence_pipeline.validation.problems import Problem, Severity
from evidence_pipeline.validation.rules import (
    check_corpus,
    check_unit,
    credential_problems,
    schema_problems,
    unit_text_findings,
)
from evidence_runtime.curated import CuratedDocument
from evidence_runtime.units import SCHEMA_VERSION, UnitBase, parse_unit
from evidence_runtime.workspace import Workspace


class SourceReport(BaseModel):
    """What became of one source in a prepare batch (one line of the progress and the JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    change: Change
    units: list[str] = Field(default_factory=list)
    model_seconds: float | None = None
    renamed_from: str | None = None
    # previous ids that code gave back to new units the model did not link (id -> criterion)
    ids_kept_by_code: dict[str, str] = Field(default_factory=dict)
    # info lines of the deterministic extraction (embedded data: images dropped, …)
    notes: list[str] = Field(default_factory=list)

    @field_serializer("model_seconds", when_used="json")
    def _rounded(self, seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds, 3)


Progress = Callable[[SourceReport], None]


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
    backend: str | None = None  # the backend's name: how the curated units are merged

    @property
    def path(self) -> str:
        return self.request.source_file


class BatchPlanner:
    """Accumulates the new state of curated files and manifest for one prepare batch."""

    def __init__(self, ws: Workspace, manifest: Manifest, existing: dict[str, ExistingUnit],
                 taken: set[str], progress: Progress | None) -> None:
        self.ws = ws
        self.ev = evidence_rel(ws)
        self.old_manifest = manifest
        self.manifest = Manifest(
            pipeline_version=PIPELINE_VERSION,
            sources={},
            orphans=list(manifest.orphans),
            retirement_candidates=list(manifest.retirement_candidates),
            retired_ids=list(manifest.retired_ids),
            orphaned_sources={path: entry.model_copy(deep=True)
                              for path, entry in manifest.orphaned_sources.items()},
        )
        self.existing = existing
        self.progress = progress
        self.reports: list[SourceReport] = []
        self.model_calls = 0
        self.review_items = 0
        self.taken = taken
        # evidence-relative path → new document (None = delete)
        self.outputs: dict[str, CuratedDocument | None] = {}
        self.sources = SourceReader(ws.evidence_dir)
        # the structural derivations of the changed sources' previous texts (merge bases)
        self._bases: dict[str, list[Side]] = {}
        self._last: LastProposals | None = None
        # (unit id, field) of every merge conflict, each a review item on its unit
        self.merge_conflicts: list[tuple[str, str]] = []

    # --- per source ----------------------------------------------------------------------

    def _report(self, report: SourceReport) -> None:
        self.reports.append(report)
        if self.progress:
            self.progress(report)

    def unchanged(self, change: SourceChange) -> None:
        entry = self.old_manifest.sources[change.path]
        self.manifest.sources[change.path] = SourceEntry(sha256=entry.sha256,
                                                         units=list(entry.units))
        self._report(SourceReport(path=change.path, change=Change.unchanged,
                                  units=sorted(entry.units)))

    def remove(self, change: SourceChange) -> None:
        entry = self.old_manifest.sources[change.path]
        for eid in entry.units:
            if eid not in self.manifest.orphans:
                self.manifest.orphans.append(eid)
        # where the orphans came from, so the source restored brings them home
        self.manifest.orphaned_sources[change.path] = SourceEntry(sha256=entry.sha256,
                                                                  units=list(entry.units))
        self._report(SourceReport(path=change.path, change=Change.removed,
                                  units=sorted(entry.units)))

    def rename(self, change: SourceChange) -> None:
        """A renamed source, or one restored unchanged (at its path or another) while its
        units are orphans: the same ids, provenance pointed at it, no model call."""
        assert change.source is not None
        old_path = change.renamed_from or change.path
        old = self.old_manifest.previous_entry(old_path)
        assert old is not None, old_path
        for eid in old.units:
            item = self.existing.get(eid)
            if item is None:
                continue
            self.outputs[item.rel_path] = cite_source(item.doc, change.path,
                                                      change.source.sha256)
        self._come_home(old_path, old.units)
        self.manifest.sources[change.path] = SourceEntry(sha256=change.source.sha256,
                                                         units=list(old.units))
        self._report(SourceReport(path=change.path, change=change.change,
                                  units=sorted(old.units), renamed_from=change.renamed_from))

    def _come_home(self, old_path: str, units: list[str]) -> None:
        """The units of a removed source are its source's again: no longer orphans."""
        if old_path in self.old_manifest.sources:
            return
        self.manifest.orphans = [eid for eid in self.manifest.orphans if eid not in units]
        self.manifest.orphaned_sources.pop(old_path, None)

    def restructure(self, change: SourceChange, proposal: SourceProposal) -> list[Problem]:
        """Take in the model's answer for one changed source: ids, units, checks, manifest."""
        src = change.source
        assert src is not None
        shown_src = f"{self.ev}/{src.path}"
        previous = self.old_manifest.previous_entry(src.path)
        previous_ids = list(previous.units) if previous is not None else []
        request = proposal.request
        self.model_calls += 1
        if (request.source_file, request.source_sha256) != (src.path, src.sha256):
            self._report(SourceReport(path=src.path, change=change.change,
                                      model_seconds=proposal.seconds))
            return [Problem("source_changed", Severity.error, shown_src, None,
                            "the source changed while prepare ran; run prepare again")]
        if proposal.reply is None:
            failure = proposal.failure
            assert failure is not None
            self._report(SourceReport(path=src.path, change=change.change,
                                      model_seconds=proposal.seconds))
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
            proposed = self._merged(eid, proposed, request, proposal.backend)
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
            unit = _flag_hidden_text(unit, full, proposed.body)
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
                doc = copy_doc(item.doc)
                items = doc.front.setdefault("review_items", [])
                if not any(str(i.get("code")) == RETIREMENT_CODE for i in items):
                    items.append(to_rt({"code": RETIREMENT_CODE, "message": message}))
                    self.outputs[item.rel_path] = doc
                self.review_items += 1
            if eid not in self.manifest.retirement_candidates:
                self.manifest.retirement_candidates.append(eid)
            unit_ids.append(eid)
        self._come_home(src.path, previous_ids)  # a restored source's orphans were previous
        self.manifest.sources[src.path] = SourceEntry(sha256=src.sha256, units=sorted(unit_ids))
        self._report(SourceReport(path=src.path, change=change.change, units=sorted(unit_ids),
                                  model_seconds=elapsed,
                                  ids_kept_by_code=dict(relinked.values()),
                                  notes=list(src.notes)))
        return problems

    def _merged(self, eid: str, proposed: ProposedUnit, request: ModelRequest,
                backend: str | None) -> ProposedUnit:
        """The proposed unit merged three ways with the curated unit of the same id (see
        :mod:`~evidence_pipeline.authoring.merge`); a new unit, or one without a known base,
        as proposed. A model backend's proposal is recorded as the base of the next merge."""
        structural = backend == "structural"
        recorded = backend is not None and not structural
        base: Side | None = None
        old = self.existing.get(eid)
        if recorded:
            if old is not None:
                prov = old.doc.data().get("provenance") or {}
                base = self.last_proposals().base(eid, str(prov.get("source_sha256", "")))
            self.last_proposals().record(eid, request.source_sha256, proposed)
        if old is None or eid not in request.allowed_ids:
            return proposed
        theirs, ours = proposed_side(proposed), curated_side(old.doc)
        if theirs == ours:
            return proposed
        if structural:
            if request.source_file not in self._bases:
                self._bases[request.source_file] = structural_bases(request)
            base = match_base(theirs, self._bases[request.source_file])
        if base is None:
            return proposed
        merged = merge_unit(base, ours, theirs, normalized_text=request.normalized_text)
        self.merge_conflicts.extend((eid, item["field"]) for item in merged.conflicts)
        return ProposedUnit(id=proposed.id, data=merged.data, body=merged.body)

    def last_proposals(self) -> LastProposals:
        if self._last is None:
            self._last = LastProposals(authoring_dir(self.ws) / LAST_PROPOSALS)
        return self._last

    def save_proposals(self) -> None:
        """Write the model backends' proposals taken in (call once the batch is applied); the
        ids no longer in use (retired, dropped) are forgotten."""
        if self._last is not None:
            self._last.save(keep=self.manifest.ids_in_use())

    # --- whole batch ---------------------------------------------------------------------

    def check_batch(self) -> list[Problem]:
        """Corpus rules on the would-be state (ids unique, manifest consistent)."""
        by_rel: dict[str, LoadedUnit] = {}
        for item in self.existing.values():
            by_rel[item.rel_path] = LoadedUnit(item.rel_path, item.doc, item.unit)
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
                origin = _source_of(doc)
                if origin is not None:
                    batch.origins[target] = origin
                diff_parts.append(_diff(target, old, new))
        manifest_rel = f"{self.ev}/{MANIFEST_NAME}"
        mpath = self.ws.root / manifest_rel
        old_m = mpath.read_bytes() if mpath.is_file() else None
        self.manifest.orphans = sorted(set(self.manifest.orphans))
        self.manifest.retirement_candidates = sorted(set(self.manifest.retirement_candidates))
        self.manifest.retire_dropped(self.old_manifest)  # an id dropped is never issued again
        if old_m is None or self.manifest.to_data() != self.old_manifest.to_data() \
                or batch.writes or batch.deletes:
            new_m = dump_manifest(self.manifest).encode("utf-8")
            if new_m != old_m:
                batch.writes[manifest_rel] = new_m
                diff_parts.append(_diff(manifest_rel, old_m, new_m))
        return batch, "".join(diff_parts)


def _flag_hidden_text(unit: UnitBase, full: dict[str, Any], body: str) -> UnitBase:
    """Add a review item for each field holding invisible characters and for a title mixing
    scripts (issue 28, item 8): what a reviewer cannot see is never approved unseen."""
    carried = {(r.code, r.field) for r in unit.review_items}
    found = [(code, field, message) for code, field, message
             in unit_text_findings(unit, body if body.strip() else None)
             if (code, field) not in carried]
    if not found:
        return unit
    items = [*(r.model_dump(mode="json", exclude_none=True) for r in unit.review_items),
             *({"code": code, "message": message, "field": field}
               for code, field, message in found)]
    return parse_unit({**full, "review_items": items})


def _source_of(doc: CuratedDocument) -> str | None:
    """The source file a curated document names in its provenance, if it names one."""
    front: Any = doc.front
    prov = front.get("provenance") if isinstance(front, dict) else None
    source = prov.get("source_file") if isinstance(prov, dict) else None  # type: ignore[union-attr]
    return source if isinstance(source, str) else None


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


def _same_content(old: CuratedDocument, new: CuratedDocument) -> bool:
    return old.data() == new.data() and old.body == new.body


def _diff(rel: str, old: bytes | None, new: bytes | None) -> str:
    a = old.decode("utf-8", "replace").splitlines(keepends=True) if old is not None else []
    b = new.decode("utf-8", "replace").splitlines(keepends=True) if new is not None else []
    lines = difflib.unified_diff(a, b, fromfile=f"a/{rel}" if old is not None else "/dev/null",
                                 tofile=f"b/{rel}" if new is not None else "/dev/null")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
