"""The candidate generation (spec §8, §13.2): recorded in the registry, its points uploaded
beside the active generation's and verified (counts, ids, readability, agreement with the
corpus); any failure marks it failed and removes its points. Also the clean-up after a publisher
that died (:func:`recover_interrupted`)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from evidence_pipeline.formats.fragments import Fragment, bm25_settings
from evidence_pipeline.publishing.guard import (
    FAULT_ENV,
    Progress,
    PublishError,
    fault_step,
    publish_lock,
)
from evidence_pipeline.publishing.index_writer import IndexPoint, IndexWriter
from evidence_pipeline.publishing.intake import (
    cut_fragments,
    embed_fragments,
    materialize_corpus,
    require_publishable,
)
from evidence_pipeline.publishing.progress import PhaseReporter, phase_reporter
from evidence_pipeline.publishing.registry_writer import RegistryWriter
from evidence_pipeline.validation.corpus import LoadedUnit
from evidence_runtime.embeddings import Embedder
from evidence_runtime.errors import EvidenceError
from evidence_runtime.index import Bm25Settings
from evidence_runtime.registry import Generation, GenerationStatus
from evidence_runtime.search import RECORD_KIND, RESULT_FIELDS, generation_bm25
from evidence_runtime.workspace import Workspace

POINT_NAMESPACE = uuid.UUID("6f1c1a52-3d0e-5b8e-9a57-4d2b0e7c9a10")


@dataclass
class Candidate:
    """A candidate generation uploaded and verified, not yet evaluated or active."""

    generation: int
    revision: str
    counts: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


def point_id(workspace_id: str, generation: int, evidence_id: str, ordinal: int) -> str:
    """Point ids derive from identity: (workspace, generation, evidence id, fragment ordinal)."""
    return str(uuid.uuid5(POINT_NAMESPACE, f"{workspace_id}\0{generation}\0{evidence_id}\0"
                                           f"{ordinal}"))


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


def index_points(ws: Workspace, revision: str, generation: int,
                 frags: list[tuple[LoadedUnit, Fragment]], vectors: Any) -> list[IndexPoint]:
    """The points of ``generation`` for the fragments ``frags`` of ``revision`` (``vectors[i]``
    the dense vector of ``frags[i]``): ids from identity, the fragment's text for BM25, the
    payload of :func:`fragment_payload`."""
    wid = ws.config.workspace_id
    return [IndexPoint(id=point_id(wid, generation, item.unit.id, fr.ordinal),
                       dense=vectors[i], text=fr.text,
                       payload=fragment_payload(ws, revision, generation, item, fr))
            for i, (item, fr) in enumerate(frags) if item.unit is not None]


@contextlib.contextmanager
def compensating(registry: RegistryWriter, index: IndexWriter, wid: str,
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
            discard_points(index, wid, generation)
        if isinstance(exc, EvidenceError) and not isinstance(exc, PublishError):
            raise PublishError(f"generation {generation} failed: {exc}",
                               code=exc.code) from exc
        raise


def build_candidate(ws: Workspace, registry: RegistryWriter, index: IndexWriter, emb: Embedder,
                    revision: str, loaded: list[LoadedUnit],
                    frags: list[tuple[LoadedUnit, Fragment]], vectors: Any, *, computed: int,
                    say: Progress, progress: Callable[[Any], None] | None = None) -> Candidate:
    """Record a candidate generation, upload its points beside the active ones and verify them;
    ``progress`` hears how many points are uploaded (``PhaseProgress`` ``uploading``, on the
    embedding's callback)."""
    with publish_lock(ws):
        return _build_candidate(ws, registry, index, emb, revision, loaded, frags, vectors,
                                computed=computed, say=say, progress=progress)


def _build_candidate(ws: Workspace, registry: RegistryWriter, index: IndexWriter, emb: Embedder,
                     revision: str, loaded: list[LoadedUnit],
                     frags: list[tuple[LoadedUnit, Fragment]], vectors: Any, *, computed: int,
                     say: Progress, progress: Callable[[Any], None] | None = None) -> Candidate:
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
              "fusion": icfg.fusion, "dense_weight": icfg.dense_weight,
              "weak_dense_weight": icfg.weak_dense_weight,
              "bm25_strength": list(icfg.bm25_strength),
              "rrf_k": icfg.rrf_k, "rrf_weights": [icfg.rrf_weights.dense, icfg.rrf_weights.bm25],
              "prefetch_limit": icfg.prefetch_limit,
              "bm25_language": ws.config.language, "bm25": bm25.as_dict(),
              "engine": icfg.engine}
    gen: Generation = registry.new_generation(wid, revision, config)
    say(f"candidate generation {gen.number}")
    timings: dict[str, float] = {}
    with compensating(registry, index, wid, gen.number):
        t = time.perf_counter()
        points = index_points(ws, revision, gen.number, frags, vectors)
        _upload(index, points, bm25, phase_reporter(progress, "uploading", "point(s)"))
        timings["upload_s"] = time.perf_counter() - t
        say(f"uploaded {len(points)} point(s)")
        built = index.build_search_index(points=len(points), announce=say)  # HNSW when large
        if built is not None:
            timings["index_build_s"] = built
            say(f"search index built in {built:.1f} s")
        fault_step("after_upload")

        t = time.perf_counter()
        counts = verify_generation(index, wid, gen.number, revision, points, loaded)
        counts["fragments_embedded"] = computed
        timings["verify_s"] = time.perf_counter() - t
        say("verified counts, ids and readability")
    return Candidate(gen.number, revision, counts, timings)


