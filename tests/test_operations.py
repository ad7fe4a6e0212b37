"""What operators and curators do from the Dagster UI: activate a revision (and every expected
refusal as a one-line ``dg.Failure``), preview one source (its units, review items and diff) and
prepare exactly that one source.

Real engines: Git, the structural model backend, the registry, and a Dagster instance on disk
(this repository's dagster.yaml in a temporary DAGSTER_HOME), as the UI's runs use.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from evidence_pipeline.demo import git
from evidence_pipeline.formats.manifest import read_manifest
from evidence_pipeline.orchestration.authoring import source_stages
from evidence_pipeline.orchestration.partitions import sync_source_partitions
from evidence_pipeline.orchestration.resources import ModelBackendResource
from evidence_runtime.registry import Registry
from evidence_runtime.workspace import load_workspace
from tests.helpers import cli, commit, dagster_home, edit, head
from tests.test_dagster import resources as dagster_resources
from tests.test_dagster import run_job

NOTE = "source/90-prove/esito-ps.md"
# a code table with a third column: the structural backend flags it for review
NOTE_TEXT = ("# Esito dell'accesso in Pronto Soccorso\n\n"
             "La colonna clinical.ed_visit.outcome_code registra l'esito dell'accesso.\n\n"
             "| codice | significato | nota |\n|---|---|---|\n| 1 | dimesso a domicilio | |\n"
             "| 2 | ricoverato | in reparto |\n")
EDITED = "source/10-domini-clinici/paziente.md"
SOURCE_ASSETS = [source_stages]  # the four per-source stages, one multi-asset


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    """A Dagster instance on disk with this repository's dagster.yaml (SQLite storage)."""
    with dg.DagsterInstance.from_config(str(dagster_home(tmp_path))) as inst:
        yield inst


def resources(ws: Path) -> dict[str, Any]:
    return dagster_resources(ws, ModelBackendResource())  # the workspace's own model backend


def run(job: str, ws: Path, instance: dg.DagsterInstance, **kw: Any
        ) -> dg.ExecuteInProcessResult:
    return run_job(job, ws, instance, model=ModelBackendResource(), raise_on_error=False, **kw)


def stage_record(result: dg.ExecuteInProcessResult, stage: str) -> dg.AssetMaterialization:
    """The materialization of one per-source stage in a run of ``source_stages``."""
    (event,) = [e.materialization for e in result.get_asset_materialization_events()
                if e.asset_key == dg.AssetKey(stage)]
    return event


def activate_config(revision: str) -> dict[str, Any]:
    return {"ops": {"activate_revision": {"config": {"revision": revision}}}}


def refusal(result: dg.ExecuteInProcessResult) -> tuple[str, dict[str, Any], Any]:
    """The one failed step's description, metadata values and error, as the run recorded them."""
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    data = failure.step_failure_data
    assert data.user_failure_data is not None, data.error
    meta = {k: v.value for k, v in data.user_failure_data.metadata.items()}
    return data.user_failure_data.description, meta, data.error


def assert_one_line_refusal(description: str, error: Any) -> None:
    assert "\n" not in description and "Traceback" not in description
    # a dg.Failure, not a wrapped exception: no chained traceback of the original error
    assert error.cls_name == "Refusal" and error.cause is None and error.context is None


def activated(ws: Path) -> str | None:
    w = load_workspace(ws)
    with Registry.open(w.registry_url) as registry:
        return registry.activated_revision(w.config.workspace_id)


# --- activate -------------------------------------------------------------------------------------


