"""Formula proposals of workflow sessions (spec §12) imported as notes plus units awaiting review.

A workflow session never writes the repository: this maintenance import, run by a maintainer on
a clean authoring clone, is the only way in, and Git review is the approval.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evidence_pipeline.authoring.formulas.importer import (
    Candidate,
    FormulaImportError,
    ImportResult,
    formula_data,
    run_import,
)
from evidence_pipeline.authoring.ids import slugify
from evidence_pipeline.authoring.sources import Source
from evidence_pipeline.validation.rules import check_formula_sql, find_credentials
from evidence_runtime.curated import decode_text
from evidence_runtime.errors import UnitFormatError
from evidence_runtime.units import check_column_ref
from evidence_runtime.workspace import load_workspace

# Where the proposal notes live, relative to evidence/.
PROPOSALS_SOURCE_DIR = "source/proposals"
PROPOSAL_AWAITING_REVIEW = "formula_proposal_awaiting_review"
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
                        single: bool, language: str) -> Candidate:
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
        excerpts = [proposal.question, proposal.rationale, columns_line, proposal.sql]
        data = formula_data(eid=eid, title=title, concept=proposal.concept,
                             columns=proposal.columns, sql=proposal.sql, language=language,
                             source=src, excerpts=excerpts, review_items=review)
        body = PROPOSAL_BODY.format(session_id=proposal.session_id, question=proposal.question,
                                    rationale=proposal.rationale, fence=fence, sql=proposal.sql)
        return data, body

    return Candidate(origin=origin, source_rel=rel, raw=raw, title=title, build=build,
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
    candidates: list[Candidate] = []
    for artifact in artifacts:
        artifact = Path(artifact)
        proposals, single = _read_artifact(artifact)
        for index, proposal in enumerate(proposals):
            candidates.append(_proposal_candidate(proposal, artifact=artifact, index=index,
                                                  single=single,
                                                  language=ws.config.language_code))
    return run_import(ws, candidates, what="import-proposals")
