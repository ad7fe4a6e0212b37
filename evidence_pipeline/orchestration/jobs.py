"""The jobs: prepare (authoring), publish (preprocess evidence), one source, nightly evaluation.

Every job runs its steps in the run's own process (``in_process``): a step in a process of its
own costs an interpreter start and a code-location load (seconds) while ours take milliseconds
to seconds and run one after another anyway (a chain, the Edge shard held by one process at a
time, the publish lock). Parallel steps pay in one place: the model steps of a ``prepare`` with
many changed sources and a slow model endpoint; there the launchpad's
``execution: {config: {parallel_model_steps: 4}}`` runs them in 4 processes at a time.

Runs of ``publish`` carry ``dagster/priority`` 10: when the queue has a free slot, a publish
(search may be waiting for it) goes before queued authoring runs and backfills; the pools of
``dagster.yaml`` keep one slot for it.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from evidence_pipeline.orchestration.authoring import (
    applied_batch,
    curated_corpus,
    normalized_source,
    restructured_units,
    source_file,
    validated_units,
)
from evidence_pipeline.orchestration.monitoring import active_index_evaluation, index_integrity
from evidence_pipeline.orchestration.publishing import (
    active_generation,
    candidate_generation,
    generation_evaluation,
    published_corpus,
)

PUBLISH_PRIORITY = "10"


def _prepare_execution(config: dict[str, Any]) -> dict[str, Any]:
    n = config["parallel_model_steps"]
    return {"multiprocess": {"max_concurrent": n}} if n > 1 else {"in_process": {}}


prepare_executor = dg.multi_or_in_process_executor.configured(
    _prepare_execution, name="in_process_unless_parallel_model_steps",
    config_schema={"parallel_model_steps": dg.Field(
        int, default_value=1,
        description="Model steps run at once, each in a process of its own (1: every step "
                    "in the run's process, one after another, as the CLI runs them).")})

prepare_job = dg.define_asset_job(
    "prepare", selection=dg.AssetSelection.assets(applied_batch, curated_corpus),
    executor_def=prepare_executor,
    description="tht evidence prepare: every changed source restructured (one model call "
                "each), applied all or nothing, then the work tree validated. In the run's "
                "process; for many changed sources and a slow model endpoint, set "
                "execution.config.parallel_model_steps in the launchpad.")

publish_job = dg.define_asset_job(
    "publish",
    selection=dg.AssetSelection.assets(published_corpus, candidate_generation,
                                       generation_evaluation, active_generation),
    executor_def=dg.in_process_executor, tags={"dagster/priority": PUBLISH_PRIORITY},
    description="tht workspace preprocess evidence: the activated revision validated, "
                "fragmented and embedded per source, uploaded as a candidate, evaluated, then "
                "activated.")

source_job = dg.define_asset_job(
    "source_preview",
    selection=dg.AssetSelection.assets(source_file, normalized_source, restructured_units,
                                       validated_units),
    executor_def=dg.in_process_executor,
    description="One source previewed: hashed, normalized, restructured and checked "
                "(nothing is written; an unchanged source stops at its hash).")

evaluate_active_job = dg.define_asset_job(
    "evaluate_active",
    selection=dg.AssetSelection.assets(active_index_evaluation)
    | dg.AssetSelection.checks(index_integrity),
    executor_def=dg.in_process_executor,
    description="tht evidence evaluate against the active generation, and the index's "
                "integrity check (tht workspace check), both read-only.")