def verify_generation(index: IndexWriter, wid: str, generation: int, revision: str,
                      points: list[IndexPoint], loaded: list[LoadedUnit]) -> dict[str, Any]:
    """Counts per unit and fragment, ids, readability and agreement with the corpus."""
    match = {"workspace_id": wid, "vector_generation": generation, "record_kind": RECORD_KIND}
    expected_ids = sorted(p.id for p in points)
    total = index.count(match)
    if total != len(points):
        raise PublishError(f"verification failed: {total} points in generation {generation}, "
                           f"expected {len(points)}", code="verification_failed")
    fault_step("during_verification")
    whole = index.point_counts(match, payload_fields=RESULT_FIELDS)
    if min(whole.dense, whole.bm25, whole.payload) < total:
        raise PublishError(f"verification failed: of {total} points, {whole.dense} hold the "
                           f"dense vector, {whole.bm25} the BM25 vector and {whole.payload} "
                           "their payload fields", code="verification_failed")
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
    # the counts per named vector, which the searcher and `tht workspace check` verify
    return {"units": len(units), "fragments": len(points), "units_per_kind": per_kind,
            "vectors": {"dense": whole.dense, "bm25": whole.bm25}}


# points per upsert call when progress is reported: each call flushes the embedded shard once
# (~0.2 s), so a corpus of a few thousand points still goes in one call
UPLOAD_CHUNK = 4096
UPLOAD_STEPS = 20  # at most this many calls (and updates) for a very large generation


def _upload(index: IndexWriter, points: list[IndexPoint], bm25: Bm25Settings,
            progress: PhaseReporter | None = None) -> None:
    """The points in as few calls as possible (the embedded engine flushes once per call,
    ~0.2 s each), BM25 tokenized with the generation's settings; with ``progress``, a large
    generation goes in up to :data:`UPLOAD_STEPS` calls, each reported when done.

    Under fault injection at ``upload_batch`` the first half goes in as a batch of its own and
    the process dies before the second: a partial candidate, as a crash mid-upload leaves it.
    """
    if os.environ.get(FAULT_ENV) == "upload_batch" and len(points) > 1:
        index.upsert(points[: len(points) // 2], bm25=bm25)
        fault_step("upload_batch")
    if progress is None:
        index.upsert(points, bm25=bm25)
        return
    chunk = max(UPLOAD_CHUNK, -(-len(points) // UPLOAD_STEPS))
    progress(0, len(points))
    for start in range(0, len(points), chunk):
        index.upsert(points[start:start + chunk], bm25=bm25)
        progress(min(start + chunk, len(points)), len(points))


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


def discard_points(index: IndexWriter, wid: str, generation: int) -> None:
    """Best-effort removal of a candidate's points (unreadable anyway without activation)."""
    # compensation must never hide the original failure
    with contextlib.suppress(Exception):
        index.delete({"workspace_id": wid, "vector_generation": generation,
                      "record_kind": RECORD_KIND})


@dataclass
class GenerationPoints:
    """A published generation's points as its revision gives them again."""

    points: list[IndexPoint]
    loaded: list[LoadedUnit]
    embedded: int  # fragments missing from the vector cache, embedded again


def generation_points(ws: Workspace, generation: Generation, *,
                      embedder: Embedder | None = None) -> GenerationPoints:
    """The points of ``generation`` rebuilt from its revision in Git and the vector cache: the
    same ids, vectors, BM25 texts and payloads as published (the index is derived data). A
    vector the cache lost is embedded again (counted in ``embedded``); a generation embedded
    with another model than thoth.yaml names now is :class:`PublishError`."""
    model = generation.config.get("embedder")
    corpus = materialize_corpus(ws, generation.revision)
    require_publishable(corpus)
    recorded = generation.config.get("max_chunk_chars")  # None: thoth.yaml's
    max_chars = recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else None
    frags = cut_fragments(ws, corpus.loaded, max_chars=max_chars)
    emb, vectors, computed = embed_fragments(ws, frags, embedder)
    if model is not None and emb.model_id != model:
        raise PublishError(f"generation {generation.number} was embedded with {model}, and "
                           f"thoth.yaml now names {emb.model_id}: publish the activated "
                           "revision again instead", code="publish_failed")
    points = index_points(ws, generation.revision, generation.number, frags, vectors)
    return GenerationPoints(points, corpus.loaded, computed)


def rebuild_generation(ws: Workspace, registry: RegistryWriter, index: IndexWriter,
                       generation: Generation, *, embedder: Embedder | None = None,
                       ) -> dict[str, Any]:
    """Write ``generation``'s points again (:func:`generation_points`) over what the index
    holds of them, and verify them as a publication does; its status and the active pointer
    are left alone. :class:`PublishError` when the revision no longer gives the fragments the
    registry recorded (nothing is written then). Returns the verified counts and ``embedded``."""
    rebuilt = generation_points(ws, generation, embedder=embedder)
    expected = generation.counts.get("fragments")
    if isinstance(expected, int) and expected != len(rebuilt.points):
        raise PublishError(f"generation {generation.number}: its revision gives "
                           f"{len(rebuilt.points)} fragment(s), the registry recorded "
                           f"{expected}; publish the activated revision again instead",
                           code="verification_failed")
    wid = ws.config.workspace_id
    with publish_lock(ws):
        index.delete({"workspace_id": wid, "vector_generation": generation.number,
                      "record_kind": RECORD_KIND})
        index.upsert(rebuilt.points, bm25=generation_bm25(generation, ws.config.language))
        counts = verify_generation(index, wid, generation.number, generation.revision,
                                   rebuilt.points, rebuilt.loaded)
        if generation.counts.get("vectors") != counts["vectors"]:
            registry.update_generation(wid, generation.number,
                                       counts={**generation.counts, "vectors": counts["vectors"]})
    return {**counts, "embedded": rebuilt.embedded}
