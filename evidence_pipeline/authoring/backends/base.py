"""The one model step of ``prepare`` (spec §5.3): request, reply, prompt and backend factory.

A backend receives one changed source (normalized text, previous units and their ids) and answers
with proposed units and retirement candidates. The reply is checked strictly here — shape, ids,
source — before anything else looks at it; content checks (excerpts in the source, SQL, kind
rules) are the validator's (§5.4). No backend retries.
"""

from __future__ import annotations

import difflib
import json
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, reduce
from importlib import resources
from typing import Annotated, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from evidence_runtime.errors import ConfigError, ErrorCode, EvidenceError
from evidence_runtime.units import (
    BLOCK_CLASSES,
    MAX_EXCERPT_CHARS,
    MAX_EXCERPTS,
    AppliesTo,
    EvidenceKind,
    EvidencePurpose,
    ReviewItem,
    unit_json_schemas,
)

DEFAULT_TIMEOUT_S = 300.0
MAX_MESSAGE_CHARS = 2000

SettingsT = TypeVar("SettingsT", bound=BaseModel)


# ---------------------------------------------------------------------------------------------
# Request and reply
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreviousUnit:
    """A curated unit already derived from the source: its id, front matter and body."""

    id: str
    data: dict[str, Any]
    body: str


@dataclass(frozen=True)
class ModelRequest:
    """Everything the model step sees for one changed source."""

    source_file: str  # relative to evidence/, e.g. "source/10-domini-clinici/paziente.md"
    source_sha256: str  # "sha256:<hex>"
    normalized_text: str  # evidence_pipeline.formats.normalize.normalize_text of the source
    language: str  # unit language code, e.g. "it"
    previous_units: tuple[PreviousUnit, ...] = ()
    max_chunk_chars: int = 4000
    # the normalized text the previous units were made from, when known: lets a backend tell
    # unchanged parts of the note from changed ones (minimal change)
    previous_text: str | None = None

    @property
    def allowed_ids(self) -> frozenset[str]:
        """The only ids a reply may use: those of the previous units."""
        return frozenset(u.id for u in self.previous_units)


@dataclass(frozen=True)
class ProposedUnit:
    """One unit of a reply.

    ``id`` is an allowed id (the same unit kept) or ``None`` (a new unit; code assigns
    ``evidence:<slug>``). ``data`` holds title, kind, purposes, applies_to, the kind block,
    supporting_excerpts and review_items — never schema_version, id, language or provenance.
    ``body`` is the restructured Markdown text without the title heading.
    """

    id: str | None
    data: dict[str, Any]
    body: str


@dataclass(frozen=True)
class RetirementProposal:
    """A previous unit the source no longer supports (review item ``source_no_longer_...``)."""

    id: str
    message: str


@dataclass(frozen=True)
class ModelReply:
    units: tuple[ProposedUnit, ...]
    retirement_candidates: tuple[RetirementProposal, ...] = ()


class ModelBackend(Protocol):
    """Restructures one changed source; raises :class:`ModelBackendError` naming the source."""

    name: str

    def restructure(self, request: ModelRequest) -> ModelReply: ...


class ModelBackendError(EvidenceError):
    """The model step failed for one source (timeout, process, HTTP, invalid reply).

    Codes: ``model_timeout``, ``model_process_failed``, ``model_http_error``,
    ``model_unreachable``, ``model_malformed_json``, ``model_invalid_output``,
    ``model_unknown_id``. ``path`` is always the source file.
    """

    code = ErrorCode.model_error


def bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """The tail of a (possibly long) text, marked when cut."""
    text = text.strip()
    return text if len(text) <= limit else "…" + text[-limit:]


# ---------------------------------------------------------------------------------------------
# The reply contract, as pydantic models built from the unit contract
# ---------------------------------------------------------------------------------------------

Excerpt = Annotated[str, Field(min_length=1, max_length=MAX_EXCERPT_CHARS)]


class _ProposedBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(
        default=None,
        description="Only for a unit that is still the same as a previous unit: its id, "
        "exactly as received. Omit for a new unit.")
    source_file: str | None = Field(
        default=None, description="If given, must be the source file of the request.")
    title: str = Field(
        min_length=1, description="A short title naming what the unit is about, in the "
        "language of the note (e.g. a term, a column, a rule).")
    purposes: list[EvidencePurpose] = Field(min_length=1)
    applies_to: AppliesTo = Field(default_factory=AppliesTo)
    supporting_excerpts: list[Excerpt] = Field(
        min_length=1, max_length=MAX_EXCERPTS,
        description="1-5 short verbatim quotes of the source text that support the unit.")
    review_items: list[ReviewItem] = Field(default_factory=list)
    body: str = Field(description="The restructured Markdown text, without a title heading.")


