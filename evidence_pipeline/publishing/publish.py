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

The stages live in modules of their own, each doing one job: :mod:`.guard` (the error type, the
publish lock, fault injection), :mod:`.activation` (``activate``, rollback), :mod:`.intake`
(revision → validated corpus → fragments → vectors), :mod:`.candidate` (the candidate generation
uploaded and verified; crash recovery) and :mod:`.gate` (evaluation, activation, retention).
This module runs them in order (:func:`preprocess`), reports the result, and re-exports what the
CLI, the Dagster assets and the tests import.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evidence_pipeline.formats.evalset import read_evaluation
from evidence_pipeline.formats.fragments import Fragment
from evidence_pipeline.gitrepo import require_clean, resolve_revision
from evidence_pipeline.publishing.activation import ActivationResult, activate
from evidence_pipeline.publishing.candidate import (
    POINT_NAMESPACE,
    Candidate,
    build_candidate,
    fragment_payload,
    point_id,
    recover_interrupted,
    verify_generation,
)
from evidence_pipeline.publishing.embedding_cache import EmbeddingProgress
from evidence_pipeline.publishing.evaluate import EvaluationReport
from evidence_pipeline.publishing.gate import (
    GateFailed,
    activate_candidate,
    apply_retention,
    evaluate_candidate,
    gate_failure,
)
from evidence_pipeline.publishing.guard import (
    FAULT_ENV,
    Progress,
    PublishBusyError,
    PublishError,
    open_registry,
    publish_lock,
)
from evidence_pipeline.publishing.index_writer import IndexWriter
from evidence_pipeline.publishing.intake import (
    PublishedCorpus,
    activated_revision,
    cut_fragments,
    embed_fragments,
    materialize_corpus,
    open_target_index,
    require_publishable,
)
from evidence_pipeline.publishing.registry_writer import RegistryWriter
from evidence_pipeline.validation.corpus import LoadedUnit
from evidence_runtime.embeddings import Embedder
from evidence_runtime.search import index_config
from evidence_runtime.workspace import Workspace, load_workspace

__all__ = [
    "FAULT_ENV",
    "POINT_NAMESPACE",
    "ActivationResult",
    "Candidate",
    "GateFailed",
    "Progress",
    "PublishBusyError",
    "PublishError",
    "PublishResult",
    "PublishedCorpus",
    "activate",
    "activate_candidate",
    "activated_revision",
    "apply_retention",
    "build_candidate",
    "cut_fragments",
    "embed_fragments",
    "evaluate_candidate",
    "fragment_payload",
    "gate_failure",
    "materialize_corpus",
    "open_registry",
    "open_target_index",
    "point_id",
    "preprocess",
    "publish_lock",
    "publish_revision",
    "recover_interrupted",
    "require_publishable",
    "verify_generation",
]


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


def preprocess(root: Any, *, progress: Progress | None = None,
               embedding: Callable[[EmbeddingProgress], None] | None = None,
               embedder: Embedder | None = None,
               index_factory: Callable[[Workspace, int], IndexWriter] | None = None,
               ) -> PublishResult:
    """``tht workspace preprocess evidence``: build, verify, evaluate and activate a generation.

    Raises :class:`PublishError` when the corpus is not publishable, the gate fails or any step
    fails; the previous generation then stays active. ``progress`` hears a line per step;
    ``embedding`` hears how far each slow phase is: ``EmbeddingProgress`` while fragments are
    embedded, and its subclass ``PhaseProgress`` while curated files are validated, points
    uploaded and queries evaluated.
    """
    ws = load_workspace(root)
    index_config(ws)  # an index setting that contradicts itself is refused before any work
    with publish_lock(ws), open_registry(ws) as registry:
        revision = activated_revision(ws, registry)
        return _run(ws, registry, revision, None, progress=progress, embedding=embedding,
                    embedder=embedder, index_factory=index_factory)


