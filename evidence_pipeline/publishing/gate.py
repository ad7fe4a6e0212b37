"""The gate and the switch (spec §8, §13.2, §14): the candidate evaluated against
evaluation.yaml (a failed gate marks it failed and removes its points), then made active in one
registry update, and retention applied to the generations before it."""

from __future__ import annotations

import contextlib
from typing import Any

from evidence_pipeline.publishing.candidate import Candidate, compensating, discard_points
from evidence_pipeline.publishing.evaluate import (
    EvaluationReport,
    baseline_path,
    evaluate,
    with_baseline,
)
from evidence_pipeline.publishing.guard import (
    Progress,
    PublishError,
    fault_step,
    publish_lock,
)
from evidence_pipeline.publishing.index_writer import IndexWriter
from evidence_pipeline.publishing.registry_writer import RegistryWriter
from evidence_pipeline.validation.corpus import LoadedUnit
from evidence_runtime.embeddings import Embedder
from evidence_runtime.errors import EvidenceError, RegistryError
from evidence_runtime.registry import GenerationStatus
from evidence_runtime.search import RECORD_KIND, EvidenceSearcher
from evidence_runtime.workspace import Workspace


class GateFailed(PublishError):
    code = "evaluation_gate_failed"

    def __init__(self, report: EvaluationReport, message: str) -> None:
        super().__init__(message)
        self.report = report


def evaluate_candidate(ws: Workspace, registry: RegistryWriter, index: IndexWriter, emb: Embedder,
                       candidate: Candidate, loaded: list[LoadedUnit],
                       evalset: Any) -> EvaluationReport:
    """Evaluate the candidate and record the report; a failed gate marks it failed and removes
    its points (the active generation is left alone)."""
    wid = ws.config.workspace_id
    number = candidate.generation
    with publish_lock(ws), compensating(registry, index, wid, number):
        searcher = EvidenceSearcher.for_workspace(ws, index=index, registry=registry,
                                                  embedder=emb)
        kinds = {item.unit.id: item.unit.kind.value for item in loaded if item.unit}
        report = evaluate(searcher, evalset, unit_kinds=kinds, generation=number)
        # an unreadable baseline must not block publication: it only adds information
        with contextlib.suppress(EvidenceError):
            report = with_baseline(report, baseline_path(ws.state_dir))
        registry.update_generation(wid, number, counts=candidate.counts,
                                   evaluation=report.model_dump(mode="json"))
        if not report.gate_passed:
            registry.update_generation(wid, number, status=GenerationStatus.failed)
            discard_points(index, wid, number)
    fault_step("after_evaluation")
    return report


def gate_failure(report: EvaluationReport) -> GateFailed:
    """The error of a failed gate, naming the queries without an expected unit in the top 10."""
    missed = report.missed_queries
    regressed = (f"; regressions against the baseline: {', '.join(report.regressions)}"
                 if report.regressions else "")
    return GateFailed(report, f"evaluation gate failed: {len(missed)} query(ies) without "
                              f"an expected unit in the fused top 10: "
                              f"{', '.join(missed[:10])}{regressed}")


def activate_candidate(ws: Workspace, registry: RegistryWriter, index: IndexWriter,
                       candidate: Candidate, report: EvaluationReport, *,
                       say: Progress) -> list[int]:
    """Switch the active pointer to the candidate (only after its gate passed), then apply
    retention; returns the generations whose points were deleted."""
    if report.generation != candidate.generation:
        raise PublishError(f"the evaluation is of generation {report.generation}, not of the "
                           f"candidate {candidate.generation}; evaluate the candidate first",
                           code="evaluation_mismatch")
    if not report.gate_passed:
        raise gate_failure(report)
    wid = ws.config.workspace_id
    with publish_lock(ws):
        with compensating(registry, index, wid, candidate.generation):
            try:
                registry.activate_generation(wid, candidate.generation)
            except RegistryError:
                # the write may have committed and only its answer been lost (a connection
                # dropped after COMMIT): then the generation is active and must be kept
                if not _is_active(registry, wid, candidate.generation):
                    raise
            say(f"generation {candidate.generation} is active")
        fault_step("after_activation")
        try:
            return apply_retention(registry, index, wid, ws.config.publish.retention)
        except EvidenceError as exc:  # the new generation is active; old points: next run
            say(f"retention skipped: {exc}")
            return []


def _is_active(registry: RegistryWriter, wid: str, number: int) -> bool:
    try:
        active = registry.active_generation(wid)
    except EvidenceError:
        return False
    return active is not None and active.number == number


def apply_retention(registry: RegistryWriter, index: IndexWriter, wid: str, keep: int) -> list[int]:
    """Keep the points of the newest ``keep`` active/retired generations; delete older ones."""
    gens = [g for g in registry.generations(wid)
            if g.status in (GenerationStatus.active, GenerationStatus.retired)
            and g.counts.get("points_retained", True)]
    deleted: list[int] = []
    for g in gens[keep:]:
        if g.status is GenerationStatus.active:
            continue
        # the registry first: a crash in between leaves orphan points (removed by the next
        # run's recover_interrupted), never a "retained" generation without its points, which
        # a rollback would activate into empty answers
        registry.update_generation(wid, g.number, counts={**g.counts, "points_retained": False})
        fault_step("during_retention")
        index.delete({"workspace_id": wid, "vector_generation": g.number,
                      "record_kind": RECORD_KIND})
        deleted.append(g.number)
    return deleted
