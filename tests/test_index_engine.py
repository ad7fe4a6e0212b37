"""One index per workspace: thoth.yaml's ``index.engine`` decides it, ``THT_QDRANT_URL`` is read in
one place (Workspace.index_url) by every entry point — the CLI, evaluate, ``search()`` and the
Dagster resources — and a contradiction between them is refused, the same way everywhere.

Before, with THT_QDRANT_URL set the Dagster IndexResource published to the server while the CLI,
evaluate and search() read the embedded shard of thoth.yaml's default ``engine: edge``.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

import evidence_runtime
from evidence_pipeline.definitions import resources
from evidence_pipeline.orchestration.monitoring import active_index_evaluation
from evidence_pipeline.orchestration.resources import (
    EmbedderResource,
    IndexResource,
    WorkspaceResource,
)
from evidence_runtime.errors import ConfigError
from evidence_runtime.search import EvidenceSearcher, index_config
from evidence_runtime.workspace import load_workspace
from tests.helpers import PublishedDemo, cli, copy_workspace, dagster_home, edit

SERVER = "http://qdrant.invalid:6333"
REFUSED = ("THT_QDRANT_URL is set but index.engine is 'edge': thoth.yaml decides the engine; "
           "set index.engine: server there to use the Qdrant server, or unset THT_QDRANT_URL")


@pytest.fixture
def published(published_demo: PublishedDemo, tmp_path: Path) -> Path:
    return copy_workspace(published_demo.ws, tmp_path / "ws")


def test_the_url_variable_with_an_edge_workspace_is_refused_by_every_entry_point(
        published: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("THT_QDRANT_URL", SERVER)
    ws = load_workspace(published)
    with pytest.raises(ConfigError) as raised:
        index_config(ws)
    assert (raised.value.field, raised.value.message) == ("index.engine", REFUSED)
    line = f"error: {published / 'thoth.yaml'}: index.engine: {REFUSED}"

    # the CLI: evaluate and publishing stop with the same one line
    for args in (["evidence", "evaluate", str(published)],
                 ["workspace", "preprocess", "evidence", str(published)]):
        out = cli(*args)
        assert out.exit_code == 2, (args, out.output)
        assert out.stderr.strip().splitlines()[-1] == line, args
    # search answers as the library does (DESIGN: a fault is an unavailable outcome), exit 1
    out = cli("evidence", "search", str(published), "Chi è pediatrico?",
              "--purpose", "sql_generation")
    assert out.exit_code == 1, out.output
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("unavailable (not_configured):") and REFUSED in last, last

    # the library: unavailable, not_configured, the same message
    monkeypatch.setenv("THT_WORKSPACE", str(published))
    evidence_runtime.reset()
    try:
        outcome = evidence_runtime.search("Chi è pediatrico?", "sql_generation")
    finally:
        evidence_runtime.reset()
    assert (outcome.status, outcome.code) == ("unavailable", "not_configured")
    assert REFUSED in (outcome.message or "")

    # Dagster: the resources read it the same way, and the run fails in one line
    assert IndexResource().model_dump() == {"api_key": None}
    assert "url" not in resources()["index"].model_dump()
    with dg.DagsterInstance.from_config(str(dagster_home(tmp_path))) as instance:
        result = dg.materialize(
            [active_index_evaluation], instance=instance, raise_on_error=False,
            resources={"workspace": WorkspaceResource(root=str(published)),
                       "index": IndexResource(), "embedder": EmbedderResource()})
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    description = failure.step_failure_data.user_failure_data.description
    assert description == f"config_error: {published / 'thoth.yaml'}: index.engine: {REFUSED}"


def test_a_server_workspace_takes_the_url_from_the_variable_everywhere(
        demo_ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edit(demo_ws / "thoth.yaml", "  engine: edge\n", "  engine: server\n  url: http://yaml:6333\n")
    ws = load_workspace(demo_ws)
    assert index_config(ws).url == "http://yaml:6333"
    monkeypatch.setenv("THT_QDRANT_URL", SERVER)
    cfg = index_config(ws)
    assert (cfg.engine, cfg.url, cfg.collection) == ("server", SERVER, "thoth_psd")
    # the Dagster resource and the runtime searcher: exactly the same target
    assert IndexResource().config(ws) == cfg
    assert IndexResource(api_key="k").config(ws) == cfg.model_copy(update={"api_key": "k"})


def test_a_generation_published_to_the_other_engine_is_named_as_such(
        published: Path) -> None:
    # the workspace moves to a server (qdrant-client's in-process mode): the active
    # generation's points are in the embedded shard, which this workspace no longer reads
    edit(published / "thoth.yaml", "  engine: edge\n",
         "  engine: server\n  url: ':memory:'\n  bm25: client\n")
    with EvidenceSearcher.for_workspace(published) as searcher:
        outcome = searcher.search("Chi è pediatrico?", "sql_generation")
    assert (outcome.status, outcome.code, outcome.generation) == (
        "unavailable", "generation_missing", 1)
    assert outcome.message == (
        "generation 1 was published to the edge index, but this workspace reads the server "
        "index (thoth.yaml index.engine): publish the activated revision again "
        "(tht workspace preprocess evidence)")
