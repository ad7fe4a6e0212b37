"""The gate and the switch (spec §8, §13.2, §14): the candidate evaluated against
evaluation.yaml (a failed gate marks it failed and removes its points), then made active in one
registry update, and retention applied to the generations before it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from evidence_pipeline.publishing.candidate import Candidate, compensating, discard_points
from evidence_pipeline.publishing.embedding_cache import VectorCache
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
from evidence_pipeline.publishing.progress import phase_reporter
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
                       candidate: Candidate, loaded: list[LoadedUnit], evalset: Any, *,
                       progress: Callable[[Any], None] | None = None) -> EvaluationReport:
    """Evaluate the candidate and record the report; a failed gate marks it failed and removes
    its points (the active generation is left alone). ``progress`` hears how many queries are
    done (``PhaseProgress`` ``evaluating``, on the embedding's callback)."""
    wid = ws.config.workspace_id
    number = candidate.generation
    with publish_lock(ws), compensating(registry, index, wid, number), \
            CachedQueries.open(emb, ws) as queries:
        searcher = EvidenceSearcher.for_workspace(ws, index=index, registry=registry,
                                                  embedder=queries)
        kinds = {item.unit.id: item.unit.kind.value for item in loaded if item.unit}
        report = evaluate(searcher, evalset, unit_kinds=kinds, generation=number,
                          progress=phase_reporter(progress, "evaluating", "quer(ies)"))
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


class CachedQueries:
    """The gate's embedder: each query's vector comes from the vector cache when the same
    model embedded the same question before (the gate asks the same questions at every
    publication), so an unchanged corpus does not even load the model. Vectors of queries are
    kept apart from those of passages (model id ``<model> query``); a cache that cannot be read
    or written only costs the embedding."""

    def __init__(self, inner: Embedder, cache: VectorCache | None) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.max_chunk_chars = getattr(inner, "max_chunk_chars", 0)
        self._cache = cache
        self._key = f"{inner.model_id} query"
        self._seen: dict[str, np.ndarray] = {}

    @classmethod
    @contextlib.contextmanager
    def open(cls, inner: Embedder, ws: Workspace) -> Iterator[CachedQueries]:
        try:
            cache: VectorCache | None = VectorCache.in_state_dir(ws.state_dir)
        except EvidenceError:
            cache = None
        try:
            yield cls(inner, cache)
        finally:
            if cache is not None:
                cache.close()

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed_passages(texts)

    def embed_query(self, text: str) -> np.ndarray:
        vector = self._seen.get(text)
        if vector is not None:
            return vector
        if self._cache is not None:
            with contextlib.suppress(EvidenceError):
                vector = self._cache.get_many(self._key, [text]).get(0)
        if vector is None:
            vector = self.inner.embed_query(text)
            if self._cache is not None:
                with contextlib.suppress(EvidenceError):
                    self._cache.put_many(self._key, [text], np.asarray(vector)[None, :])
        self._seen[text] = vector
        return vector


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
                       say: Progress,
                       expected: tuple[str | None, int | None] | None = None) -> list[int]:
    """Switch the active pointer to the candidate (only after its gate passed), then apply
    retention; returns the generations whose points were deleted.

    With ``expected`` (``(activated_revision, active_generation)`` as read before the candidate
    was built: ``tht workspace publish``) the activated revision moves to the candidate's in the
    same registry transaction, compare-and-set on both pointers."""
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
                if expected is None:
                    registry.activate_generation(wid, candidate.generation)
                else:
                    registry.activate_generation_and_revision(wid, candidate.generation,
                                                              expected=expected)
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
