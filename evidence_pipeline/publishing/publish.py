"""Publishing (spec §7.2, §8, §13.2): the activated revision becomes a new, evaluated generation.

``activate`` records the workspace revision in the registry. ``preprocess`` materializes that
revision from Git, validates the whole corpus again, cuts fragments, embeds them (cached),
uploads a candidate generation beside the active one, verifies it, evaluates it, and only then
switches the active pointer in one registry update. Any failure leaves the previous generation
active and removes the candidate's points (best effort: without activation they are never read).

Crashes (kill -9, power loss) and concurrent publishers: one publisher per workspace state at a
time (``publish_lock``: an ``flock`` on ``<state>/publish.lock``, released by the kernel when its
process dies, so a dead publisher never leaves a stale lock; the embedded shard's own lock works
the same way). Holding it, ``build_candidate`` first recovers what a dead run left behind
(``recover_interrupted``): a generation still ``candidate`` can only belong to a run that died,
so it is marked ``failed``, and the points of every failed or no-longer-retained generation are
deleted. A crash therefore never changes the active generation unless the activation itself
committed, and the next run needs no manual cleanup. Under Dagster, whose steps run in separate
processes, the lock is held per step: a second publisher started between the steps of a first
one fails that one closed (its candidate is marked failed and can no longer be activated).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evidence_pipeline.gitrepo import require_clean, resolve_revision
from evidence_pipeline.lock import exclusive_lock
from evidence_pipeline.publishing.embedding_cache import (
    EmbeddingProgress,
    VectorCache,
    embed_with_cache,
)
from evidence_pipeline.publishing.evalset import read_evaluation
from evidence_pipeline.publishing.evaluate import (
    EvaluationReport,
    baseline_path,
    evaluate,
    revision_evidence_dir,
    with_baseline,
)
from evidence_pipeline.publishing.fragments import (
    AtomicTooLarge,
    Fragment,
    bm25_settings,
    build_fragments,
)
from evidence_pipeline.publishing.index_writer import IndexPoint, IndexWriter, open_index_writer
from evidence_pipeline.publishing.registry_writer import RegistryWriter
from evidence_pipeline.state import ensure_state_dir
from evidence_pipeline.validation.corpus import LoadedUnit
from evidence_pipeline.validation.problems import Problem, ValidationReport, sort_problems
from evidence_pipeline.validation.validator import atomic_problem, validate_corpus
from evidence_runtime.embeddings import Embedder, make_embedder
from evidence_runtime.errors import EvidenceError, IndexMissingError, RegistryError
from evidence_runtime.index import Bm25Settings, open_index
from evidence_runtime.registry import Generation, GenerationStatus
from evidence_runtime.search import (
    RECORD_KIND,
    EvidenceSearcher,
    index_config,
    missing_points,
)
from evidence_runtime.workspace import Workspace, load_workspace

POINT_NAMESPACE = uuid.UUID("6f1c1a52-3d0e-5b8e-9a57-4d2b0e7c9a10")

# Fault injection (tests only): THT_FAULT_PUBLISH_STEP=<step> kills this process with SIGKILL
# when it reaches <step>, as an OOM kill or a power cut would. The steps, in order:
# upload_batch (between two batches of the upload: half of the points are in the index),
# after_upload, during_verification, after_evaluation (recorded, not yet active),
# after_activation (before retention), during_retention (a generation marked as no longer
# retained, its points not yet deleted).
FAULT_ENV = "THT_FAULT_PUBLISH_STEP"


class PublishError(EvidenceError):
    """Publication refused or failed; the previous generation stays active."""

    code = "publish_failed"

    def __init__(self, message: str, problems: list[Problem] | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.problems = problems or []


@dataclass
class ActivationResult:
    revision: str
    reactivated_generation: int | None


@dataclass
class PublishResult:
    generation: int
    revision: str
    activated: bool
    evaluation: EvaluationReport | None
    counts: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    retired_points_deleted: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "revision": self.revision,
                "activated": self.activated,
                "evaluation": (self.evaluation.summary_with_misses()
                               if self.evaluation else None),
                "counts": self.counts,
                "timings": {k: round(v, 3) for k, v in self.timings.items()}}


Progress = Callable[[str], None]


def point_id(workspace_id: str, generation: int, evidence_id: str, ordinal: int) -> str:
    """Point ids derive from identity: (workspace, generation, evidence id, fragment ordinal)."""
    return str(uuid.uuid5(POINT_NAMESPACE, f"{workspace_id}\0{generation}\0{evidence_id}\0"
                                           f"{ordinal}"))


def _named(problems: list[Problem], shown: int = 3) -> str:
    """The first problems as ``code (path, unit, field)``: the error line names them."""
    parts = []
    for p in problems[:shown]:
        where = ", ".join(x for x in (p.path, p.evidence_id, p.field) if x)
        parts.append(f"{p.code} ({where})" if where else p.code)
    more = f" and {len(problems) - shown} more" if len(problems) > shown else ""
    return "; ".join(parts) + more


def _step(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def open_registry(ws: Workspace) -> RegistryWriter:
    try:
        ensure_state_dir(ws.state_dir)
    except OSError as exc:  # e.g. a read-only or full disk: one clear line, not a traceback
        raise RegistryError(f"cannot create the state directory: {exc.strerror}",
                            path=str(ws.state_dir)) from None
    return RegistryWriter.open(ws.registry_url)


class PublishBusyError(PublishError):
    code = "publish_busy"


@contextlib.contextmanager
def publish_lock(ws: Workspace) -> Iterator[None]:
    """Hold the workspace's publish lock, or refuse at once with :class:`PublishBusyError`.

    An ``flock`` on ``<state>/publish.lock`` (released by the kernel when the process dies),
    reentrant within a process so that ``preprocess`` can hold it around the stages that take
    it too. It keeps two publishers from interleaving on any engine (the embedded shard is
    exclusive anyway; a Qdrant server is not).
    """
    try:
        ensure_state_dir(ws.state_dir)
    except OSError as exc:
        raise PublishError(f"cannot create the state directory: {exc.strerror}",
                           path=str(ws.state_dir)) from None

    def busy(holder: str) -> PublishBusyError:
        return PublishBusyError(f"another publication is running on this workspace ({holder}); "
                                "refused, try again when it has finished", path=str(ws.root))

    with exclusive_lock(ws.state_dir / "publish.lock", holder="preprocess evidence", busy=busy,
                        reentrant=True):
        yield


def activate(root: Workspace | Path | str, *, revision: str | None = None) -> ActivationResult:
    """Record the activated revision (default: HEAD of a clean tree) of the workspace at
    ``root`` (or of a loaded :class:`Workspace`).

    When a retained generation of that revision exists, it becomes active again at once
    (explicit rollback, §13.2) without re-indexing, once its points are counted in the index,
    under the publish lock (so a concurrent retention cannot delete them meanwhile). When the
    index has lost them (lost or rebuilt since), the revision is activated all the same
    (Evidence is unavailable until it is published again), the generation is recorded as no
    longer retained, and :class:`PublishError` ``generation_missing`` says so.
    """
    ws = root if isinstance(root, Workspace) else load_workspace(root)
    if revision is None:
        require_clean(ws.root, (), what="activate HEAD")
        sha = resolve_revision(ws.root, "HEAD")
    else:
        sha = resolve_revision(ws.root, revision)
    wid = ws.config.workspace_id
    with publish_lock(ws), open_registry(ws) as registry:
        previous = registry.latest_generation_for_revision(wid, sha)
        if previous is not None and not previous.counts.get("points_retained", True):
            previous = None
        lost = None if previous is None else _lost_points(ws, previous)
        registry.activate_revision(wid, sha)
        if previous is None:
            return ActivationResult(sha, None)
        if lost is not None:
            registry.update_generation(wid, previous.number,
                                       counts={**previous.counts, "points_retained": False})
            raise PublishError(
                f"revision {sha[:12]} is activated, but its generation {previous.number} cannot "
                f"be reactivated: {lost}. Evidence is unavailable until `tht workspace "
                "preprocess evidence` publishes the revision again", code="generation_missing",
                path=str(ws.root))
        registry.activate_generation(wid, previous.number)
    return ActivationResult(sha, previous.number)


def _lost_points(ws: Workspace, generation: Generation) -> str | None:
    """Why the index no longer holds ``generation``'s points, or None when it does. An index
    that cannot be read now (locked, unreachable) refuses the activation: nothing changes."""
    try:
        index = open_index(index_config(ws), language=ws.config.language)
    except IndexMissingError as exc:
        return f"the index is gone ({exc})"
    except EvidenceError as exc:
        raise PublishError(f"cannot check that generation {generation.number} still has its "
                           f"points: {exc}", code=exc.code, path=str(ws.root)) from exc
    try:
        return missing_points(index, ws.config.workspace_id, generation)
    except EvidenceError as exc:
        raise PublishError(f"cannot check that generation {generation.number} still has its "
                           f"points: {exc}", code=exc.code, path=str(ws.root)) from exc
    finally:
        index.close()


def fragment_payload(ws: Workspace, revision: str, generation: int, item: LoadedUnit,
                     fragment: Fragment) -> dict[str, Any]:
    """Every payload field of §9.6, plus what a result needs to be shown without file reads."""
    unit = item.unit
    assert unit is not None
    return {
        "workspace_id": ws.config.workspace_id,
        "workspace_revision": revision,
        "vector_generation": generation,
        "record_kind": RECORD_KIND,
        "evidence_id": unit.id,
        "evidence_kind": unit.kind.value,
        "purposes": [p.value for p in unit.purposes],
        "concepts": list(unit.applies_to.concepts),
        "tables": list(unit.applies_to.tables),
        "columns": list(unit.applies_to.columns),
        "language": unit.language,
        "source_file": unit.provenance.source_file,
        "source_sha256": unit.provenance.source_sha256,
        "fragment_ordinal": fragment.ordinal,
        "title": unit.title,
        "text": fragment.text,
        "supporting_excerpts": list(unit.provenance.supporting_excerpts),
        "curated_path": f"{ws.config.evidence.root}/{item.rel_path}",
    }


def preprocess(root: Any, *, progress: Progress | None = None,
               embedding: Callable[[EmbeddingProgress], None] | None = None,
               embedder: Embedder | None = None,
               index_factory: Callable[[Workspace, int], IndexWriter] | None = None,
               ) -> PublishResult:
    """``tht workspace preprocess evidence``: build, verify, evaluate and activate a generation.

    Raises :class:`PublishError` when the corpus is not publishable, the gate fails or any step
    fails; the previous generation then stays active.
    """
    say = progress or (lambda _msg: None)
    ws = load_workspace(root)
    index_config(ws)  # an index setting that contradicts itself is refused before any work
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    with publish_lock(ws), open_registry(ws) as registry:
        revision = activated_revision(ws, registry)
        say(f"revision {revision[:12]}: materializing from Git")
        corpus = materialize_corpus(ws, revision)
        require_publishable(corpus)
        evalset = read_evaluation(corpus.evidence_dir)
        timings["validate_s"] = time.perf_counter() - t0

        t = time.perf_counter()
        frags = cut_fragments(ws, corpus.loaded)
        timings["fragments_s"] = time.perf_counter() - t
        say(f"{len(corpus.loaded)} units → {len(frags)} fragments")

        t = time.perf_counter()
        emb, vectors, computed = embed_fragments(ws, frags, embedder, progress=embedding)
        timings["embed_s"] = time.perf_counter() - t
        say(f"embedded {computed} new fragment(s), {len(frags) - computed} from cache")

        index = open_target_index(ws, emb.dim, index_factory)
        try:
            return _publish(ws, registry, index, emb, revision, corpus.loaded, frags, vectors,
                            evalset, computed, timings, say, t0)
        finally:
            index.close()


def _publish(ws: Workspace, registry: RegistryWriter, index: IndexWriter, emb: Embedder,
             revision: str, loaded: list[LoadedUnit], frags: list[tuple[LoadedUnit, Fragment]],
             vectors: Any, evalset: Any, computed: int, timings: dict[str, float],
             say: Progress, t0: float) -> PublishResult:
    candidate = build_candidate(ws, registry, index, emb, revision, loaded, frags, vectors,
                                computed=computed, say=say)
    timings.update(candidate.timings)
    t = time.perf_counter()
    report = evaluate_candidate(ws, registry, index, emb, candidate, loaded, evalset)
    timings["evaluate_s"] = time.perf_counter() - t
    if not report.gate_passed:
        raise gate_failure(report)
    deleted = activate_candidate(ws, registry, index, candidate, report, say=say)
    timings["total_s"] = time.perf_counter() - t0
    return PublishResult(generation=candidate.generation, revision=revision, activated=True,
                         evaluation=report, counts=candidate.counts, timings=timings,
                         retired_points_deleted=deleted)


# --- the stages of preprocess (the CLI above and the Dagster assets call these) ----------------


@dataclass
class PublishedCorpus:
    """The activated revision materialized from Git and validated again."""

    revision: str
    evidence_dir: Path
    report: ValidationReport
    loaded: list[LoadedUnit]


@dataclass
class Candidate:
    """A candidate generation uploaded and verified, not yet evaluated or active."""

    generation: int
    revision: str
    counts: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


def activated_revision(ws: Workspace, registry: RegistryWriter) -> str:
    """The revision to publish; :class:`PublishError` when none is activated."""
    revision = registry.activated_revision(ws.config.workspace_id)
    # every generation read back now: a corrupt registry stops the run before any work
    registry.generations(ws.config.workspace_id)
    if revision is None:
        raise PublishError("no revision is activated for this workspace; run "
                           "`tht workspace activate` first", path=str(ws.root),
                           code="no_activated_revision")
    return revision


def materialize_corpus(ws: Workspace, revision: str) -> PublishedCorpus:
    """Write the revision's tree under the state directory and validate its whole corpus."""
    try:
        evidence_dir = revision_evidence_dir(ws, revision)
    except EvidenceError as exc:  # e.g. a full disk; the partial copy was removed
        raise PublishError(exc.message, code=exc.code, path=exc.path) from None
    report, loaded = validate_corpus(ws, evidence_dir)
    return PublishedCorpus(revision, evidence_dir, report, loaded)


