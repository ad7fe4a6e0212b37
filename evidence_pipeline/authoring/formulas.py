"""Formula migration and formula proposals (spec §4.3, §12, §16): two maintenance imports.

``import_formulas`` converts the legacy store ``formulas/*.sql.md`` into curated ``kind: formula``
units, each citing a verbatim copy of its legacy file under ``evidence/source/``; after the
migration there is one runtime store. ``import_proposals`` takes the formula proposals a workflow
session recorded in its artifact and turns each into a source note plus a curated unit awaiting
review. A workflow session never writes the repository: these imports, run by a maintainer on a
clean authoring clone, are the only way in, and Git review is the approval.

Both give prepare's guarantees (spec §5.5, §6, §13.1): a clean tree, the workspace lock, every
unit validated before anything is written, one all-or-nothing batch (sources, curated files,
manifest), ids minted once, and a re-run on the same input is a no-op.
"""

from __future__ import annotations

import json
import re
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evidence_pipeline.authoring.apply import Batch, apply_batch, recover
from evidence_pipeline.authoring.curated_writer import (
    curated_relpath,
    document_from_unit,
    dump_curated,
    render_body,
)
from evidence_pipeline.authoring.ids import assign_id, slugify
from evidence_pipeline.authoring.manifest import (
    MANIFEST_NAME,
    PIPELINE_VERSION,
    Manifest,
    SourceEntry,
    dump_manifest,
    empty_manifest,
    read_manifest,
)
from evidence_pipeline.authoring.normalize import excerpt_in_source, normalize_text
from evidence_pipeline.authoring.prepare import load_existing
from evidence_pipeline.authoring.sources import (
    MAX_LINE_CHARS,
    MAX_SOURCE_BYTES,
    Source,
    SourceError,
    check_rel_path,
)
from evidence_pipeline.gitrepo import require_clean
from evidence_pipeline.lock import workspace_lock
from evidence_pipeline.validation.corpus import SourceReader, corpus_files, sha256_bytes
from evidence_pipeline.validation.problems import Problem, Severity, sort_problems
from evidence_pipeline.validation.rules import (
    FORMULA_SQL_REVIEW_CODES,
    LEGACY_FORMULA_SOURCES,
    check_formula_sql,
    check_unit,
    credential_problems,
    find_credentials,
    schema_problems,
)
from evidence_runtime.curated import decode_text
from evidence_runtime.errors import EvidenceError, UnitFormatError
from evidence_runtime.units import (
    ID_PREFIX,
    MAX_EXCERPT_CHARS,
    SCHEMA_VERSION,
    check_column_ref,
    column_table,
    parse_unit,
)
from evidence_runtime.workspace import Workspace, load_workspace

__all__ = [
    "LEGACY_INCOMPATIBLE",
    "LEGACY_SOURCE_DIR",
    "PROPOSALS_SOURCE_DIR",
    "PROPOSAL_AWAITING_REVIEW",
    "FormulaImportError",
    "FormulaProposal",
    "ImportEntry",
    "ImportResult",
    "import_formulas",
    "import_proposals",
    "read_proposals",
]

# Where the copies of legacy files and the proposal notes live, relative to evidence/.
LEGACY_SOURCE_DIR = LEGACY_FORMULA_SOURCES.rstrip("/")
PROPOSALS_SOURCE_DIR = "source/proposals"

LEGACY_INCOMPATIBLE = "legacy_formula_incompatible"
PROPOSAL_AWAITING_REVIEW = "formula_proposal_awaiting_review"
assert LEGACY_INCOMPATIBLE in FORMULA_SQL_REVIEW_CODES

FORMULA_PURPOSES = ("sql_generation", "schema_linking")
SQL_LANGS = frozenset({"sql", "postgresql", "postgres", "pgsql", "psql"})
MAX_ARTIFACT_BYTES = 1_000_000

PROPOSAL_NOTE = """\
# Formula proposal: {concept}

> Session proposal: recorded by workflow session `{session_id}` and imported for review by
> `tht evidence import-proposals`. It is not approved knowledge until a curator has reviewed
> the curated unit and removed its review item.

Session: {session_id}

## Question

{question}

## Rationale

{rationale}

## Columns

Columns: {columns}

## SQL

{fence}sql
{sql}
{fence}
"""

PROPOSAL_BODY = """\
Proposed by workflow session `{session_id}` for the question: {question}

{rationale}

{fence}sql
{sql}
{fence}
"""


