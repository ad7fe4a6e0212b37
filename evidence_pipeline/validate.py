"""The deterministic validator (spec §5.4): every rule a plain function with a stable code.

Three outcomes: ``publishable`` (valid), ``blocked`` (valid with doubts: review items, orphans,
retirement candidates), ``invalid`` (any error). The same functions check prepare's staged output,
the work tree (``tht evidence validate``) and a materialized revision before publishing.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import sqlglot
from pydantic import ValidationError
from sqlglot import exp

from evidence_pipeline.manifest import (
    MANIFEST_NAME,
    PIPELINE_VERSION,
    Manifest,
    ManifestError,
    read_manifest,
)
from evidence_pipeline.normalize import excerpt_in_source, normalize_text
from evidence_runtime.curated import (
    CuratedDocument,
    decode_text,
    read_curated,
    validation_messages,
)
from evidence_runtime.errors import UnitFormatError
from evidence_runtime.units import (
    ExampleUnit,
    FormulaUnit,
    ReferenceUnit,
    UnitBase,
)
from evidence_runtime.workspace import load_workspace
from evidence_runtime.yamlio import dump_rt


class Severity(StrEnum):
    error = "error"
    review = "review"


class Status(StrEnum):
    publishable = "publishable"
    blocked = "blocked"
    invalid = "invalid"


@dataclass(frozen=True)
class Problem:
    """One finding: stable code, severity, and what it is about."""

    code: str
    severity: Severity
    path: str | None
    evidence_id: str | None
    message: str
    field: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "path": self.path,
            "evidence_id": self.evidence_id,
            "field": self.field,
            "message": self.message,
        }

    def line(self) -> str:
        where = ": ".join(p for p in (self.path, self.evidence_id, self.field) if p)
        return f"{self.severity.value} {self.code} {where}: {self.message}"


@dataclass
class ValidationReport:
    units: int
    problems: list[Problem] = field(default_factory=list)

    @property
    def status(self) -> Status:
        if any(p.severity is Severity.error for p in self.problems):
            return Status.invalid
        if self.problems:
            return Status.blocked
        return Status.publishable

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "units": self.units,
            "problems": [p.to_json() for p in sort_problems(self.problems)],
        }


def sort_problems(problems: Iterable[Problem]) -> list[Problem]:
    return sorted(
        problems,
        key=lambda p: (p.severity != Severity.error, p.path or "", p.evidence_id or "",
                       p.code, p.field or "", p.message),
    )


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------


class SourceReader:
    """Reads sources under an evidence directory once: hash and normalized text, or why not."""

    def __init__(self, evidence_dir: Path) -> None:
        self.evidence_dir = evidence_dir
        self._cache: dict[str, tuple[str, str] | str] = {}

    def get(self, rel: str) -> tuple[str, str] | str:
        """(sha256, normalized text) of ``rel`` (relative to evidence/), or an error message."""
        if rel not in self._cache:
            self._cache[rel] = self._load(rel)
        return self._cache[rel]

    def _load(self, rel: str) -> tuple[str, str] | str:
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts or not rel.startswith("source/"):
            return "source path must stay under source/"
        file = self.evidence_dir / rel
        base = (self.evidence_dir / "source").resolve()
        try:
            resolved = file.resolve()
        except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
            return "source cannot be resolved"
        if not resolved.is_relative_to(base):
            return "source path leaves the source/ tree (symlink?)"
        if not file.is_file():
            return "source file does not exist"
        raw = file.read_bytes()
        try:
            text = decode_text(raw, path=rel)
        except UnitFormatError as exc:
            return f"source is not readable text: {exc.message}"
        return sha256_bytes(raw), normalize_text(text)


# ---------------------------------------------------------------------------------------------
# Rules on one unit
# ---------------------------------------------------------------------------------------------

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


def check_formula_sql(sql: str) -> tuple[str, str] | None:
    """A formula is exactly one composable PostgreSQL expression: (code, message) or None."""
    try:
        statements = [s for s in sqlglot.parse(sql, read="postgres") if s is not None]
    except sqlglot.errors.SqlglotError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return "formula_sql_invalid", f"SQL does not parse (postgres): {first}"
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
    try:
        statements = [s for s in sqlglot.parse(sql, read="postgres") if s is not None]
    except sqlglot.errors.SqlglotError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return "example_sql_invalid", f"SQL does not parse (postgres): {first}"
    if len(statements) != 1 or not isinstance(statements[0], exp.Query):
        return "example_sql_invalid", "must be exactly one query (SELECT or WITH … SELECT)"
    if statements[0].find(exp.DML, exp.DDL, exp.Into):  # SELECT … INTO creates a table
        return "example_sql_invalid", "a documented query must not modify data"
    return None


_BODY_BAD_SCHEME = re.compile(r"(?i)(?<![A-Za-z0-9+.-])(javascript|vbscript|data|file):")


def body_url_problems(body: str) -> str | None:
    """A link with a scheme that must never be followed (javascript:, data:, file:, …)."""
    found = _BODY_BAD_SCHEME.search(body)
    return f"the text links to a {found.group(1).lower()}: URL" if found else None


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


_CREDENTIAL_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    ("password in a connection string",
     re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s:/@'\"]*:[^\s@/'\"]+@", re.IGNORECASE)),
    # (?<![a-z0-9]) rather than \b: DB_PASSWORD=, GITHUB_TOKEN= are names ending in the word
    ("password assignment",
     re.compile(r"(?i)(?<![a-z0-9])(?:password|passwd|pwd|passwort|parola\s?chiave)\s*[:=]\s*['\"]?[^\s'\";,]{3,}")),
    ("API key or token assignment",
     re.compile(r"(?i)(?<![a-z0-9])(?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token"
                r"|secret[_-]?(?:access[_-]?)?key|client[_-]?secret|token|secret)"
                r"\s*[:=]\s*['\"]?[A-Za-z0-9_\-./+]{12,}")),
    ("AWS access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("OpenAI-style secret key", re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}")),
    ("Stripe secret key", re.compile(r"\b[rs]k_live_[A-Za-z0-9]{16,}")),
    ("GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})")),
    ("Slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"
                               r"|hooks\.slack\.com/services/[A-Za-z0-9_/]{20,}")),
    ("basic authorization header",
     re.compile(r"(?i)\bauthorization\s*:\s*basic\s+[A-Za-z0-9+/]{8,}={0,2}")),
    ("Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    ("JSON web token",
     re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("bearer token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{20,}=*")),
)


def find_credentials(text: str) -> list[str]:
    """Names of the credential shapes found in a text (empty when clean)."""
    return [name for name, pattern in _CREDENTIAL_PATTERNS if pattern.search(text)]


def _walk_strings(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            if prefix:  # a key is text too (an enum code)
                yield prefix, str(k)
            yield from _walk_strings(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk_strings(v, f"{prefix}[{i}]")
    elif isinstance(value, str):
        yield prefix, value


def credential_problems(data: Any, body: str, *, path: str | None,
                        evidence_id: str | None, front_text: str = "") -> list[Problem]:
    out = []
    found: set[str] = set()
    for field_path, text in [*_walk_strings(data), ("body", body)]:
        for name in find_credentials(text):
            found.add(name)
            out.append(Problem("credentials_found", Severity.error, path, evidence_id,
                               f"looks like a credential ({name}); remove it", field_path))
    # YAML comments are no field, but they are committed with the file
    for name in find_credentials(front_text):
        if name not in found:
            out.append(Problem("credentials_found", Severity.error, path, evidence_id,
                               f"looks like a credential ({name}) in the front matter outside "
                               "any field (a YAML comment?); remove it"))
    return out


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

    if isinstance(unit, FormulaUnit):
        bad = check_formula_sql(unit.formula.sql)
        if bad:
            # an imported legacy entry keeps its SQL verbatim under a review item that says so:
            # blocked until a curator rewrites it; removing the item alone makes the unit invalid
            covered = unit.provenance.source_file.startswith(LEGACY_FORMULA_SOURCES) and any(
                i.code in FORMULA_SQL_REVIEW_CODES and i.field == "formula.sql"
                for i in unit.review_items)
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
    return out


# ---------------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------------


@dataclass
class LoadedUnit:
    rel_path: str  # relative to evidence/
    doc: CuratedDocument | None
    unit: UnitBase | None


def corpus_files(evidence_dir: Path, patterns: Sequence[str]) -> list[str]:
    """Curated files matching the descriptor's patterns, relative to evidence/, sorted."""
    found: set[str] = set()
    for pattern in patterns:
        for file in evidence_dir.glob(pattern):
            if file.is_file() or file.is_symlink():
                found.add(file.relative_to(evidence_dir).as_posix())
    return sorted(found)