def require_publishable(corpus: PublishedCorpus) -> None:
    """:class:`PublishError` listing every problem unless the corpus is publishable."""
    report = corpus.report
    if report.status.value != "publishable":
        blocking = sort_problems(report.problems)
        raise PublishError(
            f"revision {corpus.revision[:12]} is {report.status.value}: "
            f"{len(blocking)} problem(s) block publication: {_named(blocking)}", blocking)


def cut_fragments(ws: Workspace, loaded: list[LoadedUnit]) -> list[tuple[LoadedUnit, Fragment]]:
    """Every unit's fragments; :class:`PublishError` when an atomic element cannot fit."""
    max_chars = ws.config.embeddings.max_chunk_chars
    frags: list[tuple[LoadedUnit, Fragment]] = []
    problems: list[Problem] = []
    for item in loaded:
        assert item.unit is not None and item.doc is not None
        try:
            for fr in build_fragments(item.unit, item.doc.body, max_chars):
                frags.append((item, fr))
        except AtomicTooLarge as exc:
            problems.append(atomic_problem(f"{ws.config.evidence.root}/{item.rel_path}",
                                           item.unit.id, exc.field, str(exc)))
    if problems:
        raise PublishError(f"atomic elements do not fit in one fragment: "
                           f"{_named(problems)}", problems)
    return frags


