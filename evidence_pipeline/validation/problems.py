"""Validation findings: a stable code, a severity and what they are about, and the report's status.

Three outcomes: ``publishable`` (valid), ``blocked`` (valid with doubts: review items, orphans,
retirement candidates), ``invalid`` (any error). ``model_dump(mode="json")`` of a
:class:`ValidationReport` is the ``validate --json`` document of DESIGN.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    computed_field,
    field_serializer,
    model_serializer,
)


class Severity(StrEnum):
    error = "error"
    review = "review"


class Status(StrEnum):
    publishable = "publishable"
    blocked = "blocked"
    invalid = "invalid"


_POSITIONAL = ("code", "severity", "path", "evidence_id", "message", "field")


class Problem(BaseModel):
    """One finding: stable code, severity, and what it is about.

    Built positionally as ``Problem(code, severity, path, evidence_id, message[, field])``, as
    every rule does; dumped in the field order of the JSON contract (``field`` before
    ``message``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str
    severity: Severity
    path: str | None
    evidence_id: str | None
    field: str | None = None
    message: str

    def __init__(self, *args: Any, **data: Any) -> None:
        if len(args) > len(_POSITIONAL):
            raise TypeError(f"Problem takes at most {len(_POSITIONAL)} positional arguments")
        super().__init__(**dict(zip(_POSITIONAL, args, strict=False)), **data)

    def line(self) -> str:
        where = ": ".join(p for p in (self.path, self.evidence_id, self.field) if p)
        return f"{self.severity.value} {self.code} {where}: {self.message}"


def sort_problems(problems: Iterable[Problem]) -> list[Problem]:
    return sorted(
        problems,
        key=lambda p: (p.severity != Severity.error, p.path or "", p.evidence_id or "",
                       p.code, p.field or "", p.message),
    )


class ValidationReport(BaseModel):
    """How many units were checked and what was found (dumped sorted: errors first, then by
    path, unit, code)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    units: int
    problems: list[Problem] = Field(default_factory=list)

    @field_serializer("problems", mode="wrap")
    def _sorted(self, problems: list[Problem], handler: SerializerFunctionWrapHandler) -> Any:
        return handler(sort_problems(problems))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def status(self) -> Status:
        if any(p.severity is Severity.error for p in self.problems):
            return Status.invalid
        if self.problems:
            return Status.blocked
        return Status.publishable

    @model_serializer(mode="wrap")
    def _status_first(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        return {"status": out.pop("status"), **out}
