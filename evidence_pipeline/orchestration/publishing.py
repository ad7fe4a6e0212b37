"""Publishing assets: the activated revision becomes an evaluated, active generation.

Each asset is one stage of ``tht workspace preprocess evidence`` and calls the same function:
validation and the evaluation gate are blocking asset checks, so no candidate is built from an
unpublishable corpus and ``active_generation`` never runs after a failed gate (the previous
generation stays active). Each step opens and closes the index itself: an embedded Qdrant Edge
shard is held by one process at a time. The steps of a publish run are in the pool ``index``
(``dagster.yaml``: one such run at a time, never queued behind runs of the pool ``authoring``,
to which the per-source assets below belong).

Fragments and dense vectors are per source: ``evidence_fragments`` and ``fragment_embeddings``
are partitioned like the sources (a unit belongs to the source its provenance names), each
partition with its data version, so the UI shows per source what changed. One source's can be
materialized on its own (it warms the vector cache). ``candidate_generation`` consumes them all:
in a publish run it cuts and embeds the whole revision with the functions ``preprocess`` calls
(an unchanged fragment comes from the vector cache: no work) and records every source's
partitions of both assets, then uploads the candidate.
"""

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dagster as dg

from evidence_pipeline.formats.evalset import read_evaluation
from evidence_pipeline.formats.fragments import Fragment
from evidence_pipeline.orchestration.authoring import POOL as AUTHORING_POOL
from evidence_pipeline.orchestration.authoring import curated_corpus, validation_result
from evidence_pipeline.orchestration.metadata import (
    OPERATORS,
    catalog,
    commit_links,
    corpus_metadata,
    digest,
    evaluation_metadata,
    generations_metadata,
    misses_metadata,
    version_tags,
)
from evidence_pipeline.orchestration.operations import refusals
from evidence_pipeline.orchestration.partitions import (
    SOURCE_PARTITIONS,
    check_source_key,
    sync_source_partitions,
)
from evidence_pipeline.orchestration.progress import embedding_progress, tell
from evidence_pipeline.orchestration.resources import (
    EmbedderResource,
    IndexResource,
    WorkspaceResource,
)
from evidence_pipeline.publishing.activation import list_generations
from evidence_pipeline.publishing.evaluate import EvaluationReport
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
POOL = "index"  # a publish run: its steps open the index, or lead to those that do
SOURCE_POOL = AUTHORING_POOL  # one source's fragments or vectors: never the index
CATALOG = catalog(GROUP, OPERATORS)

Fragments = list[tuple[LoadedUnit, Fragment]]


@dataclass
class FragmentVectors:
    """Dense vectors of the fragments, in fragment order."""

    vectors: Any
    computed: int  # embedded now; the others came from the vector cache
    model_id: str


def _index(ws: Workspace, index: IndexResource, dense_dim: int, *, points: int = 0,
           ) -> contextlib.closing[IndexWriter]:
    """The index resource opened for one step (closed at the end of it); ``points``: how
    many it will write (room checked first)."""
    return contextlib.closing(open_target_index(
        ws, dense_dim, lambda w, dim: index.open(w, dense_dim=dim), points=points))


def fragments_version(frags: Fragments) -> str:
    """The data version of one source's fragments: ids, ordinals and texts."""
    return digest([[f.evidence_id, f.ordinal, f.text] for _, f in frags])


def vectors_version(model_id: str, fragments: str) -> str:
    """The data version of one source's vectors: the model and the fragments' version."""
    return digest({"model": model_id, "fragments": fragments})


def by_source(frags: Fragments) -> dict[str, Fragments]:
    """The fragments of each source (the one their unit's provenance names), in order."""
    out: dict[str, Fragments] = defaultdict(list)
    for item, fragment in frags:
        assert item.unit is not None
        out[item.unit.provenance.source_file].append((item, fragment))
    return out


def _fragments_metadata(ws: Workspace, frags: Fragments) -> dict[str, Any]:
    return {"fragments": dg.MetadataValue.int(len(frags)),
            "units": dg.MetadataValue.int(len({f.evidence_id for _, f in frags})),
            "longest_fragment_chars": dg.MetadataValue.int(
                max((len(f.text) for _, f in frags), default=0)),
            "max_chunk_chars": dg.MetadataValue.int(ws.config.embeddings.max_chunk_chars)}


