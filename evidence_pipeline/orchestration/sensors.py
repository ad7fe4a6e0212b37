"""Sensors: source partitions kept in step with ``evidence/source/``, and publishing launched
when an operator activates a revision that no active generation serves yet."""

import dagster as dg

from evidence_pipeline.orchestration.jobs import publish_job
from evidence_pipeline.orchestration.partitions import (
    SOURCE_PARTITIONS,
    partition_requests,
    source_keys,
)
from evidence_pipeline.orchestration.resources import WorkspaceResource
from evidence_pipeline.publishing.publish import open_registry


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Every 30 s: one partition per source file under evidence/source/ "
                       "(added for a new file, removed for a deleted or renamed one); a file "
                       "whose name cannot be a partition key is named in the tick's log.")
def source_partitions_sensor(context: dg.SensorEvaluationContext,
                             workspace: WorkspaceResource) -> dg.SensorResult | dg.SkipReason:
    """Add a partition per new source file, remove those of deleted or renamed files."""
    ws = workspace.load()
    keys, refused = source_keys(ws.evidence_dir)
    for name, reason in refused:
        context.log.warning(f"no partition for {name}: {reason}")
    current = context.instance.get_dynamic_partitions(SOURCE_PARTITIONS.name)
    requests = partition_requests(current, keys)
    if not requests:
        return dg.SkipReason(f"{len(keys)} source partition(s), all in step")
    return dg.SensorResult(dynamic_partitions_requests=requests)


@dg.sensor(job=publish_job, minimum_interval_seconds=60,
           default_status=dg.DefaultSensorStatus.RUNNING,
           description="Every 60 s: launches publish once for a revision activated with `tht "
                       "workspace activate` that no active generation serves yet (search "
                       "answers revision_mismatch until it runs); a rollback needs no run.")
def activated_revision_sensor(context: dg.SensorEvaluationContext,
                              workspace: WorkspaceResource) -> dg.RunRequest | dg.SkipReason:
    """Publish a newly activated revision (once per revision; a rollback needs no run)."""
    ws = workspace.load()
    wid = ws.config.workspace_id
    with open_registry(ws) as registry:
        revision, generation = registry.active_state(wid)
    if revision is None:
        return dg.SkipReason("no revision is activated")
    if generation is not None and generation.revision == revision:
        return dg.SkipReason(f"generation {generation.number} serves revision {revision[:12]}")
    context.update_cursor(revision)
    return dg.RunRequest(run_key=f"{wid}:{revision}",
                         tags={"tht/trigger": "sensor", "tht/workspace": wid,
                               "tht/revision": revision})