def embed_fragments(ws: Workspace, frags: list[tuple[LoadedUnit, Fragment]],
                    embedder: Embedder | None = None, *,
                    progress: Callable[[EmbeddingProgress], None] | None = None,
                    ) -> tuple[Embedder, Any, int]:
    """Dense vectors of the fragments, cached by (model, text): (embedder, vectors, computed);
    ``progress`` hears how far the embedding of the fragments not cached is."""
    try:
        emb = embedder or make_embedder(ws.config.embeddings.model,
                                        max_chunk_chars=ws.config.embeddings.max_chunk_chars,
                                        threads=ws.config.embeddings.threads)
        cache = VectorCache(ws.state_dir / "vectors.sqlite3")
        try:
            vectors, computed = embed_with_cache(emb, [f.text for _, f in frags], cache,
                                                 progress=progress)
        finally:
            cache.close()
    except EvidenceError as exc:
        raise PublishError(f"embedding the fragments failed: {exc}", code=exc.code) from exc
    return emb, vectors, computed


def open_target_index(ws: Workspace, dense_dim: int,
                      index_factory: Callable[[Workspace, int], IndexWriter] | None = None,
                      ) -> IndexWriter:
    """The index to publish into (thoth.yaml's unless ``index_factory`` is given)."""
    try:
        return index_factory(ws, dense_dim) if index_factory else open_index_writer(
            index_config(ws), language=ws.config.language, dense_dim=dense_dim, create=True)
    except EvidenceError as exc:  # e.g. the embedded shard is held by another process
        raise PublishError(f"cannot open the index: {exc}", code=exc.code) from exc