class RetirementCandidate(BaseModel):
    """A previous unit the note no longer supports, as the reply names it."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="The id of a previous unit, exactly as received.")
    message: str = Field(min_length=1, description="Why the note no longer supports it.")


@cache
def _reply_model() -> type[BaseModel]:
    # Field order is generation order for a grammar-constrained model (llama.cpp follows the
    # schema's property order): decide the id and the kind, fill the kind's block, then quote
    # the source, and write the free text last.
    common = _ProposedBase.model_fields
    head = ("id", "kind", "title", "purposes", "applies_to")
    variants = []
    for kind in EvidenceKind:
        own: dict[str, Any] = {
            "kind": (Literal[kind.value], ...),  # type: ignore[valid-type]
            kind.value: (BLOCK_CLASSES[kind], ...),
        }
        order = [*head, kind.value, *(name for name in common if name not in head)]
        fields = {name: own[name] if name in own else (common[name].annotation, common[name])
                  for name in order}
        variants.append(create_model(  # type: ignore[call-overload]
            f"Proposed{kind.value.capitalize()}Unit",
            __config__=_ProposedBase.model_config, **fields))
    union = Annotated[reduce(operator.or_, variants), Field(discriminator="kind")]
    return create_model(  # type: ignore[call-overload]
        "EvidenceUnitsReply",
        __config__=ConfigDict(extra="forbid"),
        units=(list[union], ...),  # type: ignore[valid-type]
        retirement_candidates=(list[RetirementCandidate], Field(default_factory=list)),
    )


def reply_json_schema() -> dict[str, Any]:
    """JSON schema of the reply the model must produce (built from the unit contract).

    Without pydantic's generated ``title`` annotations: they say nothing a model needs, and
    small models copy them ("ProposedEnumUnit") into the unit's own ``title``.
    """
    return schema_without_titles(_reply_model().model_json_schema())


def schema_without_titles(schema: Any) -> Any:
    """A JSON schema without its ``title`` annotations (properties named ``title`` stay)."""
    if isinstance(schema, list):
        return [schema_without_titles(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties") \
                and isinstance(value, dict):
            out[key] = {name: schema_without_titles(sub) for name, sub in value.items()}
        elif key in ("default", "const", "enum", "examples"):
            out[key] = value  # values, not schemas
        else:
            out[key] = schema_without_titles(value)
    return out


_FENCED = re.compile(r"^```[A-Za-z]*\n(?P<body>.*)\n```$", re.DOTALL)


def parse_reply(raw: str, request: ModelRequest) -> ModelReply:
    """Parse a model's raw answer strictly; any fault makes the whole reply invalid.

    One surrounding Markdown code fence is tolerated (chat models add it); nothing else is
    repaired.
    """
    text = raw.strip()
    fenced = _FENCED.match(text)
    if fenced:
        text = fenced.group("body").strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        shown = f" (reply starts {text[:80]!r})" if text else " (empty reply)"
        raise ModelBackendError(
            f"the model reply is not valid JSON: {exc.msg} at line {exc.lineno} column "
            f"{exc.colno}{shown}", code="model_malformed_json",
            path=request.source_file) from None
    return reply_from_data(data, request)


def reply_from_data(data: Any, request: ModelRequest) -> ModelReply:
    """Check decoded reply data against the reply contract and the request's ids and source."""
    path = request.source_file

    def invalid(message: str, field: str | None = None) -> ModelBackendError:
        return ModelBackendError(message, code="model_invalid_output", path=path, field=field)

    if not isinstance(data, dict):
        raise invalid("the model reply must be a JSON object with 'units' and "
                      "'retirement_candidates'")
    units = data.get("units")
    retire = data.get("retirement_candidates", [])
    if not isinstance(units, list):
        raise invalid("'units' must be an array", "units")
    if not isinstance(retire, list):
        raise invalid("'retirement_candidates' must be an array", "retirement_candidates")
    allowed = request.allowed_ids
    # ids and sources first: a reply that names a unit or a file it was not given is refused
    # as a whole, whatever else is wrong with it
    for i, unit in enumerate(units):
        if not isinstance(unit, dict):
            continue
        uid = unit.get("id")
        if uid is not None and (not isinstance(uid, str) or uid not in allowed):
            raise ModelBackendError(
                f"units[{i}] uses the id {uid!r}, which was not given for this source "
                f"(allowed: {', '.join(sorted(allowed)) or 'none'}); new units carry no id",
                code="model_unknown_id", path=path, evidence_id=str(uid), field=f"units[{i}].id")
        source = unit.get("source_file")
        if source is not None and source != request.source_file:
            raise invalid(f"units[{i}] cites another source ({source!r}); a unit may only "
                          f"come from {request.source_file!r}", f"units[{i}].source_file")
    for i, cand in enumerate(retire):
        if isinstance(cand, dict) and cand.get("id") not in allowed:
            raise ModelBackendError(
                f"retirement_candidates[{i}] names the id {cand.get('id')!r}, which was not "
                "given for this source", code="model_unknown_id", path=path,
                evidence_id=str(cand.get("id")), field=f"retirement_candidates[{i}].id")
    try:
        parsed = _reply_model().model_validate(data)
    except ValidationError as exc:
        problems = _validation_lines(exc)
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        first_field = problems[0][0] if problems else None
        raise invalid("the model reply does not match the schema: "
                      + "; ".join(f"{f}: {m}" for f, m in problems[:5]) + more,
                      first_field) from None
    seen: dict[str, str] = {}
    out_units: list[ProposedUnit] = []
    for i, unit in enumerate(parsed.units):  # type: ignore[attr-defined]
        if unit.id is not None:
            if unit.id in seen:
                raise invalid(f"units[{i}] reuses the id {unit.id!r} already used by "
                              f"{seen[unit.id]}", f"units[{i}].id")
            seen[unit.id] = f"units[{i}]"
        out_units.append(ProposedUnit(id=unit.id, data=_unit_data(unit), body=unit.body))
    out_retire: list[RetirementProposal] = []
    for i, cand in enumerate(parsed.retirement_candidates):  # type: ignore[attr-defined]
        if cand.id in seen:
            raise invalid(f"retirement_candidates[{i}] names {cand.id!r}, which "
                          f"{seen[cand.id]} keeps", f"retirement_candidates[{i}].id")
        if any(r.id == cand.id for r in out_retire):
            continue
        out_retire.append(RetirementProposal(id=cand.id, message=cand.message))
    return ModelReply(units=tuple(out_units), retirement_candidates=tuple(out_retire))


