"""The jobs: prepare (authoring), publish (preprocess evidence), one source, nightly evaluation."""

from __future__ import annotations

import dagster as dg

from evidence_pipeline.orchestration.authoring import (
    applied_batch,
    curated_corpus,
    normalized_source,
    restructured_units,
    source_file,
    validated_units,
)
from evidence_pipeline.orchestration.monitoring import active_index_evaluation
from evidence_pipeline.orchestration.publishing import (
    active_generation,
    candidate_generation,
    evidence_fragments,
    fragment_embeddings,
    generation_evaluation,
    published_corpus,
)

prepare_job = dg.define_asset_job(
    "prepare", selection=dg.AssetSelection.assets(applied_batch, curated_corpus),
    description="tht evidence prepare: every changed source restructured (one model call "
                "each), applied all or nothing, then the work tree validated.")

publish_job = dg.define_asset_job(
    "publish",
    selection=dg.AssetSelection.assets(published_corpus, evidence_fragments,
                                       fragment_embeddings, candidate_generation,
                                       generation_evaluation, active_generation),
    description="tht workspace preprocess evidence: the activated revision validated, "
                "fragmented, embedded, uploaded as a candidate, evaluated, then activated.")

source_job = dg.define_asset_job(
    "source_preview",
    selection=dg.AssetSelection.assets(source_file, normalized_source, restructured_units,
                                       validated_units),
    description="One source previewed: hashed, normalized, restructured and checked "
                "(nothing is written; an unchanged source stops at its hash).")

evaluate_active_job = dg.define_asset_job(
    "evaluate_active", selection=dg.AssetSelection.assets(active_index_evaluation),
    description="tht evidence evaluate against the active generation (read-only).")
