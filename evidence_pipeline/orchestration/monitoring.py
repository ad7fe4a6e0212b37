"""Monitoring: evaluation.yaml against the active index (read-only), run nightly.

The same evaluation ``tht evidence evaluate`` runs; its report is recorded as the asset's value
and metadata (hit@5, hit@10, per-branch ranks, regressions against the saved baseline).
"""

import contextlib
from pathlib import Path
from typing import Any

import dagster as dg

from evidence_pipeline.orchestration.metadata import evaluation_metadata
from evidence_pipeline.orchestration.progress import tell
from evidence_pipeline.orchestration.publishing import active_generation
from evidence_pipeline.orchestration.resources import (
    EmbedderResource,
    IndexResource,
    WorkspaceResource,
)
from evidence_pipeline.publishing.evalset import read_evaluation
from evidence_pipeline.publishing.evaluate import (
    EvaluationReport,
    EvaluationUnavailable,
    baseline_path,
    compare_with_baseline,
    evaluate,
)
from evidence_pipeline.publishing.publish import open_registry
from evidence_pipeline.validation.corpus import SourceReader, corpus_files
from evidence_pipeline.validation.validator import load_units
from evidence_runtime.errors import EvidenceError
from evidence_runtime.search import EvidenceSearcher
from evidence_runtime.workspace import Workspace

GROUP = "monitoring"


def _evidence_dir(ws: Workspace, revision: str | None) -> Path:
    """The active revision's materialized evidence (its evaluation.yaml), else the work tree."""
    if revision:
        materialized = ws.state_dir / "revisions" / revision / ws.config.evidence.root
        if materialized.is_dir():
            return materialized
    return ws.evidence_dir


def _unit_kinds(ws: Workspace, evidence_dir: Path) -> dict[str, str]:
    rels = corpus_files(evidence_dir, ws.config.evidence.patterns)
    loaded, _ = load_units(evidence_dir, rels, shown_prefix="",
                           sources=SourceReader(evidence_dir), check=False)
    return {item.unit.id: item.unit.kind.value for item in loaded if item.unit}


def evaluate_active(ws: Workspace, index: IndexResource,
                    embedder: EmbedderResource) -> EvaluationReport:
    """Evaluate the active generation; :class:`EvaluationUnavailable` when search is
    unavailable (no active generation, or it does not serve the activated revision)."""
    emb = embedder.make(ws)
    with open_registry(ws) as registry:
        _, generation = registry.active_state(ws.config.workspace_id)
        if generation is None:
            raise EvaluationUnavailable("no generation is active for this workspace",
                                        path=str(ws.root), code="evaluation_unavailable")
        evidence_dir = _evidence_dir(ws, generation.revision)
        evalset = read_evaluation(evidence_dir)
        with contextlib.closing(index.open(ws, dense_dim=emb.dim, create=False)) as idx:
            searcher = EvidenceSearcher.for_workspace(ws, index=idx, registry=registry,
                                                      embedder=emb)
            report = evaluate(searcher, evalset,
                              unit_kinds=_unit_kinds(ws, evidence_dir))
    with contextlib.suppress(EvidenceError):  # the baseline only adds information
        report.regressions = compare_with_baseline(report, baseline_path(ws.state_dir))
    return report


@dg.asset(group_name=GROUP, deps=[active_generation])
def active_index_evaluation(context: dg.AssetExecutionContext, workspace: WorkspaceResource,
                            index: IndexResource,
                            embedder: EmbedderResource) -> dg.Output[EvaluationReport]:
    """evaluation.yaml against the active generation (read-only), with the branch ranks."""
    report = evaluate_active(workspace.load(), index, embedder)
    s = report.summary
    tell(context, f"active generation {report.generation}: hit@5 {s['hit_at_5']}/"
                  f"{s['queries']}, hit@10 {s['hit_at_10']}/{s['queries']}")
    return dg.Output(report, metadata=evaluation_metadata(report))


@dg.asset_check(asset=active_index_evaluation)
def active_index_gate(active_index_evaluation: EvaluationReport) -> dg.AssetCheckResult:
    """The active index still passes the gate and no query regressed against the baseline."""
    report = active_index_evaluation
    regressions = report.regressions or []
    metadata: dict[str, Any] = {"gate_passed": dg.MetadataValue.bool(report.gate_passed),
                                "regressions": ", ".join(regressions) or "none"}
    return dg.AssetCheckResult(passed=report.gate_passed and not regressions,
                               severity=dg.AssetCheckSeverity.WARN, metadata=metadata)
