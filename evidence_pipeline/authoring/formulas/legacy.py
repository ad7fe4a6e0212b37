"""The legacy formula store (``formulas/*.sql.md``) migrated into curated formula units.

Each legacy entry is copied verbatim under ``evidence/source/60-formule/legacy/`` and becomes one
unit citing it; an entry that is not one composable expression is kept for review (spec §12, §16).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evidence_pipeline.authoring.formulas.importer import (
    Candidate,
    FormulaImportError,
    ImportResult,
    formula_data,
    run_import,
    take_in,
)
from evidence_pipeline.authoring.sources import Source
from evidence_pipeline.markdown import SQL_LANGS, BlockKind, parse_blocks, split_lines
from evidence_pipeline.validation.rules import (
    FORMULA_COLUMNS_REVIEW_CODE,
    FORMULA_SQL_REVIEW_CODES,
    LEGACY_FORMULA_SOURCES,
    check_formula_sql,
    find_credentials,
)
from evidence_runtime.errors import ErrorCode
from evidence_runtime.units import check_column_ref
from evidence_runtime.workspace import load_workspace

# Where the copies of legacy files live, relative to evidence/.
LEGACY_SOURCE_DIR = LEGACY_FORMULA_SOURCES.rstrip("/")
LEGACY_INCOMPATIBLE = "legacy_formula_incompatible"
assert LEGACY_INCOMPATIBLE in FORMULA_SQL_REVIEW_CODES
LEGACY_COLUMNS_MISSING = FORMULA_COLUMNS_REVIEW_CODE

_COLUMNS_LINE = re.compile(
    r"^\s*(?:[-*+]\s+)?(?:\*\*|__)?(?:colonne|colonna|columns|column|input columns|"
    r"colonne di input)(?:\*\*|__)?\s*:\s*(?:\*\*|__)?\s*(.+?)\s*$", re.IGNORECASE)
_IDENT = r"[A-Za-z_][A-Za-z0-9_$]*"
_THREE_PART = re.compile(rf"(?<![\w.$]){_IDENT}\.{_IDENT}\.{_IDENT}(?![\w.$(])")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def _malformed(message: str, shown: str) -> FormulaImportError:
    return FormulaImportError(message, path=shown, code=ErrorCode.legacy_formula_malformed)


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
    """Read one legacy entry; :class:`FormulaImportError` naming the file when it cannot be.

    Fences and headings are the top-level blocks of the one Markdown grammar
    (:func:`evidence_pipeline.markdown.parse_blocks`); the other lines are free text, cut into
    paragraphs at blank lines, headings, code blocks and the columns line."""
    lines = split_lines(text)
    starts = {b.start: b for b in parse_blocks(text)
              if b.kind in (BlockKind.fence, BlockKind.heading)}
    title: str | None = None
    title_span: tuple[int, int] | None = None
    sql_blocks: list[str] = []
    prose: list[str | None] = []  # None separates paragraphs
    columns_lines: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        block = starts.get(i)
        if block is not None:
            if block.kind is BlockKind.fence:
                if not block.closed:
                    raise _malformed(f"the code block opened on line {i + 1} is not closed",
                                     shown)
                if block.lang in SQL_LANGS:
                    sql_blocks.append("\n".join(block.content))
            elif title is None:
                title, title_span = block.title, (block.start, block.end)
            prose.append(None)
            i = block.end
            continue
        if not line.strip():
            prose.append(None)
        elif _COLUMNS_LINE.match(line):
            columns_lines.append(line.strip())
            prose.append(None)
        else:
            prose.append(line.strip())
        i += 1
    if not sql_blocks:
        raise _malformed("no ```sql block: a legacy formula holds its SQL in one ```sql "
                         "fenced block", shown)
    if len(sql_blocks) > 1:
        raise _malformed(f"{len(sql_blocks)} ```sql blocks: a legacy formula holds exactly one",
                         shown)
    sql = sql_blocks[0].strip("\n").rstrip()
    if not sql.strip():
        raise _malformed("the ```sql block is empty", shown)
    if title is None or title_span is None:
        raise _malformed("no '# heading' naming the formula's concept", shown)
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
    body = "\n".join(lines[:title_span[0]] + lines[title_span[1]:]).strip()
    return LegacyFormula(title=title, paragraphs=tuple(paragraphs),
                         columns_line=columns_lines[0] if columns_lines else None,
                         columns=tuple(columns), sql=sql, body=body)


def _columns(columns_lines: list[str], sql: str, paragraphs: list[str], *,
             shown: str) -> list[str]:
    """Input columns: the 'Colonne:' line(s), else schema.table.column references in the SQL or
    in `code spans` of the text. Nothing is guessed from aliases; none found is an empty list."""
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
                raise _malformed(f"columns line: {exc}", shown) from None
            if value not in found:
                found.append(value)
    if not found:
        spans = [m.group(1) for p in paragraphs for m in _CODE_SPAN.finditer(p)]
        for text in (sql, *spans):
            for m in _THREE_PART.finditer(text):
                if m.group(0) not in found:
                    found.append(m.group(0))
    return found  # none: imported blocked (LEGACY_COLUMNS_MISSING), for a curator to name


def _legacy_candidate(file: Path, *, language: str) -> Candidate:
    shown = str(file)
    if file.is_symlink() or not file.is_file():
        raise _malformed("not a regular file (symlinks are not followed)", shown)
    raw = file.read_bytes()
    rel = f"{LEGACY_SOURCE_DIR}/{file.name}"
    source = take_in(raw, rel, shown=shown)
    found = find_credentials(source.text)
    if found:
        # the file would be copied into the repository as it is: refuse before anything else
        raise FormulaImportError(f"looks like a credential ({found[0]}); remove it from the "
                                 "legacy entry", path=shown, code=ErrorCode.credentials_found)
    entry = parse_legacy(source.text, shown=shown)

    def build(src: Source, eid: str) -> tuple[dict[str, Any], str]:
        excerpts = [*entry.paragraphs[:2], entry.columns_line or "", entry.sql]
        review: list[dict[str, Any]] = []
        if not entry.columns:
            review.append({
                "code": LEGACY_COLUMNS_MISSING,
                "field": "formula.columns",
                "message": f"the legacy entry {file.name} names no input columns (no "
                           "'Colonne:' line, no schema.table.column in its SQL or code "
                           "spans): list them in formula.columns as schema.table.column, "
                           "then remove this item",
            })
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
        data = formula_data(eid=eid, title=entry.title, concept=entry.title,
                             columns=entry.columns, sql=entry.sql, language=language,
                             source=src, excerpts=excerpts, review_items=review)
        return data, entry.body

    return Candidate(origin=shown, source_rel=rel, raw=raw, title=entry.title, build=build)


def import_formulas(root: Path, legacy_dir: Path) -> ImportResult:
    """Migrate ``<legacy_dir>/formulas/*.sql.md`` into curated formula units (spec §12, §16).

    Each file is copied verbatim under ``evidence/source/60-formule/legacy/`` and becomes one
    unit citing it. An entry that is not one composable expression is imported with the review
    item ``legacy_formula_incompatible``, one naming no input columns with
    ``legacy_formula_columns_missing`` (blocked, never publishable until a curator fixes it).
    Any unreadable entry refuses the whole import; nothing is written then.
    """
    ws = load_workspace(root)
    store = Path(legacy_dir) / "formulas"
    if not store.is_dir():
        raise FormulaImportError("no formulas/ directory in the legacy store",
                                 path=str(legacy_dir), code=ErrorCode.legacy_store_missing)
    files = sorted(f for f in store.glob("*.sql.md") if not f.name.startswith("."))
    if not files:
        raise FormulaImportError("the legacy store holds no formulas/*.sql.md files",
                                 path=str(store), code=ErrorCode.legacy_store_missing)
    candidates = [_legacy_candidate(f, language=ws.config.language_code) for f in files]
    return run_import(ws, candidates, what="import-formulas")