@contextlib.contextmanager
def _compensating(registry: RegistryWriter, index: IndexWriter, wid: str,
                  generation: int) -> Iterator[None]:
    """On any failure: mark the candidate failed, remove its points, re-raise as PublishError.

    The points go only once the registry says ``failed``: when it cannot be written (or the
    generation turned out active), they stay, unreadable without activation, for the next
    run's :func:`recover_interrupted`; deleting the points of a generation the registry may
    call active would lose it.
    """
    try:
        yield
    except BaseException as exc:
        marked = False
        with contextlib.suppress(EvidenceError):
            registry.update_generation(wid, generation, status=GenerationStatus.failed)
            marked = True
        if marked:
            _discard(index, wid, generation)
        if isinstance(exc, EvidenceError) and not isinstance(exc, PublishError):
            raise PublishError(f"generation {generation} failed: {exc}",
                               code=exc.code) from exc
        raise


def build_candidate(ws: Workspace, registry: RegistryWriter, index: IndexWriter, emb: Embedder,
                    revision: str, loaded: list[LoadedUnit],
                    frags: list[tuple[LoadedUnit, Fragment]], vectors: Any, *, computed: int,
                    say: Progress) -> Candidate:
    """Record a candidate generation, upload its points beside the active ones and verify them."""
    with publish_lock(ws):
        return _build_candidate(ws, registry, index, emb, revision, loaded, frags, vectors,
                                computed=computed, say=say)


