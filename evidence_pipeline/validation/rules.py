"""The validator's rules (spec §5.4): each a plain function with a stable code.

Rules on one unit (schema, SQL, URLs, credentials, excerpts and provenance) and rules across the
corpus (unique ids, manifest consistency, orphans, retirements). The credential rules live in
``credentials`` and are re-exported here.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from pathlib import PurePosixPath
from urllib.parse import urlsplit

import sqlglot
from pydantic import ValidationError
from sqlglot import exp

from evidence_pipeline.formats.manifest import (
    MANIFEST_NAME,
    PIPELINE_VERSION,
    Manifest,
    incompatible_version,
)
from evidence_pipeline.formats.normalize import excerpt_in_source
from evidence_pipeline.validation.corpus import LoadedUnit, SourceReader
from evidence_pipeline.validation.credentials import (
    credential_problems as credential_problems,
)
from evidence_pipeline.validation.credentials import (
    find_credentials as find_credentials,
)
from evidence_pipeline.validation.excerpts import excerpt_too_short, too_short_message
from evidence_pipeline.validation.problems import Problem, Severity
from evidence_pipeline.validation.text import has_invisible, text_findings
from evidence_runtime.curated import (
    validation_messages,
)
from evidence_runtime.units import (
    ExampleUnit,
    FormulaUnit,
    ReferenceUnit,
    UnitBase,
)

_FIELD_CODES = {
    "id": "id_invalid",
    "kind": "kind_invalid",
    "purposes": "purpose_invalid",
    "schema_version": "schema_version_invalid",
}

# Review items that cover an incompatible formula.sql (the legacy migration, spec §4.3): on a unit
# citing a copy of a legacy entry, the SQL problem is then a doubt (blocked), not an error
# (invalid). Elsewhere (e.g. a model's reply in prepare) the code covers nothing.
FORMULA_SQL_REVIEW_CODES = frozenset({"legacy_formula_incompatible"})
# The review item that covers a legacy formula naming no input columns (``formula.columns``):
# the unit is blocked until a curator names them; removing the item alone makes it invalid.
FORMULA_COLUMNS_REVIEW_CODE = "legacy_formula_columns_missing"
LEGACY_FORMULA_SOURCES = "source/60-formule/legacy/"

_FORBIDDEN_IN_FORMULA = (
    exp.Query,
    exp.Subquery,
    exp.DML,
    exp.DDL,
    exp.Command,
    exp.Alias,
    exp.Into,
    exp.Grant,
)


def schema_problems(exc: ValidationError, *, path: str | None,
                    evidence_id: str | None) -> list[Problem]:
    """Pydantic errors → problems with a dotted field path and a stable code."""
    out = []
    for field_path, message in validation_messages(exc):
        head = field_path.split(".", 1)[0]
        code = _FIELD_CODES.get(head, "schema_invalid")
        if head == "" or field_path == "kind":
            code = "kind_invalid"
        out.append(Problem(code, Severity.error, path, evidence_id, message, field_path or None))
    return out


def _parse_postgres(sql: str) -> list[exp.Expression] | str:
    """The statements of ``sql``, or why it does not parse (its first line)."""
    try:
        return [s for s in sqlglot.parse(sql, read="postgres") if s is not None]
    except sqlglot.errors.SqlglotError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"SQL does not parse (postgres): {first}"


def check_formula_sql(sql: str) -> tuple[str, str] | None:
    """A formula is exactly one composable PostgreSQL expression: (code, message) or None."""
    statements = _parse_postgres(sql)
    if isinstance(statements, str):
        return "formula_sql_invalid", statements
    if len(statements) != 1:
        return ("formula_multiple_statements",
                f"holds {len(statements)} statements; a formula is one expression")
    tree = statements[0]
    if not isinstance(tree, exp.Condition) or isinstance(tree, _FORBIDDEN_IN_FORMULA):
        return ("formula_not_expression",
                f"is a {type(tree).__name__} statement, not a composable expression "
                "(a full documented query belongs to kind example)")
    inner = tree.find(*_FORBIDDEN_IN_FORMULA)
    if inner is not None:
        return ("formula_not_expression",
                f"contains a {type(inner).__name__}; a formula is a plain column expression")
    return None


def check_example_sql(sql: str) -> tuple[str, str] | None:
    """An example's SQL is one full query (SELECT / WITH / set operation) that parses."""
    statements = _parse_postgres(sql)
    if isinstance(statements, str):
        return "example_sql_invalid", statements
    if len(statements) != 1 or not isinstance(statements[0], exp.Query):
        return "example_sql_invalid", "must be exactly one query (SELECT or WITH … SELECT)"
    if statements[0].find(exp.DML, exp.DDL, exp.Into):  # SELECT … INTO creates a table
        return "example_sql_invalid", "a documented query must not modify data"
    return None


