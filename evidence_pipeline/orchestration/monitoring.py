"""Monitoring: evaluation.yaml against the active index (read-only), run nightly.

The nightly job also runs ``index_integrity``, the check ``tht workspace check`` makes (registry,
each retained generation's points, named vectors and payload fields, staged batches, stale
evaluation copies), on ``active_generation`` (so it runs after each publication too, and even
when a damaged index makes the evaluation itself fail). The same evaluation ``tht evidence
evaluate`` runs (:func:`evaluate_generation`); its report is
recorded as the asset's value and metadata (hit@5, hit@10, per-branch ranks, regressions against
the saved baseline).
"""

from typing import Any

import dagster as dg

from evidence_pipeline.authoring.recovery import staged_batches
from evidence_pipeline.orchestration.metadata import (
    OPERATORS,
    catalog,
    evaluation_metadata,
    misses_metadata,
    regressions_text,
)
from evidence_pipeline.orchestration.operations import refusals
from evidence_pipeline.orchestration.progress import tell
from evidence_pipeline.orchestration.publishing import active_generation
from evidence_pipeline.orchestration.resources import (
    EmbedderResource,
    IndexResource,
    WorkspaceResource,
)
from evidence_pipeline.publishing.check import check_workspace
from evidence_pipeline.publishing.evaluate import (
    EvaluationReport,
    baseline_path,
    evaluate_generation,
    evaluation_index,
    save_baseline,
)
from evidence_pipeline.publishing.publish import open_registry
from evidence_runtime.search import EvidenceSearcher
from evidence_runtime.workspace import Workspace

GROUP = "monitoring"


def evaluate_active(ws: Workspace, index: IndexResource,
                    embedder: EmbedderResource) -> EvaluationReport:
    """Evaluate the active generation through the resources' index and embedder;
    :class:`EvaluationUnavailable` when search is unavailable (no active generation, or it
    does not serve the activated revision)."""
    emb = embedder.make(ws)
    # on the embedded engine a copy of the shard: searches elsewhere wait only for the copy
    with open_registry(ws) as registry, evaluation_index(ws, index.config(ws)) as where, \
            EvidenceSearcher.for_workspace(ws, index_target=where, registry=registry,
                                           embedder=emb) as searcher:
        return evaluate_generation(ws, searcher)


@dg.asset(group_name=GROUP, deps=[active_generation], kinds={"qdrant"}, pool="index",
          **catalog(GROUP, OPERATORS))
@refusals
def active_index_evaluation(context: dg.AssetExecutionContext, workspace: WorkspaceResource,
                            index: IndexResource,
                            embedder: EmbedderResource) -> dg.Output[EvaluationReport]:
    """evaluation.yaml against the active generation (read-only), with the branch ranks."""
    report = evaluate_active(workspace.load(), index, embedder)
    s = report.summary
    tell(context, f"active generation {report.generation}: hit@5 {s.hit_at_5}/"
                  f"{s.queries}, hit@10 {s.hit_at_10}/{s.queries}")
    return dg.Output(report, metadata=evaluation_metadata(report))


@dg.asset_check(asset=active_index_evaluation)
def active_index_gate(active_index_evaluation: EvaluationReport) -> dg.AssetCheckResult:
    """The active index still passes the gate and no query regressed against the baseline."""
    report = active_index_evaluation
    metadata: dict[str, Any] = {"gate_passed": dg.MetadataValue.bool(report.gate_passed),
                                "regressions": regressions_text(report),
                                **misses_metadata(report)}
    return dg.AssetCheckResult(passed=report.gate_passed and not report.regressions,
                               severity=dg.AssetCheckSeverity.WARN, metadata=metadata)


@dg.op(pool="index")
@refusals
def save_baseline_of_active(context: dg.OpExecutionContext, workspace: WorkspaceResource,
                            index: IndexResource,
                            embedder: EmbedderResource) -> dg.Output[EvaluationReport]:
    """Evaluate the active generation and save the report as the baseline the nightly
    evaluation compares with (tht evidence evaluate --save-baseline)."""
    ws = workspace.load()
    report = evaluate_active(ws, index, embedder)
    where = baseline_path(ws.state_dir)
    save_baseline(report, where)
    s = report.summary
    tell(context, f"baseline saved from generation {report.generation}: hit@10 "
                  f"{s.hit_at_10}/{s.queries} ({where})")
    metadata = {**evaluation_metadata(report), "baseline": str(where)}
    metadata.pop("regressions", None)  # the report is the baseline now
    context.log_event(dg.AssetMaterialization("active_index_evaluation", metadata=metadata))
    return dg.Output(report, metadata={"generation": dg.MetadataValue.int(report.generation),
                                       "baseline": str(where)})


@dg.job(name="save_evaluation_baseline",
        description="tht evidence evaluate --save-baseline: evaluate the active generation and "
                    "save the report as the baseline later evaluations compare with.",
        tags={"tht/trigger": "operator"})
def save_evaluation_baseline_job() -> None:
    save_baseline_of_active()


@dg.asset_check(asset=active_generation, blocking=False)
def index_integrity(workspace: WorkspaceResource, index: IndexResource) -> dg.AssetCheckResult:
    """The index holds every retained generation whole (`tht workspace check`, no repair)."""
    ws = workspace.load()
    report = check_workspace(ws, config=index.config(ws),
                             staged=staged_batches(ws))
    findings = "\n".join(f"{f.code}: {f.message}" for f in report.findings) or "none"
    metadata: dict[str, Any] = {
        "status": dg.MetadataValue.text(report.status),
        "findings": dg.MetadataValue.md(findings),
        "check_s": dg.MetadataValue.float(report.timings.get("check_s", 0.0)),
        "generations": dg.MetadataValue.json(
            [g.model_dump(mode="json") for g in report.generations])}
    return dg.AssetCheckResult(passed=report.status == "ok",
                               severity=dg.AssetCheckSeverity.ERROR, metadata=metadata)