def _build_candidate(ws: Workspace, registry: RegistryWriter, index: IndexWriter, emb: Embedder,
                     revision: str, loaded: list[LoadedUnit],
                     frags: list[tuple[LoadedUnit, Fragment]], vectors: Any, *, computed: int,
                     say: Progress) -> Candidate:
    wid = ws.config.workspace_id
    try:
        index.ensure_schema(dense_dim=emb.dim)
    except EvidenceError as exc:  # nothing was changed; no generation was recorded
        raise PublishError(f"the index cannot hold Evidence: {exc}", code=exc.code) from exc
    recover_interrupted(registry, index, wid, say=say)
    icfg = ws.config.index
    bm25 = bm25_settings(ws.config.language, [fr.text for _, fr in frags],
                         avg_len=icfg.bm25_avg_len, stopwords=icfg.bm25_stopwords)
    config = {"embedder": emb.model_id, "dim": emb.dim,
              "max_chunk_chars": ws.config.embeddings.max_chunk_chars,
              "rrf_k": icfg.rrf_k, "rrf_weights": [icfg.rrf_weights.dense, icfg.rrf_weights.bm25],
              "prefetch_limit": icfg.prefetch_limit,
              "bm25_language": ws.config.language, "bm25": bm25.as_dict(),
              "engine": icfg.engine}
    gen: Generation = registry.new_generation(wid, revision, config)
    say(f"candidate generation {gen.number}")
    timings: dict[str, float] = {}
    with _compensating(registry, index, wid, gen.number):
        t = time.perf_counter()
        points = [IndexPoint(id=point_id(wid, gen.number, item.unit.id, fr.ordinal),
                             dense=vectors[i], text=fr.text,
                             payload=fragment_payload(ws, revision, gen.number, item, fr))
                  for i, (item, fr) in enumerate(frags) if item.unit is not None]
        _upload(index, points, bm25)
        timings["upload_s"] = time.perf_counter() - t
        say(f"uploaded {len(points)} point(s)")
        built = index.build_search_index(points=len(points))  # HNSW, for a large generation
        if built is not None:
            timings["index_build_s"] = built
        _step("after_upload")

        t = time.perf_counter()
        counts = verify_generation(index, wid, gen.number, revision, points, loaded)
        counts["fragments_embedded"] = computed
        timings["verify_s"] = time.perf_counter() - t
        say("verified counts, ids and readability")
    return Candidate(gen.number, revision, counts, timings)


def evaluate_candidate(ws: Workspace, registry: RegistryWriter, index: IndexWriter, emb: Embedder,
                       candidate: Candidate, loaded: list[LoadedUnit],
                       evalset: Any) -> EvaluationReport:
    """Evaluate the candidate and record the report; a failed gate marks it failed and removes
    its points (the active generation is left alone)."""
    wid = ws.config.workspace_id
    number = candidate.generation
    with publish_lock(ws), _compensating(registry, index, wid, number):
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
            _discard(index, wid, number)
    _step("after_evaluation")
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
        with _compensating(registry, index, wid, candidate.generation):
            try:
                registry.activate_generation(wid, candidate.generation)
            except RegistryError:
                # the write may have committed and only its answer been lost (a connection
                # dropped after COMMIT): then the generation is active and must be kept
                if not _is_active(registry, wid, candidate.generation):
                    raise
            say(f"generation {candidate.generation} is active")
        _step("after_activation")
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


class GateFailed(PublishError):
    code = "evaluation_gate_failed"

    def __init__(self, report: EvaluationReport, message: str) -> None:
        super().__init__(message)
        self.report = report


