"""The shared, all-or-nothing formula import: candidates placed, minted and validated in the
authoring session, then one batch of sources, curated files and manifest (spec §5.5, §12)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field

from evidence_pipeline.authoring.apply import Batch
from evidence_pipeline.authoring.ids import assign_id
from evidence_pipeline.authoring.session import AuthoringSession
from evidence_pipeline.authoring.sources import Source, SourceError, check_rel_path
from evidence_pipeline.authoring.sources import take_in as take_in_source
from evidence_pipeline.formats.curated_writer import (
    curated_relpath,
    document_from_unit,
    dump_curated,
    render_body,
)
from evidence_pipeline.formats.manifest import (
    MANIFEST_NAME,
    Manifest,
    SourceEntry,
    dump_manifest,
)
from evidence_pipeline.formats.normalize import excerpt_in_source
from evidence_pipeline.validation.corpus import SourceReader, sha256_bytes
from evidence_pipeline.validation.problems import Problem, Severity, sort_problems
from evidence_pipeline.validation.rules import (
    check_unit,
    credential_problems,
    schema_problems,
)
from evidence_runtime.errors import ErrorCode, EvidenceError
from evidence_runtime.units import (
    ID_PREFIX,
    MAX_EXCERPT_CHARS,
    SCHEMA_VERSION,
    column_table,
    parse_unit,
)
from evidence_runtime.workspace import Workspace

FORMULA_PURPOSES = ("sql_generation", "schema_linking")


class FormulaImportError(EvidenceError):
    """An import was refused; nothing was written. ``problems`` lists validation findings."""

    code = ErrorCode.formula_import_failed

    def __init__(self, message: str, problems: Sequence[Problem] = (), **kw: Any) -> None:
        super().__init__(message, **kw)
        self.problems = list(problems)


class ImportEntry(BaseModel):
    """One input (legacy file or proposal) and what became of it."""

    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True,
                              validate_by_name=True)

    origin: str = Field(serialization_alias="file")  # the legacy file, or ``<artifact>#<n>``
    source: str  # the source file it is (or was) imported as, relative to the workspace root
    evidence_id: str | None
    status: str  # "imported" | "unchanged" | "duplicate"
    review_codes: tuple[str, ...] = Field(default=(), serialization_alias="review_items")


class ImportResult(BaseModel):
    """What an import did; ``model_dump(mode="json")`` is the commands' ``--json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: str  # "applied" | "unchanged" | "recovered"
    entries: list[ImportEntry] = Field(default_factory=list)
    written: list[str] = Field(default_factory=list)
    recovered: list[str] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def problems(self) -> list[Any]:
        """Always empty: a refused import raises :class:`FormulaImportError`."""
        return []


# A unit builder receives the taken-in source and the minted id, returns (unit data, body text).
UnitBuilder = Callable[[Source, str], tuple[dict[str, Any], str]]


@dataclass(frozen=True)
class Candidate:
    """One input ready to import: its source bytes and how to build its unit."""

    origin: str
    source_rel: str  # relative to evidence/
    raw: bytes
    title: str
    build: UnitBuilder
    suffixable: bool = False  # proposals take base-2, base-3, … when the name is taken


