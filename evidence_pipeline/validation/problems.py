"""Validation findings: a stable code, a severity and what they are about, and the report's status.

Three outcomes: ``publishable`` (valid), ``blocked`` (valid with doubts: review items, orphans,
retirement candidates), ``invalid`` (any error).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


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