def verify_generation(index: IndexWriter, wid: str, generation: int, revision: str,
                      points: list[IndexPoint], loaded: list[LoadedUnit]) -> dict[str, Any]:
    """Counts per unit and fragment, ids, readability and agreement with the corpus."""
    match = {"workspace_id": wid, "vector_generation": generation, "record_kind": RECORD_KIND}
    expected_ids = sorted(p.id for p in points)
    total = index.count(match)
    if total != len(points):
        raise PublishError(f"verification failed: {total} points in generation {generation}, "
                           f"expected {len(points)}", code="verification_failed")
    _step("during_verification")
    if index.scroll_ids(match) != expected_ids:
        raise PublishError("verification failed: point ids differ from the fragments built",
                           code="verification_failed")
    units = {item.unit.id for item in loaded if item.unit}
    point_units = {p.payload["evidence_id"] for p in points}
    if units != point_units:
        raise PublishError("verification failed: units without points: "
                           f"{sorted(units - point_units)[:5]}", code="verification_failed")
    if points:
        probe = points[0]
        hits = index.query(dense=probe.dense, text=probe.text,
                           match={**match, "workspace_revision": revision,
                                  "evidence_id": probe.payload["evidence_id"]},
                           limit=50, mode="fused")
        if probe.id not in {h.id for h in hits}:
            raise PublishError("verification failed: a fragment cannot be read back",
                               code="verification_failed")
    per_kind: dict[str, int] = {}
    for item in loaded:
        if item.unit:
            per_kind[item.unit.kind.value] = per_kind.get(item.unit.kind.value, 0) + 1
    return {"units": len(units), "fragments": len(points), "units_per_kind": per_kind}


def _upload(index: IndexWriter, points: list[IndexPoint], bm25: Bm25Settings) -> None:
    """All the points in one call (the embedded engine flushes once per call, ~0.2 s each),
    BM25 tokenized with the generation's settings.

    Under fault injection at ``upload_batch`` the first half goes in as a batch of its own and
    the process dies before the second: a partial candidate, as a crash mid-upload leaves it.
    """
    if os.environ.get(FAULT_ENV) == "upload_batch" and len(points) > 1:
        index.upsert(points[: len(points) // 2], bm25=bm25)
        _step("upload_batch")
    index.upsert(points, bm25=bm25)


def recover_interrupted(registry: RegistryWriter, index: IndexWriter, wid: str, *,
                        say: Progress) -> list[int]:
    """Clean up after a publisher that died (kill -9, power loss); call with the publish lock.

    A generation still ``candidate`` belongs to no running publisher (the lock says none is
    running), so it is marked ``failed``; then the points of every failed generation and of
    every generation retention no longer keeps are deleted, in one filtered delete, run only
    when a count finds some (there are none unless a run died between its registry update and
    its delete, or a best-effort removal failed). Returns the candidates marked failed.
    """
    recovered: list[int] = []
    dead: list[int] = []
    for g in registry.generations(wid):
        if g.status is GenerationStatus.candidate:
            registry.update_generation(wid, g.number, status=GenerationStatus.failed)
            recovered.append(g.number)
            dead.append(g.number)
        elif g.status is GenerationStatus.failed or (
                g.status is GenerationStatus.retired
                and not g.counts.get("points_retained", True)):
            dead.append(g.number)
    match: dict[str, Any] = {"workspace_id": wid, "record_kind": RECORD_KIND,
                             "vector_generation": sorted(dead)}
    try:
        if dead and index.count(match):  # a count is cheap; a delete flushes the shard
            index.delete(match)
    except EvidenceError as exc:
        raise PublishError(f"cannot remove the points of interrupted or failed generations: "
                           f"{exc}", code=exc.code) from exc
    if recovered:
        say(f"recovered: generation(s) {', '.join(map(str, recovered))} of an interrupted run "
            "marked failed and their points removed")
    return recovered


def _discard(index: IndexWriter, wid: str, generation: int) -> None:
    """Best-effort removal of a candidate's points (unreadable anyway without activation)."""
    # compensation must never hide the original failure
    with contextlib.suppress(Exception):
        index.delete({"workspace_id": wid, "vector_generation": generation,
                      "record_kind": RECORD_KIND})


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
        _step("during_retention")
        index.delete({"workspace_id": wid, "vector_generation": g.number,
                      "record_kind": RECORD_KIND})
        deleted.append(g.number)
    return deleted