def test_the_activate_job_records_head_of_a_clean_tree(demo_ws: Path,
                                                        instance: dg.DagsterInstance) -> None:
    result = run("activate", demo_ws, instance, run_config=activate_config(""))
    assert result.success
    assert activated(demo_ws) == head(demo_ws)
    (event,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    meta = event.step_output_data.metadata
    assert meta["revision"].value == head(demo_ws)
    assert meta["reactivated_generation"].value == "none"
    (run_record,) = instance.get_runs()
    assert run_record.job_name == "activate" and run_record.status == dg.DagsterRunStatus.SUCCESS


def test_the_activate_job_takes_a_revision(demo_ws: Path, instance: dg.DagsterInstance) -> None:
    first = head(demo_ws)
    edit(demo_ws / "evidence" / EDITED, "# Paziente\n", "# Paziente (nota)\n")
    commit(demo_ws, "a second revision")
    assert run("activate", demo_ws, instance, run_config=activate_config(first[:10])).success
    assert activated(demo_ws) == first


def test_activating_head_of_a_dirty_tree_is_refused_in_one_line(
        demo_ws: Path, instance: dg.DagsterInstance) -> None:
    edit(demo_ws / "evidence" / EDITED, "# Paziente\n", "# Paziente (nota)\n")
    description, meta, error = refusal(run("activate", demo_ws, instance,
                                           run_config=activate_config("")))
    assert description == (f"git_error: {demo_ws}: cannot activate HEAD: 1 uncommitted "
                           f"change(s): evidence/{EDITED}; commit or stash them first")
    assert meta == {"code": "git_error", "path": str(demo_ws)}
    assert_one_line_refusal(description, error)
    assert activated(demo_ws) is None


def test_an_unknown_revision_is_refused_in_one_line(demo_ws: Path,
                                                    instance: dg.DagsterInstance) -> None:
    result = run("activate", demo_ws, instance, run_config=activate_config("no-such-tag"))
    description, meta, error = refusal(result)
    assert description == f"git_error: {demo_ws}: unknown Git revision 'no-such-tag'"
    assert meta["code"] == "git_error"
    assert_one_line_refusal(description, error)
    assert instance.get_runs()[0].status == dg.DagsterRunStatus.FAILURE


def test_activating_while_a_publication_runs_is_refused_as_busy(
        demo_ws: Path, instance: dg.DagsterInstance) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\nfrom evidence_pipeline.publishing.publish import publish_lock\n"
         "from evidence_runtime.workspace import load_workspace\n"
         f"with publish_lock(load_workspace({str(demo_ws)!r})):\n"
         "    print('held', flush=True)\n    sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        description, meta, error = refusal(run("activate", demo_ws, instance,
                                               run_config=activate_config("")))
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert description.startswith("publish_busy: ")
    assert "another publication is running on this workspace" in description
    assert meta["code"] == "publish_busy"
    assert_one_line_refusal(description, error)


def test_publishing_before_an_activation_is_refused_in_one_line(
        demo_ws: Path, instance: dg.DagsterInstance) -> None:
    result = run("publish", demo_ws, instance)
    description, meta, error = refusal(result)
    assert description == (f"no_activated_revision: {demo_ws}: no revision is activated for "
                           "this workspace; run `tht workspace activate` first")
    assert meta == {"code": "no_activated_revision", "path": str(demo_ws)}
    assert_one_line_refusal(description, error)
    assert [e.step_key for e in result.all_events if e.is_step_failure] == ["published_corpus"]


def test_the_cli_through_dagster_still_gets_the_typed_error(
        demo_ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home(tmp_path)))
    out = cli("workspace", "preprocess", "evidence", str(demo_ws), "--json")
    assert out.exit_code == 2, out.output
    assert '"code": "no_activated_revision"' in out.stdout


# --- one source: the preview and the prepare of exactly that source ------------------------------


def add_note_and_edit(ws: Path) -> None:
    """Two changed sources: a new note, and a line added to an existing one."""
    note = ws / "evidence" / NOTE
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(NOTE_TEXT, encoding="utf-8")
    with (ws / "evidence" / EDITED).open("a", encoding="utf-8") as f:
        f.write("\n## Neonati\nPer neonato si intende il paziente con età inferiore a 28 "
                "giorni alla data del ricovero.\n")
    commit(ws, "curator edits: two sources")


