"""The Evidence Unit contract (spec §4): common envelope plus one typed block per ``kind``.

A unit is a pydantic model; :data:`EvidenceUnit` is the discriminated union over the eight kinds.
Only checks that need nothing but the unit itself live here (field shapes, id format, reference
syntax); checks that need the source, the corpus or SQL parsing live in the pipeline's validator.
"""

from __future__ import annotations

import re
import unicodedata
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    field_validator,
    model_validator,
)

SCHEMA_VERSION = 1
MAX_EXCERPT_CHARS = 1000
MAX_EXCERPTS = 5

ID_PREFIX = "evidence:"
# Every pattern matches the whole string (\A…\Z, used with fullmatch): ``$`` would also accept
# a trailing newline, and "evidence:x\n" would be a second, different id.
SLUG_RE = re.compile(r"\A[a-z0-9]+(?:-[a-z0-9]+)*\Z")
ID_RE = re.compile(r"\Aevidence:[a-z0-9]+(?:-[a-z0-9]+)*\Z")
SHA256_RE = re.compile(r"\Asha256:[0-9a-f]{64}\Z")
CODE_RE = re.compile(r"\A[a-z][a-z0-9_]*\Z")
LANGUAGE_RE = re.compile(r"\A[a-z]{2}(?:-[A-Z]{2})?\Z")

# A PostgreSQL identifier: plain (letters, digits, _, $) or double-quoted ("" escapes a quote).
_IDENT = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+")'
TABLE_RE = re.compile(rf"\A{_IDENT}(?:\.{_IDENT})?\Z")
COLUMN_RE = re.compile(rf"\A{_IDENT}(?:\.{_IDENT}){{1,2}}\Z")


class EvidenceKind(StrEnum):
    """The eight kinds, in the classification order of spec §4.2."""

    formula = "formula"
    enum = "enum"
    mapping = "mapping"
    normalization = "normalization"
    glossary = "glossary"
    domain = "domain"
    example = "example"
    reference = "reference"


class EvidencePurpose(StrEnum):
    """The workflow activities a unit can serve (spec §4.1, §11.2)."""

    disambiguation = "disambiguation"
    rewriting = "rewriting"
    schema_linking = "schema_linking"
    sql_generation = "sql_generation"



def _strict() -> ConfigDict:
    return ConfigDict(extra="forbid", str_strip_whitespace=False, validate_default=True)


def _nonblank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


def _unique(values: list[str]) -> list[str]:
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise ValueError(f"duplicate value {v!r}")
        seen.add(v)
    return values


def check_table_ref(value: str) -> str:
    """Accept ``table`` or ``schema.table`` (PostgreSQL identifiers, quoted or not)."""
    if not TABLE_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a table reference (schema.table)")
    return value


def check_column_ref(value: str) -> str:
    """Accept ``table.column`` or ``schema.table.column`` (PostgreSQL identifiers)."""
    if not COLUMN_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a column reference (schema.table.column)")
    return value


def check_source_path(value: str) -> str:
    """Accept a source path relative to ``evidence/``: under ``source/``, no ``..``, no
    backslash, no control or format characters."""
    if not value.startswith("source/") or ".." in value.split("/") or "\\" in value:
        raise ValueError("must be a path under source/ relative to evidence/")
    if any(unicodedata.category(c) in {"Cc", "Cf", "Zl", "Zp"} for c in value):
        raise ValueError("must not contain control or format characters")
    return value


def check_evidence_id(value: str) -> str:
    """Check ``evidence:<slug>``; no word of the slug is a kind name (spec §4.2: the id does
    not contain the kind, wherever it stands)."""
    if not ID_RE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an id of the form evidence:<slug> (lowercase letters, digits, -)"
        )
    kinds = [w for w in value.removeprefix(ID_PREFIX).split("-") if w in EvidenceKind.__members__]
    if kinds:
        raise ValueError(f"{value!r} contains the kind name {kinds[0]!r}; ids must not contain "
                         "a kind")
    return value


def column_table(column: str) -> str:
    """The table part of a column reference (``a.b.c`` → ``a.b``)."""
    parts = _split_ident_path(column)
    return ".".join(parts[:-1])


def _split_ident_path(ref: str) -> list[str]:
    return re.findall(rf"{_IDENT}", ref)


def check_sha256(value: str) -> str:
    """Accept ``sha256:`` followed by 64 lowercase hex digits."""
    if not SHA256_RE.fullmatch(value):
        raise ValueError("must be 'sha256:' followed by 64 lowercase hex digits")
    return value


def _table_refs(values: list[str]) -> list[str]:
    return _unique([check_table_ref(t) for t in values])


def _column_refs(values: list[str]) -> list[str]:
    return _unique([check_column_ref(c) for c in values])


_Ids = TypeVar("_Ids", list[str], tuple[str, ...])


def check_evidence_ids(values: _Ids) -> _Ids:
    """Check every id of a list or tuple with :func:`check_evidence_id`."""
    for value in values:
        check_evidence_id(value)
    return values