def _clip(text: str) -> str:
    """A verbatim prefix of at most MAX_EXCERPT_CHARS characters, cut at a space if possible."""
    text = text.strip()
    if len(text) <= MAX_EXCERPT_CHARS:
        return text
    cut = text.rfind(" ", 0, MAX_EXCERPT_CHARS + 1)
    return text[:cut if cut > MAX_EXCERPT_CHARS // 2 else MAX_EXCERPT_CHARS].rstrip()


def _tables(columns: Sequence[str]) -> list[str]:
    out: list[str] = []
    for col in columns:
        table = column_table(col)
        if table not in out:
            out.append(table)
    return out


def formula_data(*, eid: str, title: str, concept: str, columns: Sequence[str], sql: str,
                  language: str, source: Source, excerpts: Sequence[str],
                  review_items: list[dict[str, Any]]) -> dict[str, Any]:
    """The data of a formula unit; each of ``excerpts`` is cut to a verbatim prefix the unit
    can hold, and only those found again in the source are kept."""
    return {
        "schema_version": SCHEMA_VERSION,
        "id": eid,
        "title": title,
        "kind": "formula",
        "purposes": list(FORMULA_PURPOSES),
        "applies_to": {"concepts": [concept], "tables": _tables(columns),
                       "columns": list(columns)},
        "language": language,
        # only quotes the validator finds again in the normalized source (a quote that spans
        # list markup can normalize differently); none left is reported by the schema check
        "provenance": {"source_file": source.path, "source_sha256": source.sha256,
                       "supporting_excerpts": [e for e in map(_clip, excerpts) if e and
                                               excerpt_in_source(e, source.normalized)][:5]},
        "formula": {"concept": concept, "columns": list(columns), "sql": sql},
        "review_items": review_items,
    }



def take_in(raw: bytes, rel: str, *, shown: str) -> Source:
    """:func:`sources.take_in` (with its path check) for bytes not yet under evidence/source/;
    a refusal is a :class:`FormulaImportError` naming ``shown``, with the source's code."""
    try:
        check_rel_path(rel)
        return take_in_source(raw, rel)
    except SourceError as exc:
        raise FormulaImportError(exc.message, path=shown, code=exc.code) from None


class _PendingSources(SourceReader):
    """The evidence directory as it will be once the batch's new sources are written."""

    def __init__(self, evidence_dir: Path, pending: dict[str, Source]) -> None:
        super().__init__(evidence_dir)
        self.pending = pending

    def get(self, rel: str) -> tuple[str, str] | str:
        src = self.pending.get(rel)
        if src is not None:
            return src.sha256, src.normalized
        return super().get(rel)


def _suffixed(rel: str) -> Iterator[str]:
    yield rel
    stem = rel.removesuffix(".md")
    n = 2
    while True:
        yield f"{stem}-{n}.md"
        n += 1


def run_import(ws: Workspace, candidates: list[Candidate], *, what: str) -> ImportResult:
    """Place, mint and validate every candidate in the authoring session, then apply sources,
    curated files and manifest all or nothing; :class:`FormulaImportError`, nothing written."""
    with AuthoringSession.open(ws, what=what) as session:
        if session.rolled_forward:
            # an interrupted apply was rolled forward: that is this run's change to review
            return ImportResult(status="recovered", recovered=session.recovered)
        session.load(clean=("curated", "source", MANIFEST_NAME))
        unreadable = session.unreadable
        if unreadable:
            raise FormulaImportError(
                f"{len(unreadable)} curated file(s) cannot be read as units (their ids are "
                f"unknown, new ids could clash); first: {unreadable[0].line()}",
                unreadable, code="curated_unreadable")
        manifest = session.manifest_or_empty()
        planner = _ImportPlanner(ws, session.ev, manifest, session.taken_ids(),
                                 {eid: [i.code for i in item.unit.review_items]
                                  for eid, item in session.existing.items()})
        for candidate in candidates:
            planner.add(candidate)
        errors = [p for p in planner.problems if p.severity is Severity.error]
        if errors:
            errors = sort_problems(errors)
            origin = planner.origins.get(errors[0].path or "", "")
            raise FormulaImportError(
                f"{what} refused: {len(errors)} problem(s), the work tree was not changed; "
                f"first: {errors[0].line()}" + (f" (from {origin})" if origin else ""),
                errors)
        batch = planner.batch
        if not batch.is_empty():
            batch.writes[session.shown(MANIFEST_NAME)] = dump_manifest(manifest).encode("utf-8")
        session.apply(batch)
        return ImportResult(status="applied" if not batch.is_empty() else "unchanged",
                            entries=planner.entries, written=sorted(batch.writes),
                            recovered=session.recovered)


class _ImportPlanner:
    """Places each candidate's source, mints its unit and validates it, into one batch."""

    def __init__(self, ws: Workspace, ev: str, manifest: Manifest, taken: set[str],
                 existing_reviews: dict[str, list[str]]) -> None:
        self.ws = ws
        self.existing_reviews = existing_reviews
        self.ev = ev
        self.manifest = manifest
        self.taken = taken
        self.batch = Batch()
        self.entries: list[ImportEntry] = []
        self.problems: list[Problem] = []
        self.pending: dict[str, Source] = {}
        self.planned: dict[str, tuple[bytes, str]] = {}  # source rel → (bytes, unit id)
        self.origins: dict[str, str] = {}  # shown unit path → the input it comes from
        self.sources = _PendingSources(ws.evidence_dir, self.pending)

    def _place(self, candidate: Candidate) -> tuple[str, str]:
        """(source rel, state): state is new | present | unchanged | duplicate."""
        paths = _suffixed(candidate.source_rel) if candidate.suffixable \
            else iter([candidate.source_rel])
        for rel in paths:
            shown = f"{self.ev}/{rel}"
            planned = self.planned.get(rel)
            if planned is not None:
                if planned[0] == candidate.raw:
                    return rel, "duplicate"
                if candidate.suffixable:
                    continue
                raise FormulaImportError("two inputs would be written to the same source file",
                                         path=shown, code="source_conflict")
            file = self.ws.evidence_dir / rel
            on_disk = file.read_bytes() if file.is_file() and not file.is_symlink() else None
            entry = self.manifest.sources.get(rel)
            if on_disk is None:
                if file.exists() or file.is_symlink():
                    raise FormulaImportError("exists and is not a regular file", path=shown,
                                             code="source_conflict")
                if entry is not None:
                    raise FormulaImportError("listed in the manifest but missing from the tree; "
                                             "run prepare first", path=shown,
                                             code="source_conflict")
                return rel, "new"
            if on_disk != candidate.raw:
                if candidate.suffixable:
                    continue
                raise FormulaImportError(
                    f"already exists with different content: {candidate.origin} changed since "
                    "it was imported; update the source and run prepare, or remove the old "
                    "import first", path=shown, code="source_conflict")
            if entry is None:
                return rel, "present"  # copied by hand and committed, never prepared
            if entry.sha256 != sha256_bytes(on_disk):
                raise FormulaImportError("changed since the last prepare; run prepare first",
                                         path=shown, code="source_conflict")
            return rel, "unchanged"
        raise AssertionError("unreachable")  # pragma: no cover

    def add(self, candidate: Candidate) -> None:
        rel, state = self._place(candidate)
        shown_src = f"{self.ev}/{rel}"
        if state == "unchanged":
            units = sorted(self.manifest.sources[rel].units)
            eid = units[0] if units else None
            self.entries.append(ImportEntry(
                origin=candidate.origin, source=shown_src, evidence_id=eid, status="unchanged",
                review_codes=tuple(self.existing_reviews.get(eid or "", []))))
            return
        if state == "duplicate":
            self.entries.append(ImportEntry(origin=candidate.origin, source=shown_src,
                                            evidence_id=self.planned[rel][1],
                                            status="duplicate"))
            return
        source = take_in(candidate.raw, rel, shown=candidate.origin)
        eid = assign_id(candidate.title, self.taken)
        data, body_text = candidate.build(source, eid)
        shown_unit = f"{self.ev}/curated/formula/{eid.removeprefix(ID_PREFIX)}.md"
        self.origins[shown_unit] = candidate.origin
        try:
            unit = parse_unit(data)
        except ValidationError as exc:
            self.problems.extend(schema_problems(exc, path=shown_unit, evidence_id=eid))
            return
        unit_rel = curated_relpath(unit)
        if (self.ws.evidence_dir / unit_rel).exists():
            raise FormulaImportError("a curated file already has this name", path=shown_unit,
                                     evidence_id=eid, code="id_duplicate")
        doc = document_from_unit(unit, render_body(unit, body_text))
        self.pending[rel] = source
        self.problems.extend(credential_problems(doc.data(), doc.body, path=shown_unit,
                                                 evidence_id=eid))
        self.problems.extend(check_unit(unit, rel_path=unit_rel, sources=self.sources,
                                        shown_path=shown_unit))
        if state == "new":
            self.batch.writes[shown_src] = candidate.raw
        self.batch.writes[f"{self.ev}/{unit_rel}"] = dump_curated(doc).encode("utf-8")
        self.manifest.sources[rel] = SourceEntry(sha256=source.sha256, units=[eid])
        self.planned[rel] = (candidate.raw, eid)
        self.entries.append(ImportEntry(origin=candidate.origin, source=shown_src,
                                        evidence_id=eid, status="imported",
                                        review_codes=tuple(i.code for i in unit.review_items)))