_UNSAFE_NAME_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def load_units(evidence_dir: Path, rel_paths: Iterable[str], *, shown_prefix: str,
               sources: SourceReader, skip_source: frozenset[str] = frozenset(),
               check: bool = True) -> tuple[list[LoadedUnit], list[Problem]]:
    """Read, parse and (unless ``check`` is false) check each curated file."""
    loaded: list[LoadedUnit] = []
    problems: list[Problem] = []
    for rel in rel_paths:
        shown = f"{shown_prefix}{rel}"
        file = evidence_dir / rel
        bad = [ch for ch in rel if unicodedata.category(ch) in _UNSAFE_NAME_CATEGORIES]
        if bad:
            problems.append(Problem("unsafe_path", Severity.error, ascii(shown), None,
                                    f"the file name contains a control character "
                                    f"(U+{ord(bad[0]):04X})"))
            loaded.append(LoadedUnit(rel, None, None))
            continue
        if file.is_symlink():
            problems.append(Problem("unsafe_path", Severity.error, shown, None,
                                    "curated files must not be symlinks"))
            loaded.append(LoadedUnit(rel, None, None))
            continue
        try:
            doc = read_curated(file, display_path=shown)
        except UnitFormatError as exc:
            problems.append(Problem(exc.code, Severity.error, shown, None, exc.message))
            loaded.append(LoadedUnit(rel, None, None))
            continue
        eid = doc.evidence_id
        if check:
            problems.extend(credential_problems(doc.data(), doc.body, path=shown,
                                                evidence_id=eid,
                                                front_text=doc.front_text or dump_rt(doc.front)))
        try:
            unit = doc.unit()
        except ValidationError as exc:
            problems.extend(schema_problems(exc, path=shown, evidence_id=eid))
            loaded.append(LoadedUnit(rel, doc, None))
            continue
        if check:
            problems.extend(check_unit(unit, rel_path=rel, sources=sources, shown_path=shown,
                                       body=doc.body,
                                       skip_source=unit.id in skip_source))
        loaded.append(LoadedUnit(rel, doc, unit))
    return loaded, problems


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
                           f"manifest pipeline_version {manifest.pipeline_version} is not "
                           f"{PIPELINE_VERSION}; run prepare --upgrade", "pipeline_version"))

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