# Field types that carry their checks (a list is checked as a whole, so an error names the list).
NonBlank = Annotated[str, Field(min_length=1)]
Text = Annotated[str, Field(min_length=1), AfterValidator(_nonblank)]  # not only white space
Sha256 = Annotated[str, AfterValidator(check_sha256)]
TableRefs = Annotated[list[str], AfterValidator(_table_refs)]  # unique table references
ColumnRefs = Annotated[list[str], AfterValidator(_column_refs)]  # unique column references
EvidenceIds = Annotated[list[str], AfterValidator(check_evidence_ids)]


class ReviewItem(BaseModel):
    """A doubt still to resolve; any review item blocks publication (spec §4.1)."""

    model_config = _strict()

    code: str
    message: Text
    field: str | None = None

    @field_validator("code")
    @classmethod
    def _code(cls, v: str) -> str:
        if not CODE_RE.fullmatch(v):
            raise ValueError("must be a snake_case code such as ambiguous_source_statement")
        return v


class AppliesTo(BaseModel):
    """Concepts and database elements the unit is about."""

    model_config = _strict()

    concepts: list[NonBlank] = Field(default_factory=list)
    tables: TableRefs = Field(default_factory=list)
    columns: ColumnRefs = Field(default_factory=list)

    @field_validator("concepts")
    @classmethod
    def _concepts(cls, v: list[str]) -> list[str]:
        return _unique([_nonblank(c) for c in v])


class Provenance(BaseModel):
    """Where the unit comes from: one source file, its hash, and verbatim excerpts."""

    model_config = _strict()

    source_file: Annotated[str, AfterValidator(check_source_path)]
    source_sha256: Sha256
    supporting_excerpts: list[str] = Field(min_length=1, max_length=MAX_EXCERPTS)

    @field_validator("supporting_excerpts")
    @classmethod
    def _excerpts(cls, v: list[str]) -> list[str]:
        for i, excerpt in enumerate(v):
            if not excerpt.strip():
                raise ValueError(f"excerpt {i + 1} is empty")
            if len(excerpt) > MAX_EXCERPT_CHARS:
                raise ValueError(
                    f"excerpt {i + 1} has {len(excerpt)} characters (max {MAX_EXCERPT_CHARS})"
                )
        return v


# ---------------------------------------------------------------------------------------------
# Kind blocks
# ---------------------------------------------------------------------------------------------


class GlossaryBlock(BaseModel):
    """A term, what it means, and the other words people use for it."""

    model_config = _strict()

    term: NonBlank
    definition: NonBlank
    synonyms: list[NonBlank] = Field(default_factory=list)

    @field_validator("synonyms")
    @classmethod
    def _syn(cls, v: list[str]) -> list[str]:
        return _unique(v)


class DomainBlock(BaseModel):
    """A domain rule or constraint, with optional conditions and exceptions."""

    model_config = _strict()

    rule: NonBlank
    conditions: list[NonBlank] = Field(default_factory=list)
    exceptions: list[NonBlank] = Field(default_factory=list)


class EnumBlock(BaseModel):
    """Stored codes of one column and their meaning."""

    model_config = _strict()

    column: Annotated[str, AfterValidator(check_column_ref)]
    values: dict[str, NonBlank] = Field(min_length=1)

    @field_validator("values")
    @classmethod
    def _values(cls, v: dict[str, str]) -> dict[str, str]:
        for code in v:
            if not str(code).strip():
                raise ValueError("empty code")
        return v


class ExampleBlock(BaseModel):
    """A documented question, how it is to be read, and optionally its full SQL."""

    model_config = _strict()

    question: NonBlank
    interpretation: NonBlank
    sql: str | None = None


class MappingBlock(BaseModel):
    """A business concept and the physical tables and columns that hold it."""

    model_config = _strict()

    concept: NonBlank
    tables: TableRefs = Field(min_length=1)
    columns: ColumnRefs = Field(default_factory=list)
    notes: str | None = None

    @model_validator(mode="after")
    def _columns_in_tables(self) -> MappingBlock:
        tables = set(self.tables)
        for col in self.columns:
            if column_table(col) not in tables:
                raise ValueError(f"column {col!r} does not belong to one of the mapped tables")
        return self


class NormalizationExample(BaseModel):
    model_config = _strict()

    raw: NonBlank
    normalized: NonBlank


class NormalizationBlock(BaseModel):
    """How raw values of a column or concept are made uniform."""

    model_config = _strict()

    subject: NonBlank
    rule: NonBlank
    examples: list[NormalizationExample] = Field(default_factory=list[NormalizationExample])


class FormulaBlock(BaseModel):
    """A reusable PostgreSQL expression: concept, input columns, one composable expression."""

    model_config = _strict()

    concept: NonBlank
    # required by the validator (``formula_columns_missing``), not here: a legacy entry that
    # names none is imported blocked, with a review item, for the curator to complete (spec §12)
    columns: ColumnRefs
    sql: NonBlank


class ReferenceBlock(BaseModel):
    """An external link that is itself retrievable content."""

    model_config = _strict()

    url: NonBlank
    label: NonBlank
    description: NonBlank


# ---------------------------------------------------------------------------------------------
# Units
# ---------------------------------------------------------------------------------------------


