"""Stage integration (spec §11.2): semantic stage → purpose, Evidence receipts, SKILL.md.

Evidence is a contributor to existing workflow stages, not a stage of its own. A stage names
itself by its semantic identity (never its display code) and passes its question and context;
it knows nothing of collections, vector names, generations or Qdrant syntax. Each call returns
the outcome and a receipt the caller stores in the session: ids, never copied text.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict

from evidence_runtime.errors import ConfigError, ErrorCode, EvidenceError
from evidence_runtime.query import EvidenceSearchContext
from evidence_runtime.search import (
    EvidenceSearcher,
    EvidenceSearchOutcome,
    UnavailableCode,
    search,
)
from evidence_runtime.units import EvidencePurpose

SKILL_NAME = "thoth-evidence"
SKILL_DESCRIPTION = (
    "Quando e come gli stage di ThothII consultano le Evidence del workspace, come leggerne e "
    "citarne i risultati e cosa fare quando la ricerca non è disponibile."
)
SKILL_NOTICE = (
    "<!-- Generato da evidence_runtime.project_skill() dai frammenti del modulo Evidence "
    "(evidence_runtime/skill/*.md): non modificare a mano. -->"
)


class WorkflowStage(StrEnum):
    """The semantic stages of the ThothII workflow (display codes F1–F7 in comments)."""

    clarification = "clarification"  # F1
    memory = "memory"  # F2: uses the Memory Module, never Evidence
    rewriting = "rewriting"  # F3
    schema_linking = "schema_linking"  # F4
    synthesis = "synthesis"  # F5: summarizes approved schema linking, no new search
    cte = "cte"  # F6
    final_sql = "final_sql"  # F7


STAGE_PURPOSES: Mapping[WorkflowStage, EvidencePurpose] = MappingProxyType({
    WorkflowStage.clarification: EvidencePurpose.disambiguation,
    WorkflowStage.rewriting: EvidencePurpose.rewriting,
    WorkflowStage.schema_linking: EvidencePurpose.schema_linking,
    WorkflowStage.cte: EvidencePurpose.sql_generation,
    WorkflowStage.final_sql: EvidencePurpose.sql_generation,
})


class StageError(EvidenceError, ValueError):
    """A stage that does not consult Evidence (memory, synthesis) or an unknown stage name."""

    code = ErrorCode.stage_without_evidence


def _stage(stage: WorkflowStage | str) -> WorkflowStage:
    try:
        return WorkflowStage(stage)
    except ValueError:
        known = ", ".join(s.value for s in WorkflowStage)
        raise StageError(f"unknown workflow stage {stage!r}; expected one of: {known}",
                         code="unknown_stage", field="stage") from None


def purpose_for_stage(stage: WorkflowStage | str) -> EvidencePurpose:
    """The Evidence purpose of a stage; :class:`StageError` for memory and synthesis."""
    known = _stage(stage)
    purpose = STAGE_PURPOSES.get(known)
    if purpose is None:
        raise StageError(f"stage {known.value!r} never consults Evidence (spec §11.2): "
                         "memory uses the Memory Module, synthesis summarizes the approved "
                         "schema linking", field="stage")
    return purpose


class EvidenceReceipt(BaseModel):
    """What a stage keeps in its session about one Evidence call: no copied text.

    ``available`` with no ids is an empty receipt (the search worked and found nothing);
    ``unavailable`` carries the stable code and blocks the stage.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: WorkflowStage
    purpose: EvidencePurpose
    status: Literal["available", "unavailable"]
    generation: int | None = None
    revision: str | None = None
    evidence_ids: tuple[str, ...] = ()
    code: UnavailableCode | None = None

    @property
    def is_empty(self) -> bool:
        return self.status == "available" and not self.evidence_ids

    @classmethod
    def from_outcome(cls, stage: WorkflowStage | str,
                     outcome: EvidenceSearchOutcome) -> EvidenceReceipt:
        known = _stage(stage)
        return cls(stage=known, purpose=outcome.purpose or purpose_for_stage(known),
                   status=outcome.status, generation=outcome.generation,
                   revision=outcome.revision, evidence_ids=tuple(outcome.evidence_ids),
                   code=outcome.code)


def search_for_stage(stage: WorkflowStage | str, query: str,
                     context: EvidenceSearchContext | None = None, *,
                     searcher: EvidenceSearcher | None = None,
                     ) -> tuple[EvidenceSearchOutcome, EvidenceReceipt]:
    """One independent Evidence search for ``stage`` with the purpose of spec §11.2.

    Uses ``searcher`` or the process-wide one (see :func:`evidence_runtime.configure`).
    Raises :class:`StageError` for stages that never consult Evidence.
    """
    known = _stage(stage)
    purpose = purpose_for_stage(known)
    outcome = (searcher.search(query, purpose, context) if searcher is not None
               else search(query, purpose, context))
    return outcome, EvidenceReceipt.from_outcome(known, outcome)


# --------------------------------------------------------------------------- SKILL.md


def _fragments(fragments_dir: Path | str | None) -> list[tuple[str, str]]:
    folder: Traversable | Path = (resources.files("evidence_runtime") / "skill"
                                  if fragments_dir is None else Path(fragments_dir))
    if not folder.is_dir():
        raise ConfigError("the Evidence skill fragments directory does not exist",
                          path=str(folder))
    found = sorted((f.name, f.read_text(encoding="utf-8")) for f in folder.iterdir()
                   if f.name.endswith(".md") and f.is_file())
    if not found:
        raise ConfigError("no Evidence skill fragments (*.md) found", path=str(folder))
    return found


def project_skill(fragments_dir: Path | str | None = None) -> str:
    """Render the generated SKILL.md: a front matter (name, description), then the module's
    instruction fragments in file-name order (their numeric prefixes fix it).

    The output depends only on the fragments, so it can be regenerated and diffed.
    """
    parts = [
        "---",
        f"name: {SKILL_NAME}",
        f"description: {SKILL_DESCRIPTION}",
        "---",
        "",
        SKILL_NOTICE,
        "",
        "# Evidence",
    ]
    for _name, text in _fragments(fragments_dir):
        body = text.replace("\r\n", "\n").strip()
        if body:
            parts += ["", body]
    return "\n".join(parts) + "\n"


__all__ = [
    "STAGE_PURPOSES",
    "EvidenceReceipt",
    "StageError",
    "WorkflowStage",
    "project_skill",
    "purpose_for_stage",
    "search_for_stage",
]
