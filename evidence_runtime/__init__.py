"""Read-only runtime of thoth-evidence: the unit contract, query text, index access and search.

Workflow stages use :func:`search_for_stage` (or :func:`search` with an explicit purpose); the
outcome is ``available`` with grouped, cited candidates, or ``unavailable`` with a stable code.
Importing this package never imports Dagster, the authoring pipeline, Git or a model client.
"""

from evidence_runtime.errors import (
    ConfigError,
    DiskFullError,
    EmbedderError,
    ErrorCode,
    EvidenceError,
    IndexCorruptError,
    IndexError_,
    IndexLockedError,
    IndexMissingError,
    IndexSchemaError,
    IndexUnavailableError,
    RegistryError,
    RegistryLockedError,
    UnitFormatError,
)
from evidence_runtime.query import (
    MAX_QUERY_CHARS,
    EmptyQueryError,
    EvidenceConstraints,
    EvidenceSearchContext,
    InvalidQueryError,
    render_query,
)
from evidence_runtime.search import (
    DocumentOutcome,
    DocumentRef,
    EvidenceResult,
    EvidenceSearcher,
    EvidenceSearchOutcome,
    ResultProvenance,
    UnavailableCode,
    configure,
    reset,
    resolve_document,
    search,
)
from evidence_runtime.stages import (
    STAGE_PURPOSES,
    EvidenceReceipt,
    StageError,
    WorkflowStage,
    project_skill,
    purpose_for_stage,
    search_for_stage,
)
from evidence_runtime.units import EvidenceKind, EvidencePurpose

__all__ = [
    "MAX_QUERY_CHARS",
    "STAGE_PURPOSES",
    "ConfigError",
    "DiskFullError",
    "DocumentOutcome",
    "DocumentRef",
    "EmbedderError",
    "EmptyQueryError",
    "ErrorCode",
    "EvidenceConstraints",
    "EvidenceError",
    "EvidenceKind",
    "EvidencePurpose",
    "EvidenceReceipt",
    "EvidenceResult",
    "EvidenceSearchContext",
    "EvidenceSearchOutcome",
    "EvidenceSearcher",
    "IndexCorruptError",
    "IndexError_",
    "IndexLockedError",
    "IndexMissingError",
    "IndexSchemaError",
    "IndexUnavailableError",
    "InvalidQueryError",
    "RegistryError",
    "RegistryLockedError",
    "ResultProvenance",
    "StageError",
    "UnavailableCode",
    "UnitFormatError",
    "WorkflowStage",
    "configure",
    "project_skill",
    "purpose_for_stage",
    "render_query",
    "reset",
    "resolve_document",
    "search",
    "search_for_stage",
]
