"""Publishing assets: the activated revision becomes an evaluated, active generation.

Each asset is one stage of ``tht workspace preprocess evidence`` and calls the same function:
validation and the evaluation gate are blocking asset checks, so fragments are never cut from
an unpublishable corpus and ``active_generation`` never runs after a failed gate (the previous
generation stays active). Each step opens and closes the index itself: an embedded Qdrant Edge
shard is held by one process at a time.
"""

import contextlib
from dataclasses import dataclass
from typing import Any

import dagster as dg

from evidence_pipeline.orchestration.authoring import curated_corpus, validation_result
from evidence_pipeline.orchestration.metadata import (
    corpus_metadata,
    evaluation_metadata,
    misses_metadata,
)
from evidence_pipeline.orchestration.operations import refusals
from evidence_pipeline.orchestration.progress import tell
from evidence_pipeline.orchestration.resources import (
    EmbedderResource,
    IndexResource,
    WorkspaceResource,
)
from evidence_pipeline.publishing.evalset import read_evaluation
from evidence_pipeline.publishing.evaluate import EvaluationReport
from evidence_pipeline.publishing.fragments import Fragment
from evidence_pipeline.publishing.index_writer import IndexWriter
from evidence_pipeline.publishing.publish import (
    Candidate,
    PublishedCorpus,
    PublishResult,
    activate_candidate,
    activated_revision,
    build_candidate,
    cut_fragments,
    embed_fragments,
    evaluate_candidate,
    gate_failure,
    materialize_corpus,
    open_registry,
    open_target_index,
    require_publishable,
)
from evidence_pipeline.validation.corpus import LoadedUnit
from evidence_runtime.workspace import Workspace

GROUP = "publishing"

Fragments = list[tuple[LoadedUnit, Fragment]]


@dataclass
class FragmentVectors:
    """Dense vectors of the fragments, in fragment order."""

    vectors: Any
    computed: int  # embedded now; the others came from the vector cache
    model_id: str


def _index(ws: Workspace, index: IndexResource, dense_dim: int
           ) -> contextlib.closing[IndexWriter]:
    """The index resource opened for one step (closed at the end of it)."""
    return contextlib.closing(open_target_index(
        ws, dense_dim, lambda w, dim: index.open(w, dense_dim=dim)))


@dg.asset(group_name=GROUP, deps=[curated_corpus], kinds={"git"})
@refusals
def published_corpus(context: dg.AssetExecutionContext,
                     workspace: WorkspaceResource) -> dg.Output[PublishedCorpus]:
    """The activated revision materialized from Git and its whole corpus validated again."""
    ws = workspace.load()
    with open_registry(ws) as registry:
        revision = activated_revision(ws, registry)
    tell(context, f"revision {revision[:12]}: materializing from Git")
    corpus = materialize_corpus(ws, revision)
    return dg.Output(corpus, metadata={"revision": revision,
                                       **corpus_metadata(corpus.report, corpus.loaded)})


@dg.asset_check(asset=published_corpus, blocking=True)
def publishable(published_corpus: PublishedCorpus) -> dg.AssetCheckResult:
    """The revision is publishable: no error, no review item, no orphan (blocks publishing)."""
    return validation_result(published_corpus.report, review_blocks=True)


@dg.asset(group_name=GROUP)
@refusals
def evidence_fragments(context: dg.AssetExecutionContext, workspace: WorkspaceResource,
                       published_corpus: PublishedCorpus) -> dg.Output[Fragments]:
    """Every unit cut into fragments no longer than max_chunk_chars (atomic elements whole)."""
    ws = workspace.load()
    frags = cut_fragments(ws, published_corpus.loaded)
    tell(context, f"{len(published_corpus.loaded)} units → {len(frags)} fragments")
    longest = max((len(f.text) for _, f in frags), default=0)
    return dg.Output(frags, metadata={
        "fragments": dg.MetadataValue.int(len(frags)),
        "units": dg.MetadataValue.int(len(published_corpus.loaded)),
        "longest_fragment_chars": dg.MetadataValue.int(longest),
        "max_chunk_chars": dg.MetadataValue.int(ws.config.embeddings.max_chunk_chars)})


@dg.asset(group_name=GROUP, kinds={"numpy"})
@refusals
def fragment_embeddings(context: dg.AssetExecutionContext, workspace: WorkspaceResource,
                        embedder: EmbedderResource,
                        evidence_fragments: Fragments) -> dg.Output[FragmentVectors]:
    """Dense vectors of the fragments; a fragment already embedded comes from the cache."""
    ws = workspace.load()
    emb, vectors, computed = embed_fragments(ws, evidence_fragments, embedder.make(ws))
    tell(context, f"embedded {computed} new fragment(s), "
                  f"{len(evidence_fragments) - computed} from cache")
    return dg.Output(FragmentVectors(vectors, computed, emb.model_id), metadata={
        "embedded": dg.MetadataValue.int(computed),
        "from_cache": dg.MetadataValue.int(len(evidence_fragments) - computed),
        "model": emb.model_id, "dim": dg.MetadataValue.int(emb.dim)})