@dg.asset(group_name=GROUP, deps=[curated_corpus], kinds={"git"}, pool=POOL, **CATALOG)
@refusals
def published_corpus(context: dg.AssetExecutionContext,
                     workspace: WorkspaceResource) -> dg.Output[PublishedCorpus]:
    """The activated revision materialized from Git and its whole corpus validated again."""
    ws = workspace.load()
    with open_registry(ws) as registry:
        revision = activated_revision(ws, registry)
    tell(context, f"revision {revision[:12]}: materializing from Git")
    corpus = materialize_corpus(ws, revision, progress=embedding_progress(context))
    return dg.Output(corpus, data_version=dg.DataVersion(revision),
                     metadata={"revision": revision, **commit_links(revision),
                               **corpus_metadata(corpus.report, corpus.loaded)})


@dg.asset_check(asset=published_corpus, blocking=True)
def publishable(published_corpus: PublishedCorpus) -> dg.AssetCheckResult:
    """The revision is publishable: no error, no review item, no orphan (blocks publishing)."""
    return validation_result(published_corpus.report, review_blocks=True)


FRAGMENT_STAGES = ("evidence_fragments", "fragment_embeddings")
evidence_fragments, fragment_embeddings = (dg.AssetKey(name) for name in FRAGMENT_STAGES)


@dg.multi_asset(
    name="source_fragments", partitions_def=SOURCE_PARTITIONS, can_subset=True,
    pool=SOURCE_POOL, ins={"published_corpus": dg.AssetIn()},
    # a backfill of any number of sources is one run (the corpus read and the model loaded once)
    backfill_policy=dg.BackfillPolicy.single_run(),
    specs=[dg.AssetSpec(evidence_fragments, deps=[published_corpus], group_name=GROUP,
                        kinds={"markdown"}, partitions_def=SOURCE_PARTITIONS, skippable=True,
                        description="One source's units in the activated revision, cut into "
                                    "fragments no longer than max_chunk_chars (atomic elements "
                                    "whole).", **CATALOG),
           dg.AssetSpec(fragment_embeddings, deps=[evidence_fragments], group_name=GROUP,
                        kinds={"numpy"}, partitions_def=SOURCE_PARTITIONS, skippable=True,
                        description="Dense vectors of one source's fragments; a fragment "
                                    "already embedded comes from the vector cache (no work).",
                        **CATALOG)])
@refusals
def source_fragments(context: dg.AssetExecutionContext, workspace: WorkspaceResource,
                     embedder: EmbedderResource,
                     published_corpus: PublishedCorpus) -> Iterator[dg.MaterializeResult]:
    """The fragments (and their vectors) of the run's sources: one partition, a range or a
    whole backfill in one step, each partition recorded with its data version as the publish
    run records it (a source with no unit in the revision: 0 fragments)."""
    ws = workspace.load()
    stages = {key.path[-1] for key in context.selected_asset_keys}
    keys = [check_source_key(k) for k in context.partition_keys]
    wanted = set(keys)
    units = [item for item in published_corpus.loaded
             if item.unit is not None and item.unit.provenance.source_file in wanted]
    frags = cut_fragments(ws, units)
    tell(context, f"{len(keys)} source(s): {len(units)} unit(s) → {len(frags)} fragment(s)")
    model_id = dim = None
    if "fragment_embeddings" in stages:
        emb, _, computed = embed_fragments(ws, frags, embedder.make(ws))
        model_id, dim = emb.model_id, emb.dim
        tell(context, f"embedded {computed} new fragment(s), {len(frags) - computed} from cache")
    grouped = by_source(frags)
    for key in keys:
        mine = grouped.get(key, [])
        version = fragments_version(mine)
        if "evidence_fragments" in stages:
            context.log_event(dg.AssetMaterialization(
                evidence_fragments, partition=key, metadata=_fragments_metadata(ws, mine),
                tags=version_tags(version, {"published_corpus": published_corpus.revision})))
        if model_id is not None:
            context.log_event(dg.AssetMaterialization(
                fragment_embeddings, partition=key,
                metadata={"fragments": dg.MetadataValue.int(len(mine)), "model": model_id,
                          "dim": dg.MetadataValue.int(dim or 0)},
                tags=version_tags(vectors_version(model_id, version),
                                  {"evidence_fragments": version})))
    # every partition is recorded above (a result here would give them all one metadata)
    yield from ()


