"""Committed notes as an observable source: ``evidence_source``, one partition per source, whose
data version is the note's Git blob id at HEAD.

A committed edit changes the blob id, so the UI marks ``source_file`` of that partition stale
(its materialization records the blob id it read as its input's data version), and
``source_changes_sensor`` records the new observation and requests a preview of the changed
sources: the curator no longer types the file path into a launchpad. A note edited but not
committed is not observed: what the team reviews is what Git holds.
"""

from __future__ import annotations

import json
import warnings
from pathlib import PurePosixPath

import dagster as dg
import git
from dagster._core.definitions.data_version import DATA_VERSION_TAG

from evidence_pipeline.gitrepo import GitError, open_repo
from evidence_pipeline.orchestration.partitions import SOURCE_PARTITIONS, is_source_key
from evidence_pipeline.orchestration.resources import WorkspaceResource
from evidence_runtime.workspace import Workspace

EVIDENCE_SOURCE = dg.AssetKey("evidence_source")
PARTITIONS = str(SOURCE_PARTITIONS.name)
# observable source assets are "beta" in Dagster 1.13: the warning at every import is noise
warnings.filterwarnings("ignore", category=dg.BetaWarning,
                        message=r"Function `observable_source_asset`")


def committed_blobs(ws: Workspace) -> dict[str, str]:
    """Source key (``source/...``, relative to ``evidence/``) → Git blob id of the note at HEAD;
    empty for a repository with no commit yet. Names that cannot be partition keys are left
    out (the partition sensor names them)."""
    evidence = PurePosixPath(ws.evidence_dir.relative_to(ws.root).as_posix())
    with open_repo(ws.root) as repo:
        if not repo.head.is_valid():
            return {}
        try:
            tree = repo.head.commit.tree / str(evidence / "source")
        except KeyError:
            return {}
        out: dict[str, str] = {}
        for item in tree.traverse():
            if isinstance(item, git.Blob):
                key = PurePosixPath(item.path).relative_to(evidence).as_posix()
                if is_source_key(key):
                    out[key] = item.hexsha
        return out


def head_commit(ws: Workspace) -> str | None:
    """HEAD's commit id, or None (no commit yet, not a repository)."""
    try:
        with open_repo(ws.root) as repo:
            return repo.head.commit.hexsha if repo.head.is_valid() else None
    except GitError:
        return None


@dg.observable_source_asset(
    key=EVIDENCE_SOURCE, partitions_def=SOURCE_PARTITIONS, group_name="authoring",
    tags={"tht/stage": "authoring"},
    description="The committed source notes (evidence/source/ at HEAD); a partition's data "
                "version is its Git blob id, so a committed edit marks source_file stale. "
                "Observed by source_changes_sensor, or with Observe in the UI.")
def evidence_source(context: dg.OpExecutionContext,
                    workspace: WorkspaceResource) -> dg.DataVersionsByPartition:
    """The blob id of every committed note that has a partition."""
    keys = set(context.instance.get_dynamic_partitions(PARTITIONS))
    blobs = committed_blobs(workspace.load())
    return dg.DataVersionsByPartition({k: v for k, v in blobs.items() if k in keys})


def changed_blobs(previous: dict[str, str], now: dict[str, str]) -> list[str]:
    """The keys whose blob is new or different (a deleted note is the partition sensor's)."""
    return sorted(k for k, v in now.items() if previous.get(k) != v)


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           asset_selection=dg.AssetSelection.assets(
               "source_file", "normalized_source", "restructured_units", "validated_units"),
           description="Every 30 s: the Git blob id of every committed note observed as the "
                       "data version of evidence_source (a committed edit shows source_file "
                       "stale) and a preview (source_preview's four stages) requested for "
                       "each note whose commit changed since the last tick.")
def source_changes_sensor(context: dg.SensorEvaluationContext,
                          workspace: WorkspaceResource) -> dg.SensorResult | dg.SkipReason:
    """Observe the committed notes; request a preview of those changed since the cursor."""
    keys = set(context.instance.get_dynamic_partitions(PARTITIONS))
    blobs = {k: v for k, v in committed_blobs(workspace.load()).items() if k in keys}
    previous: dict[str, str] | None = json.loads(context.cursor) if context.cursor else None
    changed = changed_blobs(previous or {}, blobs)
    if not changed:
        return dg.SkipReason(f"{len(blobs)} committed note(s), none changed")
    observations = [dg.AssetObservation(EVIDENCE_SOURCE, partition=k,
                                        tags={DATA_VERSION_TAG: blobs[k]}) for k in changed]
    # the first tick observes every note; only later changes are previewed
    runs = [] if previous is None else [
        dg.RunRequest(run_key=f"{k}:{blobs[k]}", partition_key=k,
                      tags={"tht/trigger": "sensor", "tht/source": k}) for k in changed]
    return dg.SensorResult(run_requests=runs, asset_events=observations,
                           cursor=json.dumps(blobs, sort_keys=True))


def observed(instance: dg.DagsterInstance, key: str, blob: str) -> int | None:
    """The storage id of the observation of ``key`` whose data version is ``blob`` when it is
    the latest (the event a materialization that read this blob records as its input), else
    None (not observed yet, or observed before the last commit)."""
    record = instance.get_latest_data_version_record(EVIDENCE_SOURCE, True, key)
    if record is None:
        return None
    event = record.event_log_entry.asset_observation
    if event is None or event.tags.get(DATA_VERSION_TAG) != blob:
        return None
    return record.storage_id