def test_the_preview_of_one_source_shows_its_units_review_items_and_diff(
        demo_ws: Path, instance: dg.DagsterInstance) -> None:
    add_note_and_edit(demo_ws)
    sync_source_partitions(instance, demo_ws / "evidence")
    preview = dg.materialize(SOURCE_ASSETS, partition_key=NOTE, instance=instance,
                             resources=resources(demo_ws))
    assert preview.success
    assert git(demo_ws, "status", "--porcelain") == ""  # a preview writes nothing
    meta = {k: v.value for k, v in stage_record(preview, "validated_units").metadata.items()}
    (eid,) = str(meta["unit_ids"]).split(", ")
    assert meta["unit_ids"] == eid and meta["units"] == 1
    units = meta["proposed_units"].splitlines()
    assert units[0] == "| unit | kind | title | review items |"
    assert units[2].startswith(f"| {eid} | ")
    # the review items' code and message, one row each
    items = meta["review_items_text"]
    assert meta["review_items"] >= 1 and items.startswith("| unit | code | message |")
    assert all(row.startswith(f"| {eid} | ") for row in items.splitlines()[2:])
    diff = meta["diff"]
    assert diff.startswith("```diff\n") and f"+      - {eid}\n" in diff
    assert "--- /dev/null\n+++ b/evidence/curated/" in diff
    assert f"+  {NOTE}:" in diff and EDITED not in diff  # the other changed source is not in it


def test_prepare_source_prepares_exactly_that_source(demo_ws: Path,
                                                     instance: dg.DagsterInstance) -> None:
    add_note_and_edit(demo_ws)
    before = read_manifest(demo_ws / "evidence")
    assert before is not None
    sync_source_partitions(instance, demo_ws / "evidence")
    preview = dg.materialize(SOURCE_ASSETS, partition_key=NOTE, instance=instance,
                             resources=resources(demo_ws))
    shown = stage_record(preview, "validated_units").metadata["diff"].value

    result = run("prepare_source", demo_ws, instance, partition_key=NOTE)
    assert result.success
    prepared = result.output_for_node("prepare_one_source")
    assert prepared.status == "applied" and prepared.model_calls == 1
    assert [s.path for s in prepared.sources if s.change.value != "unchanged"] == [NOTE]
    assert shown == f"```diff\n{prepared.diff}```"  # the preview showed exactly this change
    changed = {line[3:] for line in
               git(demo_ws, "status", "--porcelain", "--untracked-files=all").splitlines()}
    assert changed == {*prepared.written, *prepared.deleted}
    assert "evidence/manifest.yaml" in prepared.written
    assert all(w.startswith(("evidence/curated/", "evidence/manifest.yaml"))
               for w in prepared.written)
    after = read_manifest(demo_ws / "evidence")
    assert after is not None
    (report,) = [s for s in prepared.sources if s.path == NOTE]
    assert after.sources[NOTE].units == report.units
    # the other changed source keeps the hash of its last prepare: still to prepare
    assert after.sources[EDITED] == before.sources[EDITED]
    (run_record,) = [r for r in instance.get_runs() if r.job_name == "prepare_source"]
    assert run_record.tags["dagster/partition"] == NOTE
    # what it changed is recorded on applied_batch, at the version a prepare run gives it
    event = instance.get_latest_materialization_event(dg.AssetKey("applied_batch"))
    assert event is not None and event.asset_materialization is not None
    recorded = event.asset_materialization
    manifest = (demo_ws / "evidence" / "manifest.yaml").read_bytes()
    assert (recorded.tags or {})["dagster/data_version"] == hashlib.sha256(manifest).hexdigest()
    assert recorded.metadata["source"].value == NOTE


def test_prepare_source_refuses_a_key_that_is_not_a_source(
        demo_ws: Path, instance: dg.DagsterInstance) -> None:
    instance.add_dynamic_partitions("evidence_sources", ["source/nessuna-nota.md"])
    description, meta, error = refusal(run("prepare_source", demo_ws, instance,
                                           partition_key="source/nessuna-nota.md"))
    assert description == "source_missing: source/nessuna-nota.md: no such source file"
    assert meta == {"code": "source_missing", "path": "source/nessuna-nota.md"}
    assert_one_line_refusal(description, error)
    assert git(demo_ws, "status", "--porcelain") == ""