def validate_evidence_dir(evidence_dir: Path, *, patterns: Sequence[str],
                          shown_prefix: str = "evidence/",
                          ) -> tuple[ValidationReport, list[LoadedUnit]]:
    """Validate a whole evidence directory (work tree or materialized revision)."""
    sources = SourceReader(evidence_dir)
    problems: list[Problem] = []
    try:
        manifest = read_manifest(evidence_dir, shown=f"{shown_prefix}{MANIFEST_NAME}")
    except ManifestError as exc:
        problems.append(Problem(exc.code, Severity.error, exc.path, None, exc.message, exc.field))
        manifest = None
    rel_paths = corpus_files(evidence_dir, patterns)
    skip = frozenset([*manifest.orphans, *manifest.retirement_candidates]) if manifest \
        else frozenset()
    loaded, unit_problems = load_units(evidence_dir, rel_paths, shown_prefix=shown_prefix,
                                       sources=sources, skip_source=skip)
    problems.extend(unit_problems)
    if manifest is not None or not problems:
        problems.extend(check_corpus(loaded, manifest, shown_prefix=shown_prefix,
                                     sources=sources))
    return ValidationReport(units=len(rel_paths), problems=problems), loaded


def validate_workspace(root: Path) -> ValidationReport:
    """``tht evidence validate``: the work tree of a workspace."""
    ws = load_workspace(root)
    report, _ = validate_evidence_dir(ws.evidence_dir, patterns=ws.config.evidence.patterns,
                                      shown_prefix=f"{ws.config.evidence.root}/")
    return report