def _record_sources(context: dg.AssetExecutionContext, ws: Workspace, revision: str,
                    frags: Fragments, model_id: str) -> int:
    """Record ``evidence_fragments`` and ``fragment_embeddings`` of every source partition (the
    partitions brought in step with ``source/`` first), as this run computed them (a partition
    with no unit in the revision: 0 fragments). Returns how many fragments belong to no
    partition (published all the same)."""
    sync_source_partitions(context.instance, ws.evidence_dir)
    keys = set(context.instance.get_dynamic_partitions(SOURCE_PARTITIONS.name))
    grouped = by_source(frags)
    for key in sorted(keys):
        mine = grouped.get(key, [])
        fragments = fragments_version(mine)
        context.log_event(dg.AssetMaterialization(
            "evidence_fragments", partition=key, metadata=_fragments_metadata(ws, mine),
            tags=version_tags(fragments, {"published_corpus": revision})))
        context.log_event(dg.AssetMaterialization(
            "fragment_embeddings", partition=key,
            metadata={"fragments": dg.MetadataValue.int(len(mine)), "model": model_id},
            tags=version_tags(vectors_version(model_id, fragments),
                              {"evidence_fragments": fragments})))
    return sum(len(v) for k, v in grouped.items() if k not in keys)


@dg.asset(group_name=GROUP, kinds={"qdrant"}, deps=[evidence_fragments, fragment_embeddings],
          pool=POOL, **CATALOG)
@refusals
def candidate_generation(context: dg.AssetExecutionContext, workspace: WorkspaceResource,
                         index: IndexResource, embedder: EmbedderResource,
                         published_corpus: PublishedCorpus) -> dg.Output[Candidate]:
    """Every source's fragments and vectors (all partitions), then a new generation uploaded
    beside the active one and verified (not yet visible)."""
    ws = workspace.load()
    require_publishable(published_corpus)  # also when this asset runs on its own
    t = time.perf_counter()
    frags = cut_fragments(ws, published_corpus.loaded)
    timings = {"fragments_s": time.perf_counter() - t}
    tell(context, f"{len(published_corpus.loaded)} units → {len(frags)} fragments")
    t = time.perf_counter()
    emb, vectors, computed = embed_fragments(ws, frags, embedder.make(ws),
                                             progress=embedding_progress(context))
    timings["embed_s"] = time.perf_counter() - t
    tell(context, f"embedded {computed} new fragment(s), {len(frags) - computed} from cache")
    outside = _record_sources(context, ws, published_corpus.revision, frags, emb.model_id)
    with open_registry(ws) as registry, _index(ws, index, emb.dim, points=len(frags)) as idx:
        candidate = build_candidate(ws, registry, idx, emb, published_corpus.revision,
                                    published_corpus.loaded, frags, vectors, computed=computed,
                                    say=lambda m: tell(context, m),
                                    progress=embedding_progress(context))
    candidate.timings = {**timings, **candidate.timings}
    counts = candidate.counts
    return dg.Output(candidate, data_version=dg.DataVersion(str(candidate.generation)),
                     metadata={
        "generation": dg.MetadataValue.int(candidate.generation),
        "revision": candidate.revision,
        "units": dg.MetadataValue.int(counts["units"]),
        "fragments": dg.MetadataValue.int(counts["fragments"]),
        "fragments_embedded": dg.MetadataValue.int(counts["fragments_embedded"]),
        "fragments_without_partition": dg.MetadataValue.int(outside),
        "units_per_kind": dg.MetadataValue.json(counts.get("units_per_kind", {}))})


@dg.asset(group_name=GROUP, kinds={"qdrant"}, pool=POOL, **CATALOG)
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
                                    published_corpus.loaded, evalset,
                                    progress=embedding_progress(context))
    s = report.summary
    context.log.info(f"evaluation of generation {report.generation}: hit@5 {s.hit_at_5}/"
                     f"{s.queries}, hit@10 {s.hit_at_10}/{s.queries}, gate "
                     f"{'passed' if report.gate_passed else 'failed'}")
    return dg.Output(report, data_version=dg.DataVersion(digest(report.model_dump(mode="json"))),
                     metadata=evaluation_metadata(report))


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


@dg.asset(group_name=GROUP, kinds={"qdrant"}, pool=POOL, **CATALOG)
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
    return dg.Output(result, data_version=dg.DataVersion(str(result.generation)), metadata={
        "generation": dg.MetadataValue.int(result.generation),
        "revision": result.revision, **commit_links(result.revision),
        "retired_points_deleted": ", ".join(map(str, deleted)) or "none",
        **generations_metadata(list_generations(ws))})
