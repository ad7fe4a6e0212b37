"""The production stack's configuration (compose.yaml) is consistent and its default starts
(issue 27 item 4): the services start in order on healthy dependencies, the run queue's limit
matches the code location's pools, and the default mount (an empty ./demo-workspace) becomes a
workspace every entry point accepts with the stack's environment (THT_QDRANT_URL set), by
running workspace-init's own script here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from evidence_pipeline.definitions import defs
from evidence_pipeline.demo import create_demo_repo, git
from evidence_runtime.errors import ConfigError
from evidence_runtime.search import index_config
from evidence_runtime.workspace import load_workspace
from tests.helpers import ROOT

BIN = Path(sys.executable).parent
PIPELINE = ("dagster-webserver", "dagster-daemon")


def compose() -> dict[str, Any]:
    return YAML(typ="safe").load((ROOT / "compose.yaml").read_text(encoding="utf-8"))


def interpolated(value: str, env: dict[str, str]) -> str:
    """A compose value after compose's interpolation (``$$`` is a literal ``$``)."""
    def sub(match: re.Match[str]) -> str:
        name, _, default = match.group(1).partition(":-")
        name = name.split(":?")[0]
        return env.get(name, default)

    return re.sub(r"(?<!\$)\$\{([^}]+)\}", sub, value).replace("$$", "$")


def stack_env(workspace: Path) -> dict[str, str]:
    """The pipeline services' environment, as compose gives it, with the workspace at
    ``workspace`` instead of /workspace."""
    given = {"DAGSTER_PG_PASSWORD": "secret"}
    env = {k: interpolated(str(v), given)
           for k, v in compose()["x-pipeline-env"].items()}
    env["THT_WORKSPACE"] = str(workspace)
    env["THT_STATE_DIR"] = str(workspace.parent / "state")
    return env


def entry_point_check(workspace: Path, env: dict[str, str],
                      monkeypatch: pytest.MonkeyPatch) -> str:
    """What every entry point does first: thoth.yaml read and the index resolved, with the
    stack's environment."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ws = load_workspace(workspace)
    return index_config(ws).url or ""


def test_services_start_in_order_on_healthy_dependencies() -> None:
    doc = compose()
    services = doc["services"]
    assert set(services) == {"workspace-init", "qdrant", "postgres", *PIPELINE}
    for name in ("qdrant", "postgres"):
        assert services[name]["healthcheck"]["test"], name
    assert "/readyz" in " ".join(services["qdrant"]["healthcheck"]["test"])
    for name in PIPELINE:
        assert services[name]["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "qdrant": {"condition": "service_healthy"},
            "workspace-init": {"condition": "service_completed_successfully"}}, name
        # the same image, environment and workspace mount as workspace-init
        assert services[name]["image"] == services["workspace-init"]["image"]
        assert services[name]["environment"] == services["workspace-init"]["environment"]
        assert services[name]["volumes"][0] == services["workspace-init"]["volumes"][0]
    assert services["workspace-init"]["restart"] == "no"


def _pools() -> set[str]:
    pools: set[str] = set()
    for job in defs.jobs or []:
        for op in defs.resolve_job_def(job.name).graph.iterate_op_defs():
            if op.pool:
                pools.add(op.pool)
    return pools


@pytest.mark.parametrize("where", ["compose", "local"])
def test_the_run_limit_is_one_run_per_pool(where: str) -> None:
    text = (compose()["configs"]["dagster-instance"]["content"] if where == "compose"
            else (ROOT / "dagster.yaml").read_text(encoding="utf-8"))
    instance = YAML(typ="safe").load(text)
    pools = _pools()
    assert pools == {"index", "authoring"}
    concurrency = instance["concurrency"]
    assert concurrency["pools"] == {"granularity": "run", "default_limit": 1}
    assert concurrency["runs"]["max_concurrent_runs"] == len(pools)
    # the comment says so too: "two runs at a time, one per pool"
    assert re.search(r"\btwo\b[^\n]*at a time", text) and "four runs" not in text


def init_script() -> str:
    command = compose()["services"]["workspace-init"]["command"]
    assert command[:2] == ["sh", "-ec"]
    return interpolated(command[2], {})


def run_init(workspace: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **stack_env(workspace),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["sh", "-ec", init_script()], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.mark.slow
def test_the_default_mount_becomes_a_workspace_every_entry_point_accepts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the demo as it ships says engine: edge: with the stack's THT_QDRANT_URL every entry
    # point refuses it (what `docker compose up` met)
    demo = create_demo_repo(tmp_path / "demo")
    with pytest.raises(ConfigError, match=r"THT_QDRANT_URL is set but index\.engine is 'edge'"):
        entry_point_check(demo, stack_env(demo), monkeypatch)

    mount = tmp_path / "mount"
    mount.mkdir()  # what Docker creates for a missing ./demo-workspace
    done = run_init(mount)
    assert done.returncode == 0, done.stderr
    assert "index.engine: server" in done.stdout and "configuration accepted" in done.stdout
    assert load_workspace(mount).config.index.engine == "server"
    assert git(mount, "status", "--porcelain") == ""  # committed: activate HEAD works
    assert entry_point_check(mount, stack_env(mount), monkeypatch) == "http://qdrant:6333"

    # a second start keeps the workspace as it is
    head = git(mount, "rev-parse", "HEAD")
    assert run_init(mount).returncode == 0
    assert git(mount, "rev-parse", "HEAD") == head

    # a workspace of one's own that says engine: edge stops the stack with the reason
    refused = run_init(demo)
    assert refused.returncode != 0
    assert "THT_QDRANT_URL is set but index.engine is 'edge'" in refused.stderr


@pytest.mark.parametrize("where", ["compose", "local"])
def test_runs_log_at_info_without_dagsters_debug_events(
        where: str, tmp_path: Path, demo_ws: Path, capfd: pytest.CaptureFixture[str]) -> None:
    import dagster as dg

    from evidence_pipeline.orchestration.runs import _resources

    text = (compose()["configs"]["dagster-instance"]["content"] if where == "compose"
            else (ROOT / "dagster.yaml").read_text(encoding="utf-8"))
    assert YAML(typ="safe").load(text)["python_logs"] == {"python_log_level": "INFO"}
    home = tmp_path / "home"
    home.mkdir()
    # the local file as is; compose's own storage needs its PostgreSQL (test_dagster_postgres)
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text(encoding="utf-8"),
                                       encoding="utf-8")
    capfd.readouterr()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.python_log_level == "INFO"
        result = defs.resolve_job_def("activate").execute_in_process(
            instance=instance, resources=_resources(demo_ws),
            run_config={"ops": {"activate_revision": {"config": {"revision": ""}}}})
    assert result.success
    lines = [line for line in capfd.readouterr().err.splitlines() if " - dagster - " in line]
    assert any(" - INFO - " in line and "activated" in line for line in lines), lines
    assert not [line for line in lines if " - DEBUG - " in line]