class FormulaImportError(EvidenceError):
    """An import was refused; nothing was written. ``problems`` lists validation findings."""

    code = "formula_import_failed"

    def __init__(self, message: str, problems: Sequence[Problem] = (), **kw: Any) -> None:
        super().__init__(message, **kw)
        self.problems = list(problems)


@dataclass(frozen=True)
class ImportEntry:
    """One input (legacy file or proposal) and what became of it."""

    origin: str  # the legacy file, or ``<artifact>#<index>``
    source: str  # the source file it is (or was) imported as, relative to the workspace root
    evidence_id: str | None
    status: str  # "imported" | "unchanged" | "duplicate"
    review_codes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"file": self.origin, "source": self.source, "evidence_id": self.evidence_id,
                "status": self.status, "review_items": list(self.review_codes)}


@dataclass
class ImportResult:
    status: str  # "applied" | "unchanged" | "recovered"
    entries: list[ImportEntry] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "entries": [e.to_json() for e in self.entries],
                "written": self.written, "recovered": self.recovered, "problems": []}


# A unit builder receives the taken-in source and the minted id, returns (unit data, body text).
UnitBuilder = Callable[[Source, str], tuple[dict[str, Any], str]]


@dataclass(frozen=True)
class _Candidate:
    origin: str
    source_rel: str  # relative to evidence/
    raw: bytes
    title: str
    build: UnitBuilder
    suffixable: bool = False  # proposals take base-2, base-3, … when the name is taken


# ---------------------------------------------------------------------------------------------
# Legacy store
# ---------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$")
_COLUMNS_LINE = re.compile(
    r"^\s*(?:[-*+]\s+)?(?:\*\*|__)?(?:colonne|colonna|columns|column|input columns|"
    r"colonne di input)(?:\*\*|__)?\s*:\s*(?:\*\*|__)?\s*(.+?)\s*$", re.IGNORECASE)
_IDENT = r"[A-Za-z_][A-Za-z0-9_$]*"
_THREE_PART = re.compile(rf"(?<![\w.$]){_IDENT}\.{_IDENT}\.{_IDENT}(?![\w.$(])")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")


@dataclass(frozen=True)
class LegacyFormula:
    """What a legacy ``*.sql.md`` entry says: heading, free text, input columns, SQL."""

    title: str
    paragraphs: tuple[str, ...]  # free-text paragraphs (headings and the columns line excluded)
    columns_line: str | None
    columns: tuple[str, ...]
    sql: str
    body: str  # the entry without its first heading