class UnitBase(BaseModel):
    """The common envelope of §4.1."""

    model_config = _strict()

    schema_version: Literal[1]
    id: Annotated[str, AfterValidator(check_evidence_id)]
    title: Text
    kind: EvidenceKind
    purposes: list[EvidencePurpose] = Field(min_length=1)
    applies_to: AppliesTo = Field(default_factory=AppliesTo)
    language: str
    provenance: Provenance
    review_items: list[ReviewItem] = Field(default_factory=list[ReviewItem])

    @field_validator("schema_version", mode="before")
    @classmethod
    def _schema_version(cls, v: object) -> object:
        # Literal[1] alone takes True and 1.0 (both == 1): only the integer 1 is this schema
        if type(v) is not int:
            raise ValueError(f"must be the integer {SCHEMA_VERSION}, not {v!r}")
        return v

    @field_validator("language")
    @classmethod
    def _language(cls, v: str) -> str:
        if not LANGUAGE_RE.fullmatch(v):
            raise ValueError("must be a language code such as it or it-IT")
        return v

    @field_validator("purposes")
    @classmethod
    def _purposes(cls, v: list[EvidencePurpose]) -> list[EvidencePurpose]:
        if len(set(v)) != len(v):
            raise ValueError("duplicate purpose")
        return v

    @property
    def block(self) -> BaseModel:
        """The kind-specific block."""
        return getattr(self, self.kind.value)


class GlossaryUnit(UnitBase):
    kind: Literal[EvidenceKind.glossary]  # pyright: ignore[reportIncompatibleVariableOverride]
    glossary: GlossaryBlock


class DomainUnit(UnitBase):
    kind: Literal[EvidenceKind.domain]  # pyright: ignore[reportIncompatibleVariableOverride]
    domain: DomainBlock


class EnumUnit(UnitBase):
    kind: Literal[EvidenceKind.enum]  # pyright: ignore[reportIncompatibleVariableOverride]
    enum: EnumBlock


class ExampleUnit(UnitBase):
    kind: Literal[EvidenceKind.example]  # pyright: ignore[reportIncompatibleVariableOverride]
    example: ExampleBlock


class MappingUnit(UnitBase):
    kind: Literal[EvidenceKind.mapping]  # pyright: ignore[reportIncompatibleVariableOverride]
    mapping: MappingBlock


class NormalizationUnit(UnitBase):
    kind: Literal[EvidenceKind.normalization]  # pyright: ignore[reportIncompatibleVariableOverride]
    normalization: NormalizationBlock


class FormulaUnit(UnitBase):
    kind: Literal[EvidenceKind.formula]  # pyright: ignore[reportIncompatibleVariableOverride]
    formula: FormulaBlock


class ReferenceUnit(UnitBase):
    kind: Literal[EvidenceKind.reference]  # pyright: ignore[reportIncompatibleVariableOverride]
    reference: ReferenceBlock


EvidenceUnit = Annotated[
    GlossaryUnit
    | DomainUnit
    | EnumUnit
    | ExampleUnit
    | MappingUnit
    | NormalizationUnit
    | FormulaUnit
    | ReferenceUnit,
    Field(discriminator="kind"),
]

UNIT_CLASSES: dict[EvidenceKind, type[UnitBase]] = {
    EvidenceKind.glossary: GlossaryUnit,
    EvidenceKind.domain: DomainUnit,
    EvidenceKind.enum: EnumUnit,
    EvidenceKind.example: ExampleUnit,
    EvidenceKind.mapping: MappingUnit,
    EvidenceKind.normalization: NormalizationUnit,
    EvidenceKind.formula: FormulaUnit,
    EvidenceKind.reference: ReferenceUnit,
}

# the kind block model of each unit class (its field named after the kind)
BLOCK_CLASSES: dict[EvidenceKind, type[BaseModel]] = {
    kind: cls.model_fields[kind.value].annotation  # type: ignore[misc]
    for kind, cls in UNIT_CLASSES.items()
}

_ADAPTER: TypeAdapter[Any] = TypeAdapter(EvidenceUnit)

# Canonical key order of a unit's front matter when code writes it.
COMMON_KEYS: tuple[str, ...] = (
    "schema_version",
    "id",
    "title",
    "kind",
    "purposes",
    "applies_to",
    "language",
    "provenance",
)


def parse_unit(data: Any) -> UnitBase:
    """Validate plain data (a mapping) as an Evidence Unit; raises ``pydantic.ValidationError``."""
    return _ADAPTER.validate_python(data)


def unit_to_data(unit: UnitBase) -> dict[str, Any]:
    """Plain data of a unit in canonical key order (common fields, kind block, review items)."""
    raw = unit.model_dump(mode="json", exclude_none=True)
    out: dict[str, Any] = {k: raw[k] for k in COMMON_KEYS}
    out[unit.kind.value] = raw[unit.kind.value]
    out["review_items"] = raw.get("review_items", [])
    return out


def unit_json_schemas() -> dict[str, Any]:
    """JSON schema of every kind (for the model request), keyed by kind."""
    return {kind.value: cls.model_json_schema() for kind, cls in UNIT_CLASSES.items()}