_BODY_BAD_SCHEME = re.compile(r"(?i)(?<![A-Za-z0-9+.-])(javascript|vbscript|data|file):")
# what must follow the scheme for it to be a URL: "activity data: some_dataset.some_table" or
# "Data:15/03/2024," in prose is a word and a colon, not a link
_BAD_URL_REST = {
    "javascript": re.compile(r"\S"),
    "vbscript": re.compile(r"\S"),
    "data": re.compile(r"(?i)(?:[a-z]+/[a-z0-9.+-]+)?(?:;[a-z0-9.+-]+=[^;,\s]+)*(?:;base64)?,"),
    "file": re.compile(r"/"),
}


def body_url_problems(body: str) -> str | None:
    """A link with a scheme that must never be followed (javascript:, data:, file:, …)."""
    for found in _BODY_BAD_SCHEME.finditer(body):
        scheme = found.group(1).lower()
        if _BAD_URL_REST[scheme].match(body, found.end()):
            return f"the text links to a {scheme}: URL"
    return None


def check_url(url: str) -> str | None:
    """Only absolute http(s) URLs with a host; None when fine, else why not."""
    if any(c.isspace() for c in url) or any(ord(c) < 32 for c in url):
        return "URL contains whitespace or control characters"
    parts = urlsplit(url)
    if parts.scheme.lower() not in {"http", "https"}:
        return f"URL scheme {parts.scheme or '(none)'!r} is not allowed (http or https only)"
    if not parts.hostname:
        return "URL has no host"
    return None


def check_unit(unit: UnitBase, *, rel_path: str, sources: SourceReader,
               shown_path: str, skip_source: bool = False,
               body: str | None = None) -> list[Problem]:
    """Rules that need the unit and its source (schema already passed).

    ``skip_source`` for orphans and retirement candidates: their source is gone or no longer
    supports them by definition, and they block publication by themselves.
    """
    eid = unit.id
    out: list[Problem] = []

    def problem(code: str, message: str, fld: str | None = None,
                severity: Severity = Severity.error) -> None:
        out.append(Problem(code, severity, shown_path, eid, message, fld))

    parts = PurePosixPath(rel_path).parts
    if len(parts) < 3 or parts[0] != "curated":
        problem("path_outside_curated", "curated units live under curated/<kind>/")
    elif parts[1] != unit.kind.value:
        problem("kind_directory_mismatch",
                f"kind is {unit.kind.value!r} but the file is under curated/{parts[1]}/", "kind")

    src = None if skip_source else sources.get(unit.provenance.source_file)
    if src is None:
        pass
    elif isinstance(src, str):
        problem("source_missing", f"{unit.provenance.source_file}: {src}",
                "provenance.source_file")
    else:
        sha, normalized = src
        if sha != unit.provenance.source_sha256:
            problem("source_hash_mismatch",
                    f"source {unit.provenance.source_file} changed (hash is {sha[:19]}…, unit "
                    f"records {unit.provenance.source_sha256[:19]}…); run prepare",
                    "provenance.source_sha256")
        for i, excerpt in enumerate(unit.provenance.supporting_excerpts):
            if not excerpt_in_source(excerpt, normalized):
                shown = excerpt if len(excerpt) <= 60 else excerpt[:57] + "…"
                problem("excerpt_not_found",
                        f"excerpt {shown!r} is not in {unit.provenance.source_file}",
                        f"provenance.supporting_excerpts[{i}]")
            elif excerpt_too_short(excerpt, normalized):
                problem("excerpt_too_short", too_short_message(excerpt),
                        f"provenance.supporting_excerpts[{i}]")

    if isinstance(unit, FormulaUnit):
        if not unit.formula.columns:
            covered = _legacy_covered(unit, {FORMULA_COLUMNS_REVIEW_CODE}, "formula.columns")
            problem("formula_columns_missing", "formula.columns names no input column; a "
                    "formula has at least one (schema.table.column)", "formula.columns",
                    Severity.review if covered else Severity.error)
        bad = check_formula_sql(unit.formula.sql)
        if bad:
            # an imported legacy entry keeps its SQL verbatim under a review item that says so:
            # blocked until a curator rewrites it; removing the item alone makes the unit invalid
            covered = _legacy_covered(unit, FORMULA_SQL_REVIEW_CODES, "formula.sql")
            problem(bad[0], f"formula.sql {bad[1]}", "formula.sql",
                    Severity.review if covered else Severity.error)
    elif isinstance(unit, ExampleUnit) and unit.example.sql:
        bad = check_example_sql(unit.example.sql)
        if bad:
            problem(bad[0], f"example.sql {bad[1]}", "example.sql")
    elif isinstance(unit, ReferenceUnit):
        why = check_url(unit.reference.url)
        if why:
            problem("url_invalid", why, "reference.url")

    body_bad = body_url_problems(body) if body is not None else None
    if body_bad:
        problem("url_invalid", body_bad, "body")
    for item in unit.review_items:
        problem("review_item", f"{item.code}: {item.message}", item.field, Severity.review)
    carried = {(item.code, item.field) for item in unit.review_items}
    for code, fld, message in unit_text_findings(unit, body):
        if (code, fld) not in carried:  # prepare writes them into the unit; said once
            problem(code, message, fld, Severity.review)
    return out


