"""``evidence/manifest.yaml`` (spec §3.3): source hashes, derived unit ids, orphans, retirements.

Written by prepare and resolve only. Reading keeps the round-trip data so an untouched manifest is
saved byte for byte; code that changes it writes the canonical (sorted) form.

Two keys beyond DESIGN.md's format (extra keys are allowed there):

- ``retired_ids``: every id that was issued in the workspace and is no longer in use (a unit
  retired with ``resolve --retire``, or dropped from the manifest by any authoring command).
  With the ids in use they are every id ever issued: a new unit never gets one of them (spec
  §4.2, "assegnato una sola volta"), so an old session receipt never points at other knowledge.
- ``orphaned_sources``: for each removed source whose units are orphans, the hash it had and
  those units, so the source restored unchanged (at its path or another) brings them home
  with the same ids, and restored changed it gives them to the model as previous units
  (spec §6). An entry lives as long as one of its units is still an orphan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evidence_pipeline.formats.curated_writer import dump_rt
from evidence_runtime.curated import decode_text, validation_messages
from evidence_runtime.errors import ErrorCode, EvidenceError, UnitFormatError
from evidence_runtime.units import EvidenceIds, Sha256, check_source_path
from evidence_runtime.yamlio import load_rt, to_plain

PIPELINE_VERSION = 1
MANIFEST_NAME = "manifest.yaml"
# the review item a retirement candidate's unit carries (set by prepare, cleared by resolve)
RETIREMENT_CODE = "source_no_longer_supports_unit"


class ManifestError(EvidenceError):
    code = ErrorCode.manifest_malformed


class SourceEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: Sha256
    units: EvidenceIds = Field(default_factory=list)


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pipeline_version: int
    sources: dict[str, SourceEntry] = Field(default_factory=dict)
    orphans: EvidenceIds = Field(default_factory=list)
    retirement_candidates: EvidenceIds = Field(default_factory=list)
    retired_ids: EvidenceIds = Field(default_factory=list)
    orphaned_sources: dict[str, SourceEntry] = Field(default_factory=dict)

    @field_validator("sources", "orphaned_sources")
    @classmethod
    def _source_paths(cls, v: dict[str, SourceEntry]) -> dict[str, SourceEntry]:
        for path in v:
            try:
                check_source_path(path)
            except ValueError as exc:
                raise ValueError(f"source {path!r}: {exc}") from None
        return v

    def unit_sources(self) -> dict[str, list[str]]:
        """unit id → the sources that list it (more than one is an inconsistency)."""
        out: dict[str, list[str]] = {}
        for path, entry in self.sources.items():
            for unit_id in entry.units:
                out.setdefault(unit_id, []).append(path)
        return out

    def all_unit_ids(self) -> set[str]:
        return set(self.unit_sources())

    def ids_in_use(self) -> set[str]:
        """The ids the manifest lists as units, orphans or retirement candidates."""
        return self.all_unit_ids() | set(self.orphans) | set(self.retirement_candidates)

    def issued_ids(self) -> set[str]:
        """Every id ever issued in the workspace: in use or retired (never minted again)."""
        return self.ids_in_use() | set(self.retired_ids)

    def retire_dropped(self, previous: Manifest) -> None:
        """Record as retired every id of ``previous`` that this manifest no longer uses."""
        dropped = previous.issued_ids() - self.ids_in_use()
        self.retired_ids = sorted(set(self.retired_ids) | dropped)

    def previous_entry(self, path: str) -> SourceEntry | None:
        """What the source at ``path`` yielded: its entry, or, for a removed source whose units
        are still orphans, the hash it had and those units."""
        entry = self.sources.get(path)
        if entry is not None:
            return entry
        orphaned = self.orphaned_sources.get(path)
        if orphaned is None:
            return None
        orphans = set(self.orphans)
        units = [u for u in orphaned.units if u in orphans]
        return SourceEntry(sha256=orphaned.sha256, units=units) if units else None

    def to_data(self) -> dict[str, Any]:
        """Canonical plain data: sources and ids sorted; an orphaned source only while one of
        its units is an orphan; ``retired_ids`` and ``orphaned_sources`` only when not empty."""
        orphans = sorted(set(self.orphans))
        orphaned = {path: [u for u in sorted(set(entry.units)) if u in orphans]
                    for path, entry in sorted(self.orphaned_sources.items())}
        data: dict[str, Any] = {
            "pipeline_version": self.pipeline_version,
            "sources": {
                path: {"sha256": entry.sha256, "units": sorted(entry.units)}
                for path, entry in sorted(self.sources.items())
            },
            "orphans": orphans,
            "retirement_candidates": sorted(set(self.retirement_candidates)),
        }
        # the two keys beyond DESIGN.md's format only when they hold something: a workspace
        # that never retired an id nor lost a source keeps the manifest it was given
        retired = sorted(set(self.retired_ids))
        if retired:
            data["retired_ids"] = retired
        kept = {path: {"sha256": self.orphaned_sources[path].sha256, "units": units}
                for path, units in orphaned.items() if units}
        if kept:
            data["orphaned_sources"] = kept
        return data


def incompatible_version(found: int) -> str:
    """The one message for a manifest written by another pipeline version."""
    return (f"manifest pipeline_version {found} is not compatible with this installation "
            f"({PIPELINE_VERSION}); run `tht evidence prepare --upgrade` on a clean repository "
            "to reprocess every source")


def require_compatible(manifest: Manifest, *, shown: str) -> None:
    """Raise :class:`ManifestError` (``pipeline_version_incompatible``) unless ``manifest`` was
    written by this pipeline version."""
    if manifest.pipeline_version != PIPELINE_VERSION:
        raise ManifestError(incompatible_version(manifest.pipeline_version), path=shown,
                            field="pipeline_version", code="pipeline_version_incompatible")


def empty_manifest() -> Manifest:
    return Manifest(pipeline_version=PIPELINE_VERSION)


def parse_manifest(text: str, *, path: str) -> Manifest:
    """Parse manifest text; :class:`ManifestError` names the field at fault."""
    return manifest_from_data(manifest_data(text, path=path), path=path)


def manifest_data(text: str, *, path: str) -> dict[str, Any]:
    """Manifest text as plain data (what :func:`manifest_from_data` takes, and what a cache can
    keep); :class:`ManifestError` when it is not a YAML mapping."""
    try:
        data = to_plain(load_rt(text, path=path))
    except UnitFormatError as exc:
        raise ManifestError(exc.message, path=path) from None
    if not isinstance(data, dict):
        raise ManifestError("must be a YAML mapping", path=path)
    return cast(dict[str, Any], data)


def manifest_from_data(data: dict[str, Any], *, path: str) -> Manifest:
    """The manifest that plain ``data`` holds; :class:`ManifestError` names the field at fault."""
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        field, message = validation_messages(exc)[0]
        raise ManifestError(message, path=path, field=field) from None


def decode_manifest(raw: bytes, *, path: str) -> str:
    """A manifest file's bytes as text; :class:`ManifestError` when they are not UTF-8 text."""
    try:
        return decode_text(raw, path=path)
    except UnitFormatError as exc:
        raise ManifestError(exc.message, path=path) from None


def read_manifest(evidence_dir: Path, *, shown: str | None = None) -> Manifest | None:
    """The manifest of an evidence directory, or None when there is none yet."""
    file = evidence_dir / MANIFEST_NAME
    shown = shown or str(file)
    if not file.exists():
        return None
    return parse_manifest(decode_manifest(file.read_bytes(), path=shown), path=shown)


def dump_manifest(manifest: Manifest) -> str:
    """Canonical manifest text."""
    return dump_rt(manifest.to_data())
