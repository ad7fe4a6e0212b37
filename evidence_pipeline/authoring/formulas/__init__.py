"""Formula migration and formula proposals (spec §4.3, §12, §16): two maintenance imports.

``import_formulas`` converts the legacy store ``formulas/*.sql.md`` into curated ``kind: formula``
units, each citing a verbatim copy of its legacy file under ``evidence/source/``; after the
migration there is one runtime store (``legacy``). ``import_proposals`` takes the formula
proposals a workflow session recorded in its artifact and turns each into a source note plus a
curated unit awaiting review (``proposals``). A workflow session never writes the repository:
these imports, run by a maintainer on a clean authoring clone, are the only way in, and Git
review is the approval.

Both give prepare's guarantees (spec §5.5, §6, §13.1), in the same authoring session
(``importer``): a clean tree, the workspace lock, every unit validated before anything is
written, one all-or-nothing batch (sources, curated files, manifest), ids minted once, and a
re-run on the same input is a no-op.
"""

from evidence_pipeline.authoring.formulas.importer import (
    FormulaImportError,
    ImportEntry,
    ImportResult,
)
from evidence_pipeline.authoring.formulas.legacy import (
    LEGACY_COLUMNS_MISSING,
    LEGACY_INCOMPATIBLE,
    LEGACY_SOURCE_DIR,
    import_formulas,
    parse_legacy,
)
from evidence_pipeline.authoring.formulas.proposals import (
    PROPOSAL_AWAITING_REVIEW,
    PROPOSALS_SOURCE_DIR,
    FormulaProposal,
    import_proposals,
    read_proposals,
)

__all__ = [
    "LEGACY_COLUMNS_MISSING",
    "LEGACY_INCOMPATIBLE",
    "LEGACY_SOURCE_DIR",
    "PROPOSALS_SOURCE_DIR",
    "PROPOSAL_AWAITING_REVIEW",
    "FormulaImportError",
    "FormulaProposal",
    "ImportEntry",
    "ImportResult",
    "import_formulas",
    "import_proposals",
    "parse_legacy",
    "read_proposals",
]