@dg.asset(group_name=GROUP, kinds={"qdrant"})
@refusals
def candidate_generation(context: dg.AssetExecutionContext, workspace: WorkspaceResource,
                         index: IndexResource, embedder: EmbedderResource,
                         published_corpus: PublishedCorpus, evidence_fragments: Fragments,
                         fragment_embeddings: FragmentVectors) -> dg.Output[Candidate]:
    """A new generation uploaded beside the active one and verified (not yet visible)."""
    ws = workspace.load()
    require_publishable(published_corpus)  # also when this asset runs on its own
    emb = embedder.make(ws)
    with open_registry(ws) as registry, _index(ws, index, emb.dim) as idx:
        candidate = build_candidate(ws, registry, idx, emb, published_corpus.revision,
                                    published_corpus.loaded, evidence_fragments,
                                    fragment_embeddings.vectors,
                                    computed=fragment_embeddings.computed,
                                    say=lambda m: tell(context, m))
    counts = candidate.counts
    return dg.Output(candidate, metadata={
        "generation": dg.MetadataValue.int(candidate.generation),
        "revision": candidate.revision,
        "units": dg.MetadataValue.int(counts["units"]),
        "fragments": dg.MetadataValue.int(counts["fragments"]),
        "fragments_embedded": dg.MetadataValue.int(counts["fragments_embedded"]),
        "units_per_kind": dg.MetadataValue.json(counts.get("units_per_kind", {}))})


@dg.asset(group_name=GROUP)
@refusals
def generation_evaluation(context: dg.AssetExecutionContext, workspace: WorkspaceResource,
                          index: IndexResource, embedder: EmbedderResource,
                          published_corpus: PublishedCorpus,
                          candidate_generation: Candidate) -> dg.Output[EvaluationReport]:
    """evaluation.yaml against the candidate: hit@5, hit@10 and dense/BM25/fused ranks."""
    ws = workspace.load()
    evalset = read_evaluation(published_corpus.evidence_dir)
    emb = embedder.make(ws)
    with open_registry(ws) as registry, _index(ws, index, emb.dim) as idx:
        report = evaluate_candidate(ws, registry, idx, emb, candidate_generation,
                                    published_corpus.loaded, evalset)
    s = report.summary
    context.log.info(f"evaluation of generation {report.generation}: hit@5 {s.hit_at_5}/"
                     f"{s.queries}, hit@10 {s.hit_at_10}/{s.queries}, gate "
                     f"{'passed' if report.gate_passed else 'failed'}")
    return dg.Output(report, metadata=evaluation_metadata(report))


@dg.asset_check(asset=generation_evaluation, blocking=True)
def evaluation_gate(generation_evaluation: EvaluationReport) -> dg.AssetCheckResult:
    """Every query finds an expected unit in the fused top 10 (blocks activation)."""
    report = generation_evaluation
    s = report.summary
    metadata: dict[str, Any] = {
        "generation": dg.MetadataValue.int(report.generation),
        "hit@5": dg.MetadataValue.int(s.hit_at_5),
        "hit@10": dg.MetadataValue.int(s.hit_at_10),
        "queries": dg.MetadataValue.int(s.queries),
        **misses_metadata(report)}  # a failed gate says why
    if not report.gate_passed:
        metadata["failure"] = str(gate_failure(report))
    return dg.AssetCheckResult(passed=report.gate_passed, severity=dg.AssetCheckSeverity.ERROR,
                               metadata=metadata)


@dg.asset(group_name=GROUP, kinds={"qdrant"})
@refusals
def active_generation(context: dg.AssetExecutionContext, workspace: WorkspaceResource,
                      index: IndexResource, embedder: EmbedderResource,
                      candidate_generation: Candidate,
                      generation_evaluation: EvaluationReport) -> dg.Output[PublishResult]:
    """The candidate made active in one registry update; older generations per retention."""
    ws = workspace.load()
    with open_registry(ws) as registry, _index(ws, index, embedder.make(ws).dim) as idx:
        deleted = activate_candidate(ws, registry, idx, candidate_generation,
                                     generation_evaluation, say=lambda m: tell(context, m))
    result = PublishResult(generation=candidate_generation.generation,
                           revision=candidate_generation.revision, activated=True,
                           evaluation=generation_evaluation, counts=candidate_generation.counts,
                           timings=dict(candidate_generation.timings),
                           retired_points_deleted=deleted)
    return dg.Output(result, metadata={
        "generation": dg.MetadataValue.int(result.generation),
        "revision": result.revision,
        "retired_points_deleted": ", ".join(map(str, deleted)) or "none"})
