"""``tht evidence resolve``: retire a unit, or relink it to an existing source (spec §6).

Both actions need a clean tree, update curated file and manifest together (all or nothing) and
make no commit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from evidence_pipeline.authoring.apply import Batch, apply_batch, recover
from evidence_pipeline.authoring.curated_writer import dump_curated
from evidence_pipeline.authoring.manifest import (
    MANIFEST_NAME,
    SourceEntry,
    dump_manifest,
    read_manifest,
)
from evidence_pipeline.authoring.prepare import RETIREMENT_CODE, load_existing
from evidence_pipeline.authoring.sources import SourceError, read_source
from evidence_pipeline.gitrepo import require_clean
from evidence_pipeline.lock import workspace_lock
from evidence_runtime.curated import parse_curated
from evidence_runtime.errors import EvidenceError
from evidence_runtime.units import check_evidence_id
from evidence_runtime.workspace import load_workspace


class ResolveError(EvidenceError):
    code = "resolve_failed"


@dataclass
class ResolveResult:
    action: str  # "retired" | "relinked"
    evidence_id: str
    written: list[str]
    deleted: list[str]


def resolve(root: Path, evidence_id: str, *, retire: bool = False,
            source: str | None = None) -> ResolveResult:
    """Retire ``evidence_id`` or relink it to ``source`` (relative to evidence/ or the root)."""
    if retire == (source is not None):
        raise ResolveError("give exactly one of --retire or --source", evidence_id=evidence_id)
    try:
        check_evidence_id(evidence_id)
    except ValueError as exc:
        raise ResolveError(str(exc), evidence_id=evidence_id, field="id") from None
    ws = load_workspace(root)
    ev = ws.config.evidence.root.strip("/")
    local = ws.root / ".tht"
    with workspace_lock(local, what="resolve"):
        recover(ws.root, local)
        require_clean(ws.root, (f"{ev}/curated", f"{ev}/{MANIFEST_NAME}"), what="resolve")
        manifest_rel = f"{ev}/{MANIFEST_NAME}"
        manifest = read_manifest(ws.evidence_dir, shown=manifest_rel)
        if manifest is None:
            raise ResolveError("manifest.yaml is missing; run prepare first", path=manifest_rel)
        existing, _ = load_existing(ws)
        item = existing.get(evidence_id)
        if item is None:
            raise ResolveError("no curated unit has this id", evidence_id=evidence_id)
        unit_rel = f"{ev}/{item.rel_path}"
        for entry in manifest.sources.values():
            if evidence_id in entry.units:
                entry.units.remove(evidence_id)
        manifest.orphans = [i for i in manifest.orphans if i != evidence_id]
        manifest.retirement_candidates = [i for i in manifest.retirement_candidates
                                          if i != evidence_id]
        batch = Batch()
        if retire:
            batch.deletes.add(unit_rel)
            action = "retired"
        else:
            assert source is not None
            rel = _source_rel(source, ev)
            try:
                src = read_source(ws.evidence_dir, rel)
            except SourceError as exc:
                raise ResolveError(exc.message, path=f"{ev}/{rel}", evidence_id=evidence_id,
                                   field="provenance.source_file") from None
            entry = manifest.sources.get(rel)
            if entry is not None and entry.sha256 != src.sha256:
                raise ResolveError("this source changed since the last prepare; run prepare "
                                   "first", path=f"{ev}/{rel}", evidence_id=evidence_id)
            if entry is None:
                entry = manifest.sources[rel] = SourceEntry(sha256=src.sha256, units=[])
            entry.units.append(evidence_id)
            doc = parse_curated(dump_curated(item.doc), path=unit_rel)
            doc.front["provenance"]["source_file"] = rel
            doc.front["provenance"]["source_sha256"] = src.sha256
            items = doc.front.get("review_items") or []
            for i in [i for i in items if str(i.get("code")) == RETIREMENT_CODE]:
                items.remove(i)
            batch.writes[unit_rel] = dump_curated(doc).encode("utf-8")
            action = "relinked"
        batch.writes[manifest_rel] = dump_manifest(manifest).encode("utf-8")
        apply_batch(ws.root, local, batch, name=f"resolve-{time.time_ns()}")
        return ResolveResult(action, evidence_id, sorted(batch.writes), sorted(batch.deletes))


def _source_rel(source: str, ev: str) -> str:
    rel = PurePosixPath(source.replace("\\", "/")).as_posix()
    if rel.startswith(f"{ev}/"):
        rel = rel[len(ev) + 1:]
    if not rel.startswith("source/"):
        raise ResolveError("--source must name a file under evidence/source/", path=source)
    return rel
