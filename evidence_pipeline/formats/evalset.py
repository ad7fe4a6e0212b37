"""``evidence/evaluation.yaml`` (spec §3.4, §14): representative questions and expected ids."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from evidence_runtime.curated import decode_text, validation_messages
from evidence_runtime.errors import ErrorCode, EvidenceError, UnitFormatError
from evidence_runtime.query import EvidenceSearchContext
from evidence_runtime.units import EvidencePurpose, check_evidence_ids
from evidence_runtime.yamlio import load_rt, to_plain

EVALUATION_NAME = "evaluation.yaml"
MALFORMED = ErrorCode.evaluation_malformed


class Profile(StrEnum):
    lexical = "lexical"
    semantic = "semantic"
    mixed = "mixed"


class EvalQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    text: str = Field(min_length=1)
    profile: Profile
    purpose: EvidencePurpose
    context: EvidenceSearchContext = Field(default_factory=EvidenceSearchContext)
    expected: Annotated[tuple[str, ...], AfterValidator(check_evidence_ids)] = Field(min_length=1)


class EvaluationSet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    queries: tuple[EvalQuery, ...] = Field(min_length=1)

    @field_validator("queries")
    @classmethod
    def _unique(cls, v: tuple[EvalQuery, ...]) -> tuple[EvalQuery, ...]:
        seen: set[str] = set()
        for q in v:
            if q.id in seen:
                raise ValueError(f"duplicate query id {q.id!r}")
            seen.add(q.id)
        return v


def read_evaluation(evidence_dir: Path, *, shown: str | None = None) -> EvaluationSet:
    """Read ``evaluation.yaml``; :class:`EvidenceError` ``evaluation_malformed`` names
    the query and field."""
    file = evidence_dir / EVALUATION_NAME
    shown = shown or str(file)
    if not file.is_file():
        raise EvidenceError("evaluation.yaml is missing", path=shown, code=MALFORMED)
    try:
        data = to_plain(load_rt(decode_text(file.read_bytes(), path=shown), path=shown))
    except UnitFormatError as exc:
        raise EvidenceError(exc.message, path=shown, code=MALFORMED) from None
    try:
        return EvaluationSet.model_validate(data)
    except ValidationError as exc:
        field, message = validation_messages(exc)[0]
        raise EvidenceError(message, path=shown, field=field, code=MALFORMED) from None