def parse_legacy(text: str, *, shown: str) -> LegacyFormula:
    """Read one legacy entry; :class:`FormulaImportError` naming the file when it cannot be."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    title: str | None = None
    title_line: int | None = None
    sql_blocks: list[str] = []
    prose: list[str | None] = []  # None separates paragraphs
    columns_lines: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            marker, lang = fence.group(1), fence.group(2).lower()
            close = re.compile(rf"^\s{{0,3}}{re.escape(marker[0])}{{{len(marker)},}}\s*$")
            end = next((j for j in range(i + 1, len(lines)) if close.match(lines[j])), None)
            if end is None:
                raise FormulaImportError(f"the code block opened on line {i + 1} is not closed",
                                         path=shown, code="legacy_formula_malformed")
            if lang in SQL_LANGS:
                sql_blocks.append("\n".join(lines[i + 1:end]))
            prose.append(None)
            i = end + 1
            continue
        heading = _HEADING.match(line)
        if heading:
            if title is None:
                title, title_line = heading.group(1).strip(), i
            prose.append(None)
        elif not line.strip():
            prose.append(None)
        elif _COLUMNS_LINE.match(line):
            columns_lines.append(line.strip())
            prose.append(None)
        else:
            prose.append(line.strip())
        i += 1
    if not sql_blocks:
        raise FormulaImportError("no ```sql block: a legacy formula holds its SQL in one ```sql "
                                 "fenced block", path=shown, code="legacy_formula_malformed")
    if len(sql_blocks) > 1:
        raise FormulaImportError(f"{len(sql_blocks)} ```sql blocks: a legacy formula holds "
                                 "exactly one", path=shown, code="legacy_formula_malformed")
    sql = sql_blocks[0].strip("\n").rstrip()
    if not sql.strip():
        raise FormulaImportError("the ```sql block is empty", path=shown,
                                 code="legacy_formula_malformed")
    if title is None or title_line is None:
        raise FormulaImportError("no '# heading' naming the formula's concept", path=shown,
                                 code="legacy_formula_malformed")
    paragraphs: list[str] = []
    current: list[str] = []
    for item in [*prose, None]:
        if item is None:
            if current:
                paragraphs.append(" ".join(current))
            current = []
        else:
            current.append(item)
    columns = _columns(columns_lines, sql, paragraphs, shown=shown)
    body = "\n".join(lines[:title_line] + lines[title_line + 1:]).strip()
    return LegacyFormula(title=title, paragraphs=tuple(paragraphs),
                         columns_line=columns_lines[0] if columns_lines else None,
                         columns=tuple(columns), sql=sql, body=body)


def _columns(columns_lines: list[str], sql: str, paragraphs: list[str], *,
             shown: str) -> list[str]:
    """Input columns: the 'Colonne:' line(s), else schema.table.column references in the SQL or
    in `code spans` of the text. Nothing is guessed from aliases."""
    found: list[str] = []
    for line in columns_lines:
        match = _COLUMNS_LINE.match(line)
        assert match is not None
        for raw in re.split(r"[,;]|\s+e\s+|\s+and\s+|\s+", match.group(1)):
            value = raw.strip().strip("`*_").strip()
            if not value or value.lower() in {"e", "and"}:
                continue
            try:
                check_column_ref(value)
            except ValueError as exc:
                raise FormulaImportError(f"columns line: {exc}", path=shown,
                                         code="legacy_formula_malformed") from None
            if value not in found:
                found.append(value)
    if not found:
        spans = [m.group(1) for p in paragraphs for m in _CODE_SPAN.finditer(p)]
        for text in (sql, *spans):
            for m in _THREE_PART.finditer(text):
                if m.group(0) not in found:
                    found.append(m.group(0))
    if not found:
        raise FormulaImportError(
            "no input columns: name them in a line 'Colonne: schema.table.column, …'",
            path=shown, code="legacy_formula_malformed")
    return found


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


def _formula_data(*, eid: str, title: str, concept: str, columns: Sequence[str], sql: str,
                  language: str, source: Source, excerpts: Sequence[str],
                  review_items: list[dict[str, Any]]) -> dict[str, Any]:
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
                       "supporting_excerpts": [e for e in excerpts if e.strip() and
                                               excerpt_in_source(e, source.normalized)][:5]},
        "formula": {"concept": concept, "columns": list(columns), "sql": sql},
        "review_items": review_items,
    }


def _legacy_candidate(file: Path, *, language: str) -> _Candidate:
    shown = str(file)
    if file.is_symlink() or not file.is_file():
        raise FormulaImportError("not a regular file (symlinks are not followed)", path=shown,
                                 code="legacy_formula_malformed")
    raw = file.read_bytes()
    rel = f"{LEGACY_SOURCE_DIR}/{file.name}"
    source = _take_in(raw, rel, shown=shown)
    found = find_credentials(source.text)
    if found:
        # the file would be copied into the repository as it is: refuse before anything else
        raise FormulaImportError(f"looks like a credential ({found[0]}); remove it from the "
                                 "legacy entry", path=shown, code="credentials_found")
    entry = parse_legacy(source.text, shown=shown)

    def build(src: Source, eid: str) -> tuple[dict[str, Any], str]:
        excerpts = [_clip(p) for p in entry.paragraphs[:2]]
        if entry.columns_line:
            excerpts.append(_clip(entry.columns_line))
        excerpts.append(_clip(entry.sql))
        review: list[dict[str, Any]] = []
        bad = check_formula_sql(entry.sql)
        if bad is not None:
            review.append({
                "code": LEGACY_INCOMPATIBLE,
                "field": "formula.sql",
                "message": f"the legacy entry {file.name} is not one composable PostgreSQL "
                           f"expression ({bad[0]}: {bad[1]}); its SQL is kept verbatim for "
                           "review: rewrite it as one expression, move a full query to kind "
                           "example, or retire the unit",
            })
        data = _formula_data(eid=eid, title=entry.title, concept=entry.title,
                             columns=entry.columns, sql=entry.sql, language=language,
                             source=src, excerpts=excerpts, review_items=review)
        return data, entry.body

    return _Candidate(origin=shown, source_rel=rel, raw=raw, title=entry.title, build=build)


def import_formulas(root: Path, legacy_dir: Path) -> ImportResult:
    """Migrate ``<legacy_dir>/formulas/*.sql.md`` into curated formula units (spec §12, §16).

    Each file is copied verbatim under ``evidence/source/60-formule/legacy/`` and becomes one
    unit citing it. An entry that is not one composable expression is imported with the review
    item ``legacy_formula_incompatible`` (blocked, never publishable until a curator fixes it).
    Any unreadable entry refuses the whole import; nothing is written then.
    """
    ws = load_workspace(root)
    store = Path(legacy_dir) / "formulas"
    if not store.is_dir():
        raise FormulaImportError("no formulas/ directory in the legacy store",
                                 path=str(legacy_dir), code="legacy_store_missing")
    files = sorted(f for f in store.glob("*.sql.md") if not f.name.startswith("."))
    if not files:
        raise FormulaImportError("the legacy store holds no formulas/*.sql.md files",
                                 path=str(store), code="legacy_store_missing")
    candidates = [_legacy_candidate(f, language=ws.config.language_code) for f in files]
    return _import(ws, candidates, what="import-formulas")


# ---------------------------------------------------------------------------------------------
# Proposals
# ---------------------------------------------------------------------------------------------


def _text_field(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode text (lone surrogate)") from None
    for ch in value:
        if ch not in "\n\t\r" and unicodedata.category(ch) in {"Cc", "Cf", "Zl", "Zp"}:
            raise ValueError(f"contains a control or format character (U+{ord(ch):04X})")
    return value.replace("\r\n", "\n").replace("\r", "\n").strip()


class FormulaProposal(BaseModel):
    """A formula proposed by a workflow session (spec §12), as its artifact records it.

    Artifact format: ``{"formula_proposals": [<proposal>, …]}`` or one ``<proposal>`` object,
    where a proposal is ``{"concept", "columns", "sql", "question", "rationale",
    "session_id"}`` — every key required, no other key allowed.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    concept: str = Field(max_length=200)
    columns: list[str] = Field(min_length=1, max_length=50)
    sql: str = Field(max_length=20_000)
    question: str = Field(max_length=4_000)
    rationale: str = Field(max_length=20_000)
    session_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,79}$")

    @field_validator("concept", "sql", "question", "rationale")
    @classmethod
    def _text(cls, v: str) -> str:
        return _text_field(v)

    @field_validator("concept")
    @classmethod
    def _one_line(cls, v: str) -> str:
        if "\n" in v:
            raise ValueError("must be one line")
        return v

    @field_validator("columns")
    @classmethod
    def _columns(cls, v: list[str]) -> list[str]:
        for col in v:
            check_column_ref(col)
        if len(set(v)) != len(v):
            raise ValueError("duplicate column")
        return v


class _Artifact(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    formula_proposals: list[FormulaProposal] = Field(min_length=1)


def read_proposals(artifact: Path) -> list[FormulaProposal]:
    """The proposals of one session artifact; :class:`FormulaImportError` names the artifact,
    the proposal and the field at fault."""
    return _read_artifact(artifact)[0]


def _read_artifact(artifact: Path) -> tuple[list[FormulaProposal], bool]:
    """(proposals, whether the artifact is one bare proposal object)."""
    shown = str(artifact)
    try:
        raw = artifact.read_bytes()
    except OSError as exc:
        raise FormulaImportError(f"cannot read the artifact: {exc.strerror}", path=shown,
                                 code="proposal_invalid") from None
    if len(raw) > MAX_ARTIFACT_BYTES:
        raise FormulaImportError(f"artifact is larger than {MAX_ARTIFACT_BYTES} bytes",
                                 path=shown, code="proposal_invalid")
    try:
        data = json.loads(decode_text(raw, path=shown))
    except UnitFormatError as exc:
        raise FormulaImportError(exc.message, path=shown, code="proposal_invalid") from None
    except json.JSONDecodeError as exc:
        raise FormulaImportError(f"not valid JSON: {exc.msg} (line {exc.lineno}, column "
                                 f"{exc.colno})", path=shown, code="proposal_invalid") from None
    if not isinstance(data, dict):
        raise FormulaImportError('must be a JSON object: {"formula_proposals": […]} or one '
                                 "proposal", path=shown, code="proposal_invalid")
    single = "formula_proposals" not in data
    try:
        if single:
            return [FormulaProposal.model_validate(data)], True
        return list(_Artifact.model_validate(data).formula_proposals), False
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        err = errors[0]
        loc = list(err["loc"])
        where = ""
        for part in loc:
            where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else part)
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        message = err["msg"].removeprefix("Value error, ") + more
        raise FormulaImportError(message, path=shown, field=where or None,
                                 code="proposal_invalid") from None


def _fence(sql: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", sql)), default=0)
    return "`" * max(3, longest + 1)


def _proposal_candidate(proposal: FormulaProposal, *, artifact: Path, index: int,
                        single: bool, language: str) -> _Candidate:
    shown = str(artifact)
    where = "" if single else f"formula_proposals[{index}]."
    origin = shown if single else f"{shown}#{index}"
    # refused, never imported: SQL that is not one composable expression (an injection such
    # as `1); DROP TABLE x; --` is one) and anything that looks like a credential
    bad = check_formula_sql(proposal.sql)
    if bad is not None:
        raise FormulaImportError(
            f"{bad[0]}: {bad[1].rstrip('.')}; a proposal must be one composable PostgreSQL "
            "expression, so it is refused (nothing was imported)",
            path=shown, field=f"{where}sql", code="proposal_refused")
    for name in ("concept", "sql", "question", "rationale", "columns"):
        value = getattr(proposal, name)
        text = " ".join(value) if isinstance(value, list) else value
        found = find_credentials(text)
        if found:
            raise FormulaImportError(
                f"looks like a credential ({found[0]}); the proposal is refused (nothing was "
                "imported)", path=shown, field=f"{where}{name}", code="proposal_refused")
    fence = _fence(proposal.sql)
    columns_line = f"Columns: {', '.join(proposal.columns)}"
    note = PROPOSAL_NOTE.format(concept=proposal.concept, session_id=proposal.session_id,
                                question=proposal.question, rationale=proposal.rationale,
                                columns=", ".join(proposal.columns), fence=fence,
                                sql=proposal.sql)
    raw = note.encode("utf-8")
    slug = slugify(proposal.concept)
    rel = f"{PROPOSALS_SOURCE_DIR}/{proposal.session_id}-{slug}.md"
    title = proposal.concept[0].upper() + proposal.concept[1:]

    def build(src: Source, eid: str) -> tuple[dict[str, Any], str]:
        question = proposal.question if len(proposal.question) <= 160 \
            else proposal.question[:157] + "…"
        review = [{
            "code": PROPOSAL_AWAITING_REVIEW,
            "message": f"formula proposed by workflow session {proposal.session_id} for the "
                       f"question {question!r}; a curator checks concept, columns and SQL "
                       "against the warehouse and removes this item to approve it",
        }]
        excerpts = [_clip(proposal.question), _clip(proposal.rationale), columns_line,
                    _clip(proposal.sql)]
        data = _formula_data(eid=eid, title=title, concept=proposal.concept,
                             columns=proposal.columns, sql=proposal.sql, language=language,
                             source=src, excerpts=excerpts, review_items=review)
        body = PROPOSAL_BODY.format(session_id=proposal.session_id, question=proposal.question,
                                    rationale=proposal.rationale, fence=fence, sql=proposal.sql)
        return data, body

    return _Candidate(origin=origin, source_rel=rel, raw=raw, title=title, build=build,
                      suffixable=True)


def import_proposals(root: Path, artifacts: Sequence[Path]) -> ImportResult:
    """Import the formula proposals of workflow-session artifacts (spec §12).

    Each proposal becomes a note under ``evidence/source/proposals/`` and a curated formula unit
    that always carries the review item ``formula_proposal_awaiting_review``: a person approves
    it by removing the item in a reviewed commit. A session never writes the repository; this
    maintenance import is the only way in. A proposal whose SQL is not one composable expression
    (injected statements included) or that holds a credential refuses the whole import.
    """
    ws = load_workspace(root)
    if not artifacts:
        raise FormulaImportError("give at least one session artifact", code="proposal_invalid")
    candidates: list[_Candidate] = []
    for artifact in artifacts:
        artifact = Path(artifact)
        proposals, single = _read_artifact(artifact)
        for index, proposal in enumerate(proposals):
            candidates.append(_proposal_candidate(proposal, artifact=artifact, index=index,
                                                  single=single,
                                                  language=ws.config.language_code))
    return _import(ws, candidates, what="import-proposals")


# ---------------------------------------------------------------------------------------------
# The shared, all-or-nothing import
# ---------------------------------------------------------------------------------------------


def _take_in(raw: bytes, rel: str, *, shown: str) -> Source:
    """The intake rules of ``sources.read_source`` for bytes not yet under evidence/source/."""
    try:
        check_rel_path(rel)
    except SourceError as exc:
        raise FormulaImportError(exc.message, path=shown, code=exc.code) from None
    if len(raw) > MAX_SOURCE_BYTES:
        raise FormulaImportError(f"file is {len(raw)} bytes, larger than the "
                                 f"{MAX_SOURCE_BYTES} byte limit", path=shown,
                                 code="source_too_large")
    try:
        text = decode_text(raw, path=shown)
    except UnitFormatError as exc:
        raise FormulaImportError(exc.message, path=shown,
                                 code="source_encoding_invalid") from None
    longest = max((len(line) for line in text.splitlines()), default=0)
    if longest > MAX_LINE_CHARS:
        raise FormulaImportError(f"a line has {longest} characters (limit {MAX_LINE_CHARS})",
                                 path=shown, code="source_too_large")
    return Source(path=rel, sha256=sha256_bytes(raw), text=text,
                  normalized=normalize_text(text))


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


def _import(ws: Workspace, candidates: list[_Candidate], *, what: str) -> ImportResult:
    ev = ws.config.evidence.root.strip("/")
    local = ws.root / ".tht"
    with workspace_lock(local, what=what):
        recovered = recover(ws.root, local)
        if any(line.startswith("completed") for line in recovered):
            # an interrupted apply was rolled forward: that is this run's change to review
            return ImportResult(status="recovered", recovered=recovered)
        require_clean(ws.root, (f"{ev}/curated", f"{ev}/source", f"{ev}/{MANIFEST_NAME}"),
                      what=what)
        manifest_rel = f"{ev}/{MANIFEST_NAME}"
        old_manifest = read_manifest(ws.evidence_dir, shown=manifest_rel)
        if old_manifest is not None and old_manifest.pipeline_version != PIPELINE_VERSION:
            raise FormulaImportError(
                f"manifest pipeline_version {old_manifest.pipeline_version} is not compatible "
                f"with this installation ({PIPELINE_VERSION}); run `tht evidence prepare "
                "--upgrade` first", path=manifest_rel, field="pipeline_version",
                code="pipeline_version_incompatible")
        manifest = Manifest.model_validate((old_manifest or empty_manifest()).to_data())
        existing, unreadable = load_existing(ws)
        if unreadable:
            raise FormulaImportError(
                f"{len(unreadable)} curated file(s) cannot be read as units (their ids are "
                f"unknown, new ids could clash); first: {unreadable[0].line()}",
                unreadable, code="curated_unreadable")
        curated = corpus_files(ws.evidence_dir, ws.config.evidence.patterns)
        taken = (set(existing) | manifest.all_unit_ids() | set(manifest.orphans)
                 | {f"{ID_PREFIX}{PurePosixPath(rel).stem}" for rel in curated})
        planner = _ImportPlanner(ws, ev, manifest, taken,
                                 {eid: [i.code for i in item.unit.review_items]
                                  for eid, item in existing.items()})
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
            batch.writes[manifest_rel] = dump_manifest(manifest).encode("utf-8")
            apply_batch(ws.root, local, batch, name=f"{what}-{time.time_ns()}")
        return ImportResult(status="applied" if not batch.is_empty() else "unchanged",
                            entries=planner.entries, written=sorted(batch.writes),
                            recovered=recovered)


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

    def _place(self, candidate: _Candidate) -> tuple[str, str]:
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

    def add(self, candidate: _Candidate) -> None:
        rel, state = self._place(candidate)
        shown_src = f"{self.ev}/{rel}"
        if state == "unchanged":
            units = sorted(self.manifest.sources[rel].units)
            eid = units[0] if units else None
            self.entries.append(ImportEntry(candidate.origin, shown_src, eid, "unchanged",
                                            tuple(self.existing_reviews.get(eid or "", []))))
            return
        if state == "duplicate":
            self.entries.append(ImportEntry(candidate.origin, shown_src, self.planned[rel][1],
                                            "duplicate"))
            return
        source = _take_in(candidate.raw, rel, shown=candidate.origin)
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
        self.entries.append(ImportEntry(candidate.origin, shown_src, eid, "imported",
                                        tuple(i.code for i in unit.review_items)))
