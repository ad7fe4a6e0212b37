"""The production stack's Dagster storage: a job's run and event log in PostgreSQL, through the
instance configuration compose.yaml mounts, on the throw-away PostgreSQL that scripts/test.sh
starts (THT_TEST_POSTGRES_URL); and the dagster / dagster-postgres pins of pyproject.toml, the
Dockerfile and compose.yaml agreeing with what is installed."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import dagster as dg
import pytest
from ruamel.yaml import YAML

from evidence_pipeline.definitions import defs
from evidence_pipeline.orchestration.resources import (
    EmbedderResource,
    IndexResource,
    ModelBackendResource,
    WorkspaceResource,
)
from tests.helpers import ROOT, head

POSTGRES_URL = os.environ.get("THT_TEST_POSTGRES_URL")


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
