"""What the Dagster UI shows an operator and a curator is true (issue 27 item 3): a committed
note edit marks its partition stale and is previewed by a sensor; the activate launchpad asks
for the revision and refuses a rollback; the rollback and save_evaluation_baseline jobs; op jobs
record on ``active_generation`` what they changed, with the generations one can roll back to
and links to the commit."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContextForTest

from evidence_pipeline.definitions import defs
from evidence_pipeline.demo import git
from evidence_pipeline.orchestration.observation import (
    EVIDENCE_SOURCE,
    committed_blobs,
    source_changes_sensor,
)
from evidence_pipeline.orchestration.operations import Refusal
from evidence_pipeline.orchestration.partitions import sync_source_partitions
from evidence_pipeline.orchestration.resources import WorkspaceResource
from evidence_pipeline.publishing.evaluate import baseline_path
from evidence_pipeline.publishing.publish import activate, preprocess
from evidence_runtime.registry import Registry
from evidence_runtime.workspace import load_workspace
from tests.helpers import PublishedDemo, commit, copy_workspace
from tests.test_dagster import SOURCE_ASSETS, UNCHANGED, resources, run_job

pytestmark = pytest.mark.usefixtures("own_state")


# --- a committed note edit: observed, stale, previewed -------------------------------------------


def tick(context: dg.SensorEvaluationContext, instance: dg.DagsterInstance) -> Any:
    """One sensor evaluation, its observations stored as the daemon stores them."""
    result = source_changes_sensor(context)
    if isinstance(result, dg.SensorResult):
        for event in result.asset_events:
            instance.report_runless_asset_event(event)
        context.update_cursor(result.cursor)
    return result


def source_status(instance: dg.DagsterInstance, key: str) -> StaleStatus:
    # as the UI resolves it (a fresh resolver: it caches what it read)
    resolver = CachingStaleStatusResolver(instance, defs.resolve_asset_graph(),
                                          LoadingContextForTest(instance))
    return resolver.get_status(dg.AssetKey("source_file"), key)


@pytest.mark.slow
def test_a_committed_note_edit_marks_its_partition_stale_and_is_previewed(
        demo_ws: Path) -> None:
    instance = dg.DagsterInstance.ephemeral()
    sync_source_partitions(instance, demo_ws / "evidence")
    blobs = committed_blobs(load_workspace(demo_ws))
    assert len(blobs) == 54
    assert blobs[UNCHANGED] == git(demo_ws, "rev-parse", f"HEAD:evidence/{UNCHANGED}").strip()
    with dg.build_sensor_context(instance=instance, resources={
            "workspace": WorkspaceResource(root=str(demo_ws))}) as context:
        first = tick(context, instance)
        # the first tick observes every committed note and previews nothing
        assert isinstance(first, dg.SensorResult) and first.run_requests == []
        assert len(first.asset_events) == 54
        assert isinstance(tick(context, instance), dg.SkipReason)

        assert dg.materialize(SOURCE_ASSETS, partition_key=UNCHANGED, instance=instance,
                              resources=resources(demo_ws)).success
        assert source_status(instance, UNCHANGED) == StaleStatus.FRESH

        note = demo_ws / "evidence" / UNCHANGED
        note.write_text(note.read_text(encoding="utf-8") + "\nUna riga in più.\n",
                        encoding="utf-8")
        assert isinstance(tick(context, instance), dg.SkipReason)  # not committed: not seen
        commit(demo_ws, "a curator's edit")
        second = tick(context, instance)
    assert isinstance(second, dg.SensorResult)
    new_blob = git(demo_ws, "rev-parse", f"HEAD:evidence/{UNCHANGED}").strip()
    (request,) = second.run_requests or []
    assert (request.partition_key, request.run_key) == (UNCHANGED, f"{UNCHANGED}:{new_blob}")
    (observation,) = second.asset_events
    assert (observation.asset_key, observation.partition) == (EVIDENCE_SOURCE, UNCHANGED)
    # the UI shows the source stale, because its note changed in Git
    assert source_status(instance, UNCHANGED) == StaleStatus.STALE
    other = sorted(k for k in blobs if k != UNCHANGED)[0]
    assert source_status(instance, other) == StaleStatus.MISSING  # never materialized


# --- activate, rollback and the baseline, as jobs launched from the UI ---------------------------


def op_config(job: str, op: str) -> dict[str, Any]:
    """The config fields of ``op`` in ``job`` as the launchpad reads them."""
    schema = defs.resolve_job_def(job).run_config_schema.config_type
    return schema.fields["ops"].config_type.fields[op].config_type.fields[  # type: ignore[union-attr]
        "config"].config_type.fields


def test_the_launchpad_asks_for_the_revision_and_the_generation() -> None:
    # required, no default: "Scaffold missing config" writes the key, and an empty launchpad
    # is refused, instead of a value left from the last launch
    revision = op_config("activate", "activate_revision")["revision"]
    assert revision.is_required and not revision.default_provided
    assert "empty: HEAD" in (revision.description or "")
    generation = op_config("rollback", "rollback_generation")["generation"]
    assert generation.is_required and not generation.default_provided
    with pytest.raises(dg.DagsterInvalidConfigError, match="revision"):
        defs.resolve_job_def("activate").execute_in_process(
            resources=resources(Path("/nonexistent")), run_config={})


def serving(ws: Path) -> tuple[int | None, str | None]:
    w = load_workspace(ws)
    with Registry.open(w.registry_url) as registry:
        revision, active = registry.active_state(w.config.workspace_id)
    return (active.number if active else None), revision


def active_record(instance: dg.DagsterInstance) -> dg.AssetMaterialization:
    event = instance.get_latest_materialization_event(dg.AssetKey("active_generation"))
    assert event is not None and event.asset_materialization is not None
    return event.asset_materialization


@pytest.mark.slow
def test_rollback_from_the_ui_is_its_own_job_and_active_generation_tells_the_truth(
        published_demo: PublishedDemo, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THT_COMMIT_URL", "https://git.example.org/ws/-/commit/{commit}")
    ws = copy_workspace(published_demo.ws, tmp_path / "ws")
    first = published_demo.revision
    second = commit(ws, "a second revision", allow_empty=True)
    activate(ws)
    assert preprocess(ws).generation == 2
    assert serving(ws) == (2, second)
    instance = dg.DagsterInstance.ephemeral()

    # the last revision typed in a launchpad is no silent rollback
    refused = run_job("activate", ws, instance, raise_on_error=False,
                      run_config={"ops": {"activate_revision": {"config": {
                          "revision": first}}}})
    assert not refused.success
    (failure,) = [e for e in refused.all_events if e.is_step_failure]
    error = failure.step_failure_data.user_failure_data
    assert error is not None and error.metadata["code"].value == "rollback_refused"
    assert "rollback job" in (error.description or "")
    assert serving(ws) == (2, second)  # nothing changed

    back = run_job("rollback", ws, instance, run_config={
        "ops": {"rollback_generation": {"config": {"generation": 1}}}})
    assert back.success and serving(ws) == (1, first)
    record = active_record(instance)
    assert (record.tags or {})["dagster/data_version"] == "1"  # as the publish run records it
    shown = record.metadata
    assert shown["active_generation"].value == 1 and shown["revision"].value == first
    assert shown["rolled_back_from"].value == "2"
    assert shown["rollback_targets"].value == "2"
    assert shown["commit_url"].value == f"https://git.example.org/ws/-/commit/{first}"
    assert "| 1 | " + first[:12] + " | active (serving) |" in str(shown["generations"].value)

    # forward again with an empty revision (HEAD): the retained generation 2 serves at once
    ahead = run_job("activate", ws, instance, run_config={
        "ops": {"activate_revision": {"config": {"revision": ""}}}})
    assert ahead.success and serving(ws) == (2, second)
    assert (active_record(instance).tags or {})["dagster/data_version"] == "2"

    # a generation that is not retained, or does not exist, is refused by name
    with pytest.raises(Refusal, match="there is no generation 7"):
        run_job("rollback", ws, instance, run_config={
            "ops": {"rollback_generation": {"config": {"generation": 7}}}})


@pytest.mark.slow
def test_save_evaluation_baseline_from_the_ui(published_demo: PublishedDemo,
                                              tmp_path: Path) -> None:
    ws = copy_workspace(published_demo.ws, tmp_path / "ws")
    where = baseline_path(load_workspace(ws).state_dir)
    assert not where.exists()
    instance = dg.DagsterInstance.ephemeral()
    result = run_job("save_evaluation_baseline", ws, instance)
    assert result.success
    saved = json.loads(where.read_text(encoding="utf-8"))
    assert saved["generation"] == 1 and saved["summary"]["hit_at_10"] == 31
    event = instance.get_latest_materialization_event(dg.AssetKey("active_index_evaluation"))
    assert event is not None and event.asset_materialization is not None
    assert event.asset_materialization.metadata["baseline"].value == str(where)


# --- what the UI renders: descriptions in plain text ---------------------------------------------

RAW_REST = re.compile(r"``|:[a-z]+:`|\.\. [a-z]+::")


def _descriptions() -> dict[str, str]:
    """Every description the UI renders as Markdown: assets, checks, jobs, ops, sensors,
    schedules, resources and every config field of every job."""
    graph = defs.resolve_asset_graph()
    out = {f"asset {k.to_user_string()}": graph.get(k).description or ""
           for k in graph.get_all_asset_keys()}
    out |= {f"check {k.name}": graph.get_check_spec(k).description or ""
            for k in graph.asset_check_keys}
    out |= {f"sensor {s.name}": s.description or "" for s in defs.sensors or []}
    out |= {f"schedule {s.name}": s.description or "" for s in defs.schedules or []}
    out |= {f"resource {name}": getattr(r, "description", None) or type(r).__doc__ or ""
            for name, r in (defs.resources or {}).items()}

    def walk(config_type: Any, path: str) -> None:
        for name, field in (getattr(config_type, "fields", None) or {}).items():
            out[f"config {path}.{name}"] = field.description or ""
            walk(field.config_type, f"{path}.{name}")

    for job in defs.jobs or []:
        resolved = defs.resolve_job_def(job.name)
        out[f"job {job.name}"] = resolved.description or ""
        out |= {f"op {op.name}": op.description or "" for op in resolved.graph.iterate_op_defs()}
        walk(resolved.run_config_schema.config_type, job.name)
    return out


def test_descriptions_are_plain_text_not_restructuredtext() -> None:
    found = _descriptions()
    assert len(found) > 100 and found["asset source_file"]
    raw = {where: text for where, text in found.items() if RAW_REST.search(text)}
    assert raw == {}
    # no paragraph indented by four spaces after a blank line: Markdown shows it as code
    code = {where: text for where, text in found.items() if "\n\n    " in text}
    assert code == {}
