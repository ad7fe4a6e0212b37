"""The Dagster code location of thoth-evidence: the one ``dg.Definitions`` (``workspace.yaml``).

Resources come from the environment: ``THT_WORKSPACE`` (the workspace root), and when set
``THT_REGISTRY_URL``, ``THT_QDRANT_API_KEY`` and ``THT_LLM_API_KEY`` (bound as ``dg.EnvVar``:
their values never appear in config or in the UI). Everything else comes from the workspace's
``thoth.yaml``, the index included (``THT_QDRANT_URL`` is read there, as by the CLI).
"""

from __future__ import annotations

import os

import dagster as dg

from evidence_pipeline.orchestration import authoring, monitoring, observation, publishing
from evidence_pipeline.orchestration.jobs import (
    evaluate_active_job,
    prepare_job,
    publish_job,
    source_job,
)
from evidence_pipeline.orchestration.monitoring import save_evaluation_baseline_job
from evidence_pipeline.orchestration.observation import source_changes_sensor
from evidence_pipeline.orchestration.operations import (
    activate_job,
    prepare_source_job,
    publish_revision_job,
    rollback_job,
)
from evidence_pipeline.orchestration.resources import (
    EmbedderResource,
    IndexResource,
    ModelBackendResource,
    WorkspaceResource,
)
from evidence_pipeline.orchestration.schedules import nightly_evaluation
from evidence_pipeline.orchestration.sensors import (
    activated_revision_sensor,
    source_partitions_sensor,
)


def _env(name: str) -> dg.EnvVar | None:
    """An optional setting: bound to the variable when the code location starts with it set."""
    return dg.EnvVar(name) if os.environ.get(name) else None


def resources() -> dict[str, dg.ConfigurableResource]:
    """The resources of the code location, read from the environment."""
    return {
        "workspace": WorkspaceResource(root=dg.EnvVar("THT_WORKSPACE"),
                                       registry_url=_env("THT_REGISTRY_URL")),
        "index": IndexResource(api_key=_env("THT_QDRANT_API_KEY")),
        "embedder": EmbedderResource(),
        "model": ModelBackendResource(api_key=_env("THT_LLM_API_KEY")),
    }


defs = dg.Definitions(
    assets=dg.load_assets_from_modules([observation, authoring, publishing, monitoring]),
    asset_checks=dg.load_asset_checks_from_modules([authoring, publishing, monitoring]),
    jobs=[prepare_job, publish_job, source_job, evaluate_active_job, activate_job,
          prepare_source_job, publish_revision_job, rollback_job, save_evaluation_baseline_job],
    schedules=[nightly_evaluation],
    sensors=[source_partitions_sensor, source_changes_sensor, activated_revision_sensor],
    resources=resources(),
    # assets materialized from the UI and backfills: in the run's process, as every job
    # (orchestration/jobs.py says why)
    executor=dg.in_process_executor,
)