def _unit_data(unit: BaseModel) -> dict[str, Any]:
    raw = unit.model_dump(mode="json", exclude_none=True)
    kind = raw["kind"]
    return {
        "title": raw["title"],
        "kind": kind,
        "purposes": raw["purposes"],
        "applies_to": raw["applies_to"],
        kind: raw[kind],
        "supporting_excerpts": raw["supporting_excerpts"],
        "review_items": raw.get("review_items", []),
    }


def _validation_lines(exc: ValidationError) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    kinds = {k.value for k in EvidenceKind}
    for err in exc.errors(include_url=False):
        loc = list(err["loc"])
        # drop the discriminator tag pydantic inserts after the unit index
        if len(loc) >= 3 and loc[0] == "units" and loc[2] in kinds:
            loc = loc[:2] + loc[3:]
        parts: list[str] = []
        for p in loc:
            if isinstance(p, int):
                parts[-1:] = [f"{parts[-1]}[{p}]"] if parts else [f"[{p}]"]
            else:
                parts.append(str(p))
        msg = str(err["msg"]).removeprefix("Value error, ")
        out.append((".".join(parts) or "reply", msg))
    return out


# ---------------------------------------------------------------------------------------------
# Prompt
# ---------------------------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")


@cache
def _prompt_template(name: str) -> str:
    prompts = resources.files("evidence_pipeline.authoring") / "prompts"
    return (prompts / name).read_text(encoding="utf-8")


def system_prompt() -> str:
    """The system prompt of the restructuring call."""
    return _prompt_template("system.md").strip()


def build_prompt(request: ModelRequest) -> str:
    """The full user prompt for one source.

    The fixed part (rules, unit schemas, reply schema) comes first and is the same for every
    source of a workspace, so that an endpoint's prompt cache (llama.cpp's slot cache, hosted
    prefix caching) serves it again; the note, its path, its previous units and what changed
    in it come last.
    """
    previous = [
        {"id": u.id, "front_matter": u.data, "body": u.body} for u in request.previous_units
    ]
    values = {
        "SOURCE_FILE": request.source_file,
        "LANGUAGE": request.language,
        "MAX_CHUNK_CHARS": str(request.max_chunk_chars),
        "KIND_ORDER": ", ".join(k.value for k in EvidenceKind),
        "UNIT_SCHEMAS": _compact(schema_without_titles(unit_json_schemas())),
        "ALLOWED_IDS": ", ".join(sorted(request.allowed_ids)) or "(none: every unit is new)",
        "PREVIOUS_UNITS": json.dumps(previous, ensure_ascii=False, indent=1),
        "SOURCE_TEXT": request.normalized_text,
        "REPLY_SCHEMA": _compact(reply_json_schema()),
        "CHANGES": _changes_section(request),
    }
    # one pass, so that text from the source can never be taken for a placeholder
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)),
                            _prompt_template("restructure.md"))


def _changes_section(request: ModelRequest) -> str:
    """A unified diff from the text the previous units were made from to the note as it is now.

    Empty when that text is unknown or unchanged: the model then compares the units with the
    note by itself.
    """
    old = request.previous_text
    if old is None or old == request.normalized_text:
        return ""
    diff = "".join(difflib.unified_diff(
        old.splitlines(keepends=True), request.normalized_text.splitlines(keepends=True),
        fromfile="previous", tofile="now", n=2))
    if not diff.endswith("\n"):
        diff += "\n"
    return ("## What changed in the note since the previous units were made\n\n"
            "Keep the previous units where the note did not change (rule 7).\n\n"
            f"```diff\n{diff}```\n\n")


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------------------------

BACKEND_NAMES = ("pi", "openai", "structural")

def read_settings(model: type[SettingsT], settings: Mapping[str, Any], backend: str
                  ) -> SettingsT:
    """A backend's ``model:`` settings as ``model``; a :class:`ConfigError` naming the first
    bad setting."""
    try:
        return model.model_validate(dict(settings))
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        key = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"bad {backend} setting {key!r}: {err['msg']}",
                          field=f"model.{key}") from None