def publish_revision(root: Workspace | Path | str, *, revision: str | None = None,
                     progress: Progress | None = None,
                     embedding: Callable[[EmbeddingProgress], None] | None = None,
                     embedder: Embedder | None = None,
                     index_factory: Callable[[Workspace, int], IndexWriter] | None = None,
                     ) -> PublishResult:
    """``tht workspace publish``: publish ``revision`` (default: HEAD of a clean tree) without a
    maintenance window.

    The candidate generation of the revision is built, verified and evaluated while the current
    generation keeps serving the activated revision; then the activated revision and the active
    generation move together in one registry transaction, compare-and-set on both pointers as
    read before the build (``RegistryWriter.activate_generation_and_revision``). Search sees the
    old pair or the new pair, never a mismatch. Any failure — the corpus not publishable, the
    gate, the upload, a registry that changed meanwhile — raises :class:`PublishError` (a
    failed gate: :class:`GateFailed`) and changes neither pointer: the previous revision is
    still served. ``activate`` + ``preprocess`` keep working as spec §13.2 describes.
    """
    ws = root if isinstance(root, Workspace) else load_workspace(root)
    index_config(ws)  # an index setting that contradicts itself is refused before any work
    if revision is None:
        require_clean(ws.root, (), what="publish HEAD")
        sha = resolve_revision(ws.root, "HEAD")
    else:
        sha = resolve_revision(ws.root, revision)
    with publish_lock(ws), open_registry(ws) as registry:
        serving_revision, serving = registry.active_state(ws.config.workspace_id)
        expected = (serving_revision, None if serving is None else serving.number)
        return _run(ws, registry, sha, expected, progress=progress, embedding=embedding,
                    embedder=embedder, index_factory=index_factory)


def _run(ws: Workspace, registry: RegistryWriter, revision: str,
         expected: tuple[str | None, int | None] | None, *, progress: Progress | None,
         embedding: Callable[[EmbeddingProgress], None] | None, embedder: Embedder | None,
         index_factory: Callable[[Workspace, int], IndexWriter] | None) -> PublishResult:
    """The stages of a publication of ``revision``, under the publish lock; ``expected`` as
    :func:`activate_candidate` takes it (None: the revision is already activated)."""
    say = progress or (lambda _msg: None)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    # every generation read back now: a corrupt registry stops the run before any work
    registry.generations(ws.config.workspace_id)
    say(f"revision {revision[:12]}: materializing from Git")
    corpus = materialize_corpus(ws, revision, progress=embedding)
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

    index = open_target_index(ws, emb.dim, index_factory, points=len(frags))
    try:
        return _publish(ws, registry, index, emb, revision, corpus.loaded, frags, vectors,
                        evalset, computed, timings, say, t0, embedding, expected)
    finally:
        index.close()


def _publish(ws: Workspace, registry: RegistryWriter, index: IndexWriter, emb: Embedder,
             revision: str, loaded: list[LoadedUnit], frags: list[tuple[LoadedUnit, Fragment]],
             vectors: Any, evalset: Any, computed: int, timings: dict[str, float],
             say: Progress, t0: float,
             progress: Callable[[EmbeddingProgress], None] | None,
             expected: tuple[str | None, int | None] | None) -> PublishResult:
    candidate = build_candidate(ws, registry, index, emb, revision, loaded, frags, vectors,
                                computed=computed, say=say, progress=progress)
    timings.update(candidate.timings)
    t = time.perf_counter()
    report = evaluate_candidate(ws, registry, index, emb, candidate, loaded, evalset,
                                progress=progress)
    timings["evaluate_s"] = time.perf_counter() - t
    if not report.gate_passed:
        raise gate_failure(report)
    deleted = activate_candidate(ws, registry, index, candidate, report, say=say,
                                 expected=expected)
    timings["total_s"] = time.perf_counter() - t0
    return PublishResult(generation=candidate.generation, revision=revision, activated=True,
                         evaluation=report, counts=candidate.counts, timings=timings,
                         retired_points_deleted=deleted)
