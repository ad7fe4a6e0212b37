"""Relinking: which previous unit a proposed unit is, orphans that come home, and a unit moved
to another source.

The one policy for giving a previous unit back its id when a model rewrote it without one
(:func:`relink_dropped_units`), applied by prepare to every backend's reply; the one policy for
orphans whose source is back (:func:`bring_orphans_home`, spec §6); and the one way a unit is
pointed at another source (:func:`cite_source`: a renamed or restored source,
``resolve --source``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from evidence_pipeline.authoring.backends.base import ModelReply, ModelRequest
from evidence_pipeline.authoring.sources import Change, SourceChange
from evidence_pipeline.formats.curated_writer import dump_curated
from evidence_pipeline.formats.manifest import Manifest, SourceEntry
from evidence_pipeline.formats.normalize import canonical
from evidence_runtime.curated import CuratedDocument, parse_curated

if TYPE_CHECKING:
    from evidence_pipeline.authoring.session import ExistingUnit

Key = Callable[[dict[str, Any]], Any]


def comparison_form(text: Any) -> str:
    """The validator's comparison form of a text (canonical whitespace), case aside."""
    return canonical(str(text)).casefold()


def title_key(data: dict[str, Any]) -> Any:
    return comparison_form(data.get("title") or "") or None


def excerpts_key(data: dict[str, Any]) -> Any:
    quotes = data.get("supporting_excerpts")
    if quotes is None:
        quotes = (data.get("provenance") or {}).get("supporting_excerpts")
    return frozenset(comparison_form(q) for q in quotes or ()) or None


# The criteria in the order they are tried: a unit that kept its title is the clearest sign,
# then the very same supporting excerpts (the title rewritten, the facts quoted unchanged).
RELINK_CRITERIA: tuple[tuple[str, Key], ...] = (("title", title_key),
                                                ("supporting_excerpts", excerpts_key))


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
    for criterion, key in RELINK_CRITERIA:
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


def with_orphan_origins(manifest: Manifest, existing: Mapping[str, ExistingUnit]) -> Manifest:
    """A copy of ``manifest`` whose ``orphaned_sources`` also places the orphans it has no
    origin for (made before the manifest recorded one) by their own provenance: the source
    file and hash they were prepared from. A path that is a source again is left alone."""
    out = Manifest.model_validate(manifest.to_data())
    placed = {eid for entry in out.orphaned_sources.values() for eid in entry.units}
    for eid in sorted(set(out.orphans) - placed):
        item = existing.get(eid)
        if item is None:
            continue
        prov = item.unit.provenance
        if prov.source_file in out.sources:
            continue
        entry = out.orphaned_sources.setdefault(prov.source_file,
                                                SourceEntry(sha256=prov.source_sha256))
        if entry.sha256 == prov.source_sha256:
            entry.units.append(eid)
    return out


def bring_orphans_home(changes: Iterable[SourceChange], manifest: Manifest
                       ) -> list[SourceChange]:
    """The changes with every orphan whose source is back brought home (spec §6).

    A new source with exactly the hash a removed source had while its units are orphans takes
    them back with the same ids and no model call: ``restored`` at the same path, ``renamed``
    from it at another path (the hash matching exactly one such source and one new source, as
    for any rename). A new source at such a path with other content stays ``new``: prepare
    sends it to the model with those orphans as its previous units
    (:meth:`Manifest.previous_entry`).
    """
    by_path = {c.path: c for c in changes}
    orphaned: dict[str, SourceEntry] = {}
    for path in manifest.orphaned_sources:
        entry = manifest.previous_entry(path)
        if entry is not None and path not in manifest.sources:
            orphaned[path] = entry
    new = [c for c in by_path.values() if c.change is Change.new and c.source is not None]
    by_hash_orphaned: dict[str, list[str]] = {}
    by_hash_new: dict[str, list[SourceChange]] = {}
    for c in new:
        assert c.source is not None
        entry = orphaned.pop(c.path, None)
        if entry is None:
            by_hash_new.setdefault(c.source.sha256, []).append(c)
        elif entry.sha256 == c.source.sha256:
            by_path[c.path] = SourceChange(c.path, Change.restored, c.source)
    for path, entry in orphaned.items():
        by_hash_orphaned.setdefault(entry.sha256, []).append(path)
    for sha, olds in by_hash_orphaned.items():
        found = by_hash_new.get(sha, [])
        if len(olds) == 1 and len(found) == 1:
            c = found[0]
            by_path[c.path] = SourceChange(c.path, Change.renamed, c.source, renamed_from=olds[0])
    return [by_path[p] for p in sorted(by_path)]


def copy_doc(doc: CuratedDocument, *, path: str | None = None) -> CuratedDocument:
    """An independent copy of a curated document (round-trip data included)."""
    return parse_curated(dump_curated(doc), path=path or doc.path)


def cite_source(doc: CuratedDocument, source_file: str, sha256: str, *,
                path: str | None = None) -> CuratedDocument:
    """A copy of ``doc`` whose provenance cites ``source_file`` (relative to evidence/) at
    ``sha256``; everything else, the supporting excerpts included, is kept."""
    out = copy_doc(doc, path=path)
    out.front["provenance"]["source_file"] = source_file
    out.front["provenance"]["source_sha256"] = sha256
    return out
