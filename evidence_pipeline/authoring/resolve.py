"""``tht evidence resolve``: retire a unit, or relink it to an existing source (spec §6).

Both actions run in the authoring session (lock, recovery, clean tree, manifest and its
``pipeline_version``), update curated file and manifest together (all or nothing) and make no
commit. A retired id goes to the manifest's ``retired_ids``: it is never issued again.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict

from evidence_pipeline.authoring.apply import Batch
from evidence_pipeline.authoring.relink import cite_source
from evidence_pipeline.authoring.session import AuthoringSession
from evidence_pipeline.authoring.sources import SourceError, read_source
from evidence_pipeline.formats.curated_writer import dump_curated
from evidence_pipeline.formats.manifest import (
    MANIFEST_NAME,
    RETIREMENT_CODE,
    SourceEntry,
    dump_manifest,
)
from evidence_runtime.errors import ErrorCode, EvidenceError
from evidence_runtime.units import check_evidence_id
from evidence_runtime.workspace import load_workspace


def _refused(message: str, **where: str | None) -> EvidenceError:
    return EvidenceError(message, code=ErrorCode.resolve_failed, **where)


class ResolveResult(BaseModel):
    """What resolve did; ``model_dump(mode="json")`` is ``resolve --json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: str  # "retired" | "relinked"
    evidence_id: str
    written: list[str]
    deleted: list[str]


def resolve(root: Path, evidence_id: str, *, retire: bool = False,
            source: str | None = None) -> ResolveResult:
    """Retire ``evidence_id`` or relink it to ``source`` (relative to evidence/ or the root).

    Refuses (nothing written) when an interrupted apply had to be completed first: that change
    is reviewed before another is made.
    """
    if retire == (source is not None):
        raise _refused("give exactly one of --retire or --source", evidence_id=evidence_id)
    try:
        check_evidence_id(evidence_id)
    except ValueError as exc:
        raise _refused(str(exc), evidence_id=evidence_id, field="id") from None
    ws = load_workspace(root)
    with AuthoringSession.open(ws, what="resolve") as session:
        session.refuse_if_rolled_forward()
        session.load()
        manifest_rel = session.shown(MANIFEST_NAME)
        if session.manifest is None:
            raise _refused("manifest.yaml is missing; run prepare first", path=manifest_rel)
        manifest = session.manifest_or_empty()
        item = session.existing.get(evidence_id)
        if item is None:
            raise _refused("no curated unit has this id", evidence_id=evidence_id)
        unit_rel = session.shown(item.rel_path)
        for entry in manifest.sources.values():
            if evidence_id in entry.units:
                entry.units.remove(evidence_id)
        manifest.orphans = [i for i in manifest.orphans if i != evidence_id]
        manifest.retirement_candidates = [i for i in manifest.retirement_candidates
                                          if i != evidence_id]
        batch = Batch()
        if retire:
            batch.deletes.add(unit_rel)
            manifest.retired_ids.append(evidence_id)  # issued once: never minted again
            action = "retired"
        else:
            assert source is not None
            rel = _source_rel(source, session.ev)
            try:
                src = read_source(ws.evidence_dir, rel)
            except SourceError as exc:
                raise _refused(exc.message, path=session.shown(rel), evidence_id=evidence_id,
                               field="provenance.source_file") from None
            entry = manifest.sources.get(rel)
            if entry is not None and entry.sha256 != src.sha256:
                raise _refused("this source changed since the last prepare; run prepare "
                               "first", path=session.shown(rel), evidence_id=evidence_id)
            if entry is None:
                entry = manifest.sources[rel] = SourceEntry(sha256=src.sha256, units=[])
            entry.units.append(evidence_id)
            doc = cite_source(item.doc, rel, src.sha256, path=unit_rel)
            items = doc.front.get("review_items") or []
            for i in [i for i in items if str(i.get("code")) == RETIREMENT_CODE]:
                items.remove(i)
            batch.writes[unit_rel] = dump_curated(doc).encode("utf-8")
            action = "relinked"
        manifest.retire_dropped(session.manifest)
        batch.writes[manifest_rel] = dump_manifest(manifest).encode("utf-8")
        session.apply(batch)
        return ResolveResult(action=action, evidence_id=evidence_id,
                             written=sorted(batch.writes), deleted=sorted(batch.deletes))


def _source_rel(source: str, ev: str) -> str:
    rel = PurePosixPath(source.replace("\\", "/")).as_posix()
    if rel.startswith(f"{ev}/"):
        rel = rel[len(ev) + 1:]
    if not rel.startswith("source/"):
        raise _refused("--source must name a file under evidence/source/", path=source)
    return rel
