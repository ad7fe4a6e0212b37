"""The first stages of a publication: the activated revision materialized from Git, its whole
corpus validated again (spec §7.2, §8), cut into fragments and embedded (vectors cached by model
and text)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evidence_pipeline.formats.fragments import AtomicTooLarge, Fragment, build_fragments
from evidence_pipeline.publishing.embedding_cache import (
    EmbeddingProgress,
    VectorCache,
    embed_with_cache,
)
from evidence_pipeline.publishing.evaluate import revision_evidence_dir
from evidence_pipeline.publishing.guard import PublishError, named_problems
from evidence_pipeline.publishing.index_writer import (
    IndexWriter,
    check_publish_space,
    open_index_writer,
)
from evidence_pipeline.publishing.progress import phase_reporter
from evidence_pipeline.publishing.registry_writer import RegistryWriter
from evidence_pipeline.validation.corpus import LoadedUnit
from evidence_pipeline.validation.problems import Problem, ValidationReport, sort_problems
from evidence_pipeline.validation.validator import atomic_problem, validate_corpus
from evidence_runtime.embeddings import Embedder, make_embedder
from evidence_runtime.errors import EvidenceError
from evidence_runtime.search import index_config
from evidence_runtime.workspace import Workspace


@dataclass
class PublishedCorpus:
    """The activated revision materialized from Git and validated again."""

    revision: str
    evidence_dir: Path
    report: ValidationReport
    loaded: list[LoadedUnit]


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


def materialize_corpus(ws: Workspace, revision: str, *,
                       progress: Callable[[Any], None] | None = None) -> PublishedCorpus:
    """Write the revision's tree under the state directory and validate its whole corpus;
    ``progress`` hears how many curated files are validated (``PhaseProgress``
    ``validating``, on the embedding's callback)."""
    try:
        evidence_dir = revision_evidence_dir(ws, revision)
    except EvidenceError as exc:  # e.g. a full disk; the partial copy was removed
        raise PublishError(exc.message, code=exc.code, path=exc.path) from None
    report, loaded = validate_corpus(
        ws, evidence_dir, progress=phase_reporter(progress, "validating", "curated file(s)"))
    return PublishedCorpus(revision, evidence_dir, report, loaded)


def require_publishable(corpus: PublishedCorpus) -> None:
    """:class:`PublishError` listing every problem unless the corpus is publishable."""
    report = corpus.report
    if report.status.value != "publishable":
        blocking = sort_problems(report.problems)
        raise PublishError(
            f"revision {corpus.revision[:12]} is {report.status.value}: "
            f"{len(blocking)} problem(s) block publication: {named_problems(blocking)}", blocking)


def cut_fragments(ws: Workspace, loaded: list[LoadedUnit], *, max_chars: int | None = None,
                  ) -> list[tuple[LoadedUnit, Fragment]]:
    """Every unit's fragments, at most ``max_chars`` each (default: thoth.yaml's
    ``max_chunk_chars``); :class:`PublishError` when an atomic element cannot fit."""
    if max_chars is None:
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
                           f"{named_problems(problems)}", problems)
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
        cache = VectorCache.in_state_dir(ws.state_dir)
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
                      *, points: int = 0) -> IndexWriter:
    """The index to publish into (thoth.yaml's unless ``index_factory`` is given); on the
    embedded engine, ``disk_full`` before anything is written when its filesystem has no room
    for ``points`` more points (see :func:`check_publish_space`)."""
    try:
        cfg = index_config(ws)
        if cfg.engine == "edge":
            check_publish_space(cfg.edge_path(), points)
        return index_factory(ws, dense_dim) if index_factory else open_index_writer(
            cfg, language=ws.config.language, dense_dim=dense_dim, create=True)
    except EvidenceError as exc:  # e.g. the embedded shard is held by another process
        raise PublishError(f"cannot open the index: {exc}", code=exc.code) from exc
