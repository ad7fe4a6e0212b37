"""The production stack's Dagster storage: a job's run and event log in PostgreSQL, through the
instance configuration compose.yaml mounts, on the throw-away PostgreSQL that scripts/test.sh
starts (THT_TEST_POSTGRES_URL), also with a running daemon (sensor ticks, a queued run, a
backfill); and the dagster / dagster-postgres pins of pyproject.toml, the
Dockerfile and compose.yaml agreeing with what is installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dagster as dg
import pytest
from ruamel.yaml import YAML

from evidence_pipeline.definitions import defs
from evidence_pipeline.orchestration.partitions import SOURCE_PARTITIONS
from evidence_pipeline.orchestration.resources import (
    EmbedderResource,
    IndexResource,
    ModelBackendResource,
    WorkspaceResource,
)
from tests.helpers import ROOT, commit, head

POSTGRES_URL = os.environ.get("THT_TEST_POSTGRES_URL")
BIN = Path(sys.executable).parent
NOTE = "source/10-domini-clinici/paziente.md"
STAGES = ("source_file", "normalized_source", "restructured_units", "validated_units")


def _pins() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return dict(re.findall(r'"(dagster[a-z-]*)==([0-9.]+)"', text))


def compose_instance_config() -> str:
    """The Dagster instance configuration compose.yaml mounts as $DAGSTER_HOME/dagster.yaml."""
    compose = YAML(typ="safe").load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
    return compose["configs"]["dagster-instance"]["content"]


def test_the_dagster_pins_agree_everywhere() -> None:
    pins = _pins()
    assert pins["dagster"] == pins["dagster-webserver"] == metadata.version("dagster")
    assert metadata.version("dagster-webserver") == pins["dagster"]
    # dagster-postgres pins the one dagster it works with: the same as ours
    assert metadata.version("dagster-postgres") == pins["dagster-postgres"]
    requires = metadata.requires("dagster-postgres") or []
    assert f"dagster=={pins['dagster']}" in [r.replace(" ", "") for r in requires]
    # the image installs the postgres extra, with no pin of its own that could disagree
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r'pip install [^\n]*"\.\[postgres\]"', dockerfile)
    assert "dagster-postgres==" not in dockerfile and "dagster==" not in dockerfile
    # compose's instance uses dagster-postgres's storage; the local one SQLite (no storage key)
    instance = YAML(typ="safe").load(compose_instance_config())
    assert set(instance["storage"]) == {"postgres"}
    local = YAML(typ="safe").load((ROOT / "dagster.yaml").read_text(encoding="utf-8"))
    assert "storage" not in local


@pytest.fixture
def postgres_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh database on the test PostgreSQL, named to compose's DAGSTER_PG_* variables;
    dropped afterwards. Yields its URL."""
    if not POSTGRES_URL:
        pytest.skip("set THT_TEST_POSTGRES_URL (scripts/test.sh starts a throw-away "
                    "PostgreSQL) to run Dagster's storage on PostgreSQL")
    import psycopg

    name = f"tht_dagster_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = urlsplit(POSTGRES_URL)
    monkeypatch.setenv("DAGSTER_PG_HOST", url.hostname or "localhost")
    monkeypatch.setenv("DAGSTER_PG_PORT", str(url.port or 5432))
    monkeypatch.setenv("DAGSTER_PG_DB", name)
    monkeypatch.setenv("DAGSTER_PG_USERNAME", url.username or "postgres")
    # the test cluster trusts local connections; compose requires a password to be set
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", url.password or "unused-by-trust-auth")
    try:
        yield urlunsplit(url._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_jobs_run_and_event_log_land_in_postgres(demo_ws: Path, tmp_path: Path,
                                                   postgres_env: str) -> None:
    import psycopg

    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text(compose_instance_config(), encoding="utf-8")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
        result = defs.resolve_job_def("activate").execute_in_process(
            instance=instance, tags={"tht/trigger": "test"},
            run_config={"ops": {"activate_revision": {"config": {"revision": ""}}}},
            resources={"workspace": WorkspaceResource(root=str(demo_ws)),
                       "index": IndexResource(), "embedder": EmbedderResource(),
                       "model": ModelBackendResource()})
        assert result.success
        run_id = result.run_id
        stored = instance.get_run_by_id(run_id)
        assert stored is not None and stored.status == dg.DagsterRunStatus.SUCCESS

    # read back with plain SQL: the run and its event log are rows of that database
    with psycopg.connect(postgres_env) as conn:
        row = conn.execute("SELECT pipeline_name, status FROM runs WHERE run_id = %s",
                           (run_id,)).fetchone()
        assert row == ("activate", "SUCCESS")
        events = [r[0] for r in conn.execute(
            "SELECT dagster_event_type FROM event_logs WHERE run_id = %s ORDER BY id",
            (run_id,))]
        tags = dict(conn.execute("SELECT key, value FROM run_tags WHERE run_id = %s",
                                 (run_id,)).fetchall())
    kinds = dg.DagsterEventType
    assert {kinds.RUN_START.value, kinds.STEP_START.value, kinds.STEP_OUTPUT.value,
            kinds.STEP_SUCCESS.value} <= set(events)
    assert events[-1] == kinds.RUN_SUCCESS.value
    assert tags["tht/trigger"] == "test"
    assert result.output_for_node("activate_revision").revision == head(demo_ws)


def _wait(what: str, done: Any, timeout_s: float, daemon: subprocess.Popen[bytes],
          log: Path) -> Any:
    """Poll ``done()`` until it returns something true; fail with the daemon's log tail."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = done()
        if value:
            return value
        if daemon.poll() is not None:
            break
        time.sleep(1)
    tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
    raise AssertionError(f"{what}: not after {timeout_s} s (daemon exit {daemon.poll()})\n{tail}")


@pytest.mark.slow
def test_the_daemon_on_postgres_ticks_sensors_queues_their_runs_and_backfills_in_one_run(
        demo_ws: Path, tmp_path: Path, postgres_env: str) -> None:
    """The production instance (compose.yaml's configuration on PostgreSQL) with a real
    ``dagster-daemon``: the sensors tick (partitions added, notes observed), a committed note
    edit becomes a queued run the queue starts, and a backfill of every source is one run."""
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text(compose_instance_config(), encoding="utf-8")
    log = tmp_path / "daemon.log"
    env = {**os.environ, "DAGSTER_HOME": str(home), "THT_WORKSPACE": str(demo_ws)}
    env.pop("THT_QDRANT_URL", None)
    daemon = subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
                              cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            # a tick of source_partitions_sensor: one partition per note
            keys = _wait("source partitions", lambda: (
                lambda k: k if len(k) == 54 else None)(
                    instance.get_dynamic_partitions(SOURCE_PARTITIONS.name)), 240, daemon, log)
            # a tick of source_changes_sensor: every committed note observed
            _wait("evidence_source observed", lambda: instance.get_latest_data_version_record(
                dg.AssetKey("evidence_source"), True, NOTE), 240, daemon, log)

            # a backfill of every source, as the UI launches it: one run
            backfill_id = "tht" + uuid.uuid4().hex[:8]
            instance.add_backfill(PartitionBackfill.from_asset_partitions(
                backfill_id=backfill_id, asset_graph=defs.resolve_asset_graph(),
                partition_names=keys, asset_selection=[dg.AssetKey(s) for s in STAGES],
                backfill_timestamp=time.time(), tags={}, dynamic_partitions_store=instance,
                all_partitions=False, title=None, description=None, run_config=None))
            # a committed note edit: the next tick requests its preview, through the queue
            note = demo_ws / "evidence" / NOTE
            note.write_text(note.read_text(encoding="utf-8") + "\nUna riga in più.\n",
                            encoding="utf-8")
            commit(demo_ws, "a curator's edit")

            def finished(tags: dict[str, str]) -> list[dg.DagsterRun] | None:
                runs = instance.get_runs(dg.RunsFilter(tags=tags))
                return runs if runs and all(r.is_finished for r in runs) else None

            backfill_runs = _wait("the backfill's run", lambda: finished(
                {"dagster/backfill": backfill_id}), 420, daemon, log)
            _wait("the backfill done", lambda: instance.get_backfill(  # type: ignore[union-attr]
                backfill_id).status in (BulkActionStatus.COMPLETED_SUCCESS,
                                        BulkActionStatus.COMPLETED), 240, daemon, log)
            assert [r.status for r in backfill_runs] == [dg.DagsterRunStatus.SUCCESS]
            for stage in STAGES:
                assert instance.get_materialized_partitions(dg.AssetKey(stage)) >= set(keys)

            (preview,) = _wait("the sensor's queued run", lambda: finished(
                {"tht/trigger": "sensor", "tht/source": NOTE}), 420, daemon, log)
            assert preview.status == dg.DagsterRunStatus.SUCCESS
            assert preview.tags["dagster/partition"] == NOTE
            # it went through the queue: enqueued, then started by the daemon
            kinds = {e.event_log_entry.dagster_event_type for e in instance.get_records_for_run(
                preview.run_id).records}
            assert {dg.DagsterEventType.RUN_ENQUEUED, dg.DagsterEventType.RUN_START,
                    dg.DagsterEventType.RUN_SUCCESS} <= kinds
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