def unit_text_findings(unit: UnitBase, body: str | None) -> list[tuple[str, str, str]]:
    """Invisible characters in any field or the body, a title mixing scripts
    (:func:`~evidence_pipeline.validation.text.text_findings`): (code, field, message)."""
    # one scan of the unit's JSON first: the field walk only for a unit that needs it
    if not has_invisible(unit.model_dump_json()) and not (body and has_invisible(body)):
        return text_findings({"title": unit.title}, None)
    return text_findings(unit.model_dump(mode="json", exclude_defaults=True), body)




def _legacy_covered(unit: FormulaUnit, codes: Collection[str], field: str) -> bool:
    """Whether a unit citing a copy of a legacy entry carries a review item with one of
    ``codes`` on ``field``: the problem is then a doubt (blocked), not an error."""
    return unit.provenance.source_file.startswith(LEGACY_FORMULA_SOURCES) and any(
        i.code in codes and i.field == field for i in unit.review_items)


def check_corpus(loaded: Sequence[LoadedUnit], manifest: Manifest | None, *,
                 shown_prefix: str, sources: SourceReader) -> list[Problem]:
    """Rules across units: unique ids, manifest consistency, orphans and retirements."""
    out: list[Problem] = []
    manifest_path = f"{shown_prefix}{MANIFEST_NAME}"
    by_id: dict[str, list[LoadedUnit]] = {}
    for item in loaded:
        eid = item.unit.id if item.unit else (item.doc.evidence_id if item.doc else None)
        if eid:
            by_id.setdefault(eid, []).append(item)
    for eid, items in sorted(by_id.items()):
        if len(items) > 1:
            paths = ", ".join(f"{shown_prefix}{i.rel_path}" for i in items)
            for i in items:
                out.append(Problem("id_duplicate", Severity.error, f"{shown_prefix}{i.rel_path}",
                                   eid, f"id used by several files: {paths}", "id"))

    if manifest is None:
        out.append(Problem("manifest_missing", Severity.error, manifest_path, None,
                           "manifest.yaml is missing; run prepare"))
        return out
    if manifest.pipeline_version != PIPELINE_VERSION:
        out.append(Problem("pipeline_version_incompatible", Severity.error, manifest_path, None,
                           incompatible_version(manifest.pipeline_version), "pipeline_version"))
    # an id is issued once (spec §4.2): a retired id back in use would give old receipts to
    # other knowledge
    for eid in sorted(set(manifest.retired_ids) & (manifest.ids_in_use() | set(by_id))):
        out.append(Problem("retired_id_reused", Severity.error,
                           _shown_for(eid, by_id, shown_prefix) or manifest_path, eid,
                           "this id was retired (manifest retired_ids) and is never issued "
                           "again; give the unit a new id", "id"))

    unit_sources = manifest.unit_sources()
    for eid, paths in sorted(unit_sources.items()):
        if len(paths) > 1:
            out.append(Problem("unit_in_several_sources", Severity.error, manifest_path, eid,
                               f"listed under several sources: {', '.join(paths)}", "sources"))
        if eid not in by_id:
            out.append(Problem("manifest_unit_unknown", Severity.error, manifest_path, eid,
                               "listed in the manifest but no curated file has this id",
                               "sources"))
    for src_path, entry in sorted(manifest.sources.items()):
        src = sources.get(src_path)
        if isinstance(src, str):
            out.append(Problem("manifest_source_missing", Severity.error, manifest_path, None,
                               f"{src_path}: {src}", "sources"))
        elif src[0] != entry.sha256:
            out.append(Problem("manifest_source_changed", Severity.error, manifest_path, None,
                               f"{src_path} changed since the last prepare; run prepare",
                               "sources"))
    for eid, items in sorted(by_id.items()):
        for item in items:
            if item.unit is None:
                continue
            listed = unit_sources.get(eid)
            shown = f"{shown_prefix}{item.rel_path}"
            if not listed and eid not in manifest.orphans:
                out.append(Problem("unit_not_in_manifest", Severity.error, shown, eid,
                                   "unit is not listed in manifest.yaml", "id"))
            elif listed and item.unit.provenance.source_file not in listed:
                out.append(Problem("manifest_source_mismatch", Severity.error, shown, eid,
                                   f"cites {item.unit.provenance.source_file} but the manifest "
                                   f"lists it under {', '.join(listed)}",
                                   "provenance.source_file"))
    for eid in sorted(set(manifest.orphans)):
        shown = _shown_for(eid, by_id, shown_prefix) or manifest_path
        out.append(Problem("orphan", Severity.review, shown, eid,
                           "orphan: its source was removed; resolve with "
                           "`tht evidence resolve --retire` or `--source`", "orphans"))
    for eid in sorted(set(manifest.retirement_candidates)):
        shown = _shown_for(eid, by_id, shown_prefix) or manifest_path
        out.append(Problem("retirement_candidate", Severity.review, shown, eid,
                           "its source no longer supports it; retire or rewrite it",
                           "retirement_candidates"))
    return out


def _shown_for(eid: str, by_id: dict[str, list[LoadedUnit]], prefix: str) -> str | None:
    items = by_id.get(eid)
    return f"{prefix}{items[0].rel_path}" if items else None

