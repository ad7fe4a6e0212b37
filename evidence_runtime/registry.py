"""The registry (spec §7.2, §8, §13.2): per workspace, the activated Git revision and the
generations of the Evidence index with the pointer to the active one.

One ``Registry`` class on two engines: SQLite (stdlib, the embedded default; WAL mode so readers
in other processes never wait for a writer) and PostgreSQL (psycopg 3, optional extra
``postgres``). The SQL is portable; a small adapter per engine hides the paramstyle, the
transaction start and the error types.

Invariants, kept by the database and by running every change in one write transaction:
generation numbers are monotonic per workspace and never reused (a counter on the workspace
row, not ``MAX(number) + 1``); at most one generation per workspace is ``active`` (a partial
unique index) and the workspace's pointer names exactly that one; activation retires the
previous active generation, activates the new one and moves the pointer all at once.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from evidence_runtime.errors import RegistryError, RegistryLockedError

__all__ = ["Generation", "GenerationStatus", "Registry"]

SCHEMA_VERSION = 1
DEFAULT_TIMEOUT_S = 30.0


class GenerationStatus(StrEnum):
    candidate = "candidate"
    active = "active"
    retired = "retired"
    failed = "failed"


@dataclass(frozen=True)
class Generation:
    """One Evidence index generation as recorded in the registry."""

    workspace_id: str
    number: int
    revision: str
    status: GenerationStatus
    config: dict[str, Any]
    counts: dict[str, Any]
    evaluation: dict[str, Any] | None
    created_at: str
    activated_at: str | None


# Portable DDL: TEXT timestamps (ISO 8601 UTC, written by Python) and TEXT JSON keep one schema
# for both engines; a partial unique index holds "one active generation per workspace".
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS evidence_registry_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS evidence_workspace (
        workspace_id TEXT PRIMARY KEY,
        activated_revision TEXT,
        revision_activated_at TEXT,
        active_generation INTEGER,
        next_generation INTEGER NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS evidence_generation (
        workspace_id TEXT NOT NULL REFERENCES evidence_workspace (workspace_id),
        number INTEGER NOT NULL,
        revision TEXT NOT NULL,
        status TEXT NOT NULL
            CHECK (status IN ('candidate', 'active', 'retired', 'failed')),
        config TEXT NOT NULL,
        counts TEXT NOT NULL,
        evaluation TEXT,
        created_at TEXT NOT NULL,
        activated_at TEXT,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (workspace_id, number)
    )""",
    """CREATE UNIQUE INDEX IF NOT EXISTS evidence_generation_one_active
        ON evidence_generation (workspace_id) WHERE status = 'active'""",
    """CREATE INDEX IF NOT EXISTS evidence_generation_by_revision
        ON evidence_generation (workspace_id, revision, number)""",
)

_GEN_COLUMNS = (
    "g.workspace_id, g.number, g.revision, g.status, g.config, g.counts, g.evaluation, "
    "g.created_at, g.activated_at"
)

Query = Callable[..., list[tuple[Any, ...]]]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _dumps(value: Any, *, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise RegistryError(f"{what} is not JSON-serializable: {exc}", field=what) from None


def _generation(row: Sequence[Any]) -> Generation:
    ws, number, revision, status, config, counts, evaluation, created, activated = row
    return Generation(
        workspace_id=ws,
        number=int(number),
        revision=revision,
        status=GenerationStatus(status),
        config=json.loads(config),
        counts=json.loads(counts),
        evaluation=None if evaluation is None else json.loads(evaluation),
        created_at=created,
        activated_at=activated,
    )


def _check_id(value: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise RegistryError(
            f"{what} must be a non-empty string without surrounding spaces, got {value!r}",
            field=what,
        )
    return value


# --------------------------------------------------------------------------- engine adapters


class _Adapter:
    """One connection to one engine; callers hold ``Registry._lock`` around every use."""

    location: str
    errors: tuple[type[Exception], ...]

    def translate(self, exc: BaseException, action: str) -> RegistryError:
        raise NotImplementedError

    def transaction(self, *, write: bool) -> Any:  # context manager yielding a Query
        raise NotImplementedError

    def lock_schema(self, q: Query) -> None:
        """Serialize concurrent schema creation (SQLite's write transaction already does)."""

    def has_table(self, q: Query, name: str) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _SqliteAdapter(_Adapter):
    def __init__(self, path: Path, timeout: float) -> None:
        self.location = str(path)
        self.timeout = timeout
        self.errors = (sqlite3.Error,)
        conn: sqlite3.Connection | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit mode: transactions are started explicitly below, so that writers take
            # the write lock up front (BEGIN IMMEDIATE) and wait for it with the busy timeout
            # instead of failing on a lock upgrade.
            conn = sqlite3.connect(
                str(path), timeout=timeout, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise RegistryError(
                    f"cannot switch the registry to WAL mode (got {mode!r})", path=self.location
                )
            conn.execute("PRAGMA foreign_keys = ON")
        except (sqlite3.Error, OSError, RegistryError) as exc:
            if conn is not None:
                conn.close()
            raise self.translate(exc, "open") from None
        self.conn = conn

    def translate(self, exc: BaseException, action: str) -> RegistryError:
        if isinstance(exc, RegistryError):
            return exc
        code = getattr(exc, "sqlite_errorcode", None)
        text = str(exc)
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in text:
            return RegistryLockedError(
                f"cannot {action} the registry: it is locked by another writer "
                f"(waited {self.timeout:g} s); nothing was changed, retry later",
                path=self.location,
            )
        return RegistryError(f"cannot {action} the registry: {text}", path=self.location)

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[Query]:
        def q(sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
            return self.conn.execute(sql, tuple(params)).fetchall()

        self.conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield q
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    def has_table(self, q: Query, name: str) -> bool:
        return bool(q("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)))

    def close(self) -> None:
        self.conn.close()


def _redact(url: str) -> str:
    """The URL without its password (in the authority or as a parameter), for messages."""
    try:
        parts = urlsplit(url)
        if parts.password is not None:
            host = parts.netloc.rpartition("@")[2]
            parts = parts._replace(netloc=f"{parts.username}:***@{host}")
        if "password" in parts.query:
            query = [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)]
            parts = parts._replace(query=urlencode(query, safe="*"))
        return urlunsplit(parts)
    except ValueError:
        return "postgresql://…"


class _PostgresAdapter(_Adapter):
    def __init__(self, url: str, timeout: float) -> None:
        self.location = _redact(url)
        self.url = url
        self.timeout = timeout
        try:
            import psycopg
        except ImportError:
            raise RegistryError(
                "a postgresql:// registry needs psycopg 3: install thoth-evidence[postgres]",
                path=self.location,
            ) from None
        self.psycopg = psycopg
        self.errors = (psycopg.Error,)
        self.conn: Any = None
        self._connect()

    def _connect(self) -> None:
        psycopg = self.psycopg
        try:
            self.conn = psycopg.connect(
                self.url, autocommit=True, connect_timeout=max(1, int(self.timeout))
            )
            # The row-lock wait mirrors SQLite's busy timeout.
            self.conn.execute(f"SET lock_timeout = {int(self.timeout * 1000)}")
        except psycopg.Error as exc:
            raise self.translate(exc, "open") from None

    def translate(self, exc: BaseException, action: str) -> RegistryError:
        if isinstance(exc, RegistryError):
            return exc
        errors = self.psycopg.errors
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, errors.LockNotAvailable | errors.DeadlockDetected):
            return RegistryLockedError(
                f"cannot {action} the registry: it is locked by another writer "
                f"(waited {self.timeout:g} s); nothing was changed, retry later",
                path=self.location,
            )
        if isinstance(exc, self.psycopg.OperationalError):
            return RegistryError(
                f"cannot {action} the registry: server unreachable: {text}", path=self.location
            )
        return RegistryError(f"cannot {action} the registry: {text}", path=self.location)

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[Query]:
        if self.conn is None or self.conn.closed:
            self._connect()  # the server went away and came back: one new connection

        def q(sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
            cur = self.conn.execute(sql.replace("?", "%s"), tuple(params))
            return cur.fetchall() if cur.description is not None else []

        with self.conn.transaction():
            yield q

    def lock_schema(self, q: Query) -> None:
        # Two processes running CREATE TABLE IF NOT EXISTS at once can still collide in
        # pg_type; a transaction-scoped advisory lock serializes them.
        q("SELECT pg_advisory_xact_lock(?)", (0x7448_5452,))

    def has_table(self, q: Query, name: str) -> bool:
        return q("SELECT to_regclass(?)", (name,))[0][0] is not None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


# --------------------------------------------------------------------------- the registry


class Registry:
    """The registry of one installation (all workspaces); safe to share between threads."""

    def __init__(self, adapter: _Adapter) -> None:
        self._adapter = adapter
        self._lock = threading.RLock()
        self._closed = False

    @classmethod
    def open(cls, url_or_path: str | Path, *, timeout: float = DEFAULT_TIMEOUT_S) -> Registry:
        """Open (creating the schema if needed) a SQLite file or a ``postgresql://`` URL.

        ``timeout`` is how long a write waits for another writer before failing with
        ``RegistryLockedError``.
        """
        target = str(url_or_path)
        adapter: _Adapter
        if target.startswith(("postgresql://", "postgres://")):
            adapter = _PostgresAdapter(target, timeout)
        else:
            if target.startswith("sqlite:///"):
                target = target.removeprefix("sqlite:///")  # SQLAlchemy form
            adapter = _SqliteAdapter(Path(target), timeout)
        registry = cls(adapter)
        try:
            registry._create_schema()
        except BaseException:
            adapter.close()
            raise
        return registry

    @property
    def location(self) -> str:
        """Where the registry lives (a path, or a URL without its password)."""
        return self._adapter.location

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._adapter.close()

    # -- plumbing

    @contextmanager
    def _tx(self, action: str, *, write: bool) -> Iterator[Query]:
        with self._lock:
            if self._closed:
                raise RegistryError(
                    f"cannot {action} the registry: it is closed", path=self.location
                )
            adapter = self._adapter
            try:
                with adapter.transaction(write=write) as q:
                    yield q
            except adapter.errors as exc:
                # Only the engine's own errors are translated; anything else is a bug.
                raise adapter.translate(exc, action) from exc

    def _schema_version(self, q: Query) -> int | None:
        if not self._adapter.has_table(q, "evidence_registry_meta"):
            return None
        rows = q("SELECT value FROM evidence_registry_meta WHERE key = 'schema_version'")
        return int(rows[0][0]) if rows else None

    def _create_schema(self) -> None:
        # Checked in a read transaction first: opening an existing registry must not wait
        # for the write lock, or a reader would block behind a long writer.
        with self._tx("read the schema of", write=False) as q:
            found = self._schema_version(q)
        if found is None:
            with self._tx("create the schema of", write=True) as q:
                self._adapter.lock_schema(q)
                for statement in _SCHEMA:
                    q(statement)
                q(
                    "INSERT INTO evidence_registry_meta (key, value) "
                    "VALUES ('schema_version', ?) ON CONFLICT (key) DO NOTHING",
                    (str(SCHEMA_VERSION),),
                )
                found = self._schema_version(q)
        if found is None or found > SCHEMA_VERSION:
            raise RegistryError(
                f"registry schema version {found} is not supported by this program "
                f"(it knows version {SCHEMA_VERSION}); upgrade thoth-evidence",
                path=self.location,
            )

    @staticmethod
    def _lock_workspace(q: Query, workspace_id: str, now: str) -> tuple[Any, ...]:
        """Create the workspace row if missing and lock it for this write transaction.

        The UPDATE takes the row lock on PostgreSQL, so every write to one workspace is
        serialized there; on SQLite the write transaction is already exclusive.
        """
        q(
            "INSERT INTO evidence_workspace (workspace_id, next_generation, updated_at) "
            "VALUES (?, 1, ?) ON CONFLICT (workspace_id) DO NOTHING",
            (workspace_id, now),
        )
        q(
            "UPDATE evidence_workspace SET updated_at = ? WHERE workspace_id = ?",
            (now, workspace_id),
        )
        return q(
            "SELECT activated_revision, active_generation, next_generation "
            "FROM evidence_workspace WHERE workspace_id = ?",
            (workspace_id,),
        )[0]

    @staticmethod
    def _select_generation(q: Query, workspace_id: str, number: int) -> Generation | None:
        rows = q(
            f"SELECT {_GEN_COLUMNS} FROM evidence_generation g "
            "WHERE g.workspace_id = ? AND g.number = ?",
            (workspace_id, number),
        )
        return _generation(rows[0]) if rows else None

    def _missing(self, workspace_id: str, number: int) -> RegistryError:
        return RegistryError(
            f"workspace {workspace_id!r} has no generation {number}", path=self.location
        )

    # -- revisions

    def activate_revision(self, workspace_id: str, revision: str) -> None:
        """Record ``revision`` as the workspace's activated Git revision.

        The active generation is left alone: until a generation built from this revision is
        activated, the runtime sees a mismatch and answers unavailable (spec §13.2).
        """
        _check_id(workspace_id, "workspace_id")
        _check_id(revision, "revision")
        now = _now()
        with self._tx("activate a revision in", write=True) as q:
            self._lock_workspace(q, workspace_id, now)
            q(
                "UPDATE evidence_workspace SET activated_revision = ?, revision_activated_at = ? "
                "WHERE workspace_id = ?",
                (revision, now, workspace_id),
            )

    def activated_revision(self, workspace_id: str) -> str | None:
        """The activated Git revision, or None when none was ever activated."""
        with self._tx("read", write=False) as q:
            rows = q(
                "SELECT activated_revision FROM evidence_workspace WHERE workspace_id = ?",
                (workspace_id,),
            )
        return rows[0][0] if rows else None

    # -- generations

    def new_generation(
        self, workspace_id: str, revision: str, config: dict[str, Any]
    ) -> Generation:
        """Record a new ``candidate`` generation with the next number (never reused)."""
        _check_id(workspace_id, "workspace_id")
        _check_id(revision, "revision")
        config_json = _dumps(config, what="config")
        now = _now()
        with self._tx("record a new generation in", write=True) as q:
            _, _, number = self._lock_workspace(q, workspace_id, now)
            q(
                "INSERT INTO evidence_generation (workspace_id, number, revision, status, "
                "config, counts, evaluation, created_at, activated_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, NULL, ?, NULL, ?)",
                (
                    workspace_id,
                    number,
                    revision,
                    GenerationStatus.candidate.value,
                    config_json,
                    "{}",
                    now,
                    now,
                ),
            )
            q(
                "UPDATE evidence_workspace SET next_generation = ? WHERE workspace_id = ?",
                (number + 1, workspace_id),
            )
            generation = self._select_generation(q, workspace_id, number)
        assert generation is not None
        return generation

    def update_generation(
        self,
        workspace_id: str,
        number: int,
        *,
        counts: dict[str, Any] | None = None,
        evaluation: dict[str, Any] | None = None,
        status: GenerationStatus | str | None = None,
    ) -> Generation:
        """Replace the counts and/or evaluation summary and/or set the status.

        ``active`` is reached only through ``activate_generation``, and the active generation
        leaves that status only when another one is activated.
        """
        new_status = None if status is None else GenerationStatus(status)
        if new_status is GenerationStatus.active:
            raise RegistryError(
                f"generation {number}: use activate_generation to make a generation active",
                field="status",
            )
        sets: list[str] = []
        params: list[Any] = []
        if counts is not None:
            sets.append("counts = ?")
            params.append(_dumps(counts, what="counts"))
        if evaluation is not None:
            sets.append("evaluation = ?")
            params.append(_dumps(evaluation, what="evaluation"))
        now = _now()
        with self._tx("update a generation in", write=True) as q:
            self._lock_workspace(q, workspace_id, now)
            current = self._select_generation(q, workspace_id, number)
            if current is None:
                raise self._missing(workspace_id, number)
            if new_status is not None and new_status is not current.status:
                if current.status is GenerationStatus.active:
                    raise RegistryError(
                        f"workspace {workspace_id!r}: generation {number} is active; activate "
                        "another generation instead of changing its status",
                        field="status",
                    )
                sets.append("status = ?")
                params.append(new_status.value)
            if sets:
                q(
                    f"UPDATE evidence_generation SET {', '.join(sets)}, updated_at = ? "
                    "WHERE workspace_id = ? AND number = ?",
                    (*params, now, workspace_id, number),
                )
            updated = self._select_generation(q, workspace_id, number)
        assert updated is not None
        return updated

    def activate_generation(self, workspace_id: str, number: int) -> None:
        """Make generation ``number`` the active one, in one transaction.

        The previous active generation becomes ``retired`` and the pointer moves. The
        generation must be a candidate or a retired one (rollback) built from the activated
        revision; activating the already active generation is a no-op.
        """
        now = _now()
        with self._tx("activate a generation in", write=True) as q:
            revision, active, _ = self._lock_workspace(q, workspace_id, now)
            generation = self._select_generation(q, workspace_id, number)
            if generation is None:
                raise self._missing(workspace_id, number)
            if generation.status is GenerationStatus.active and active == number:
                return
            if generation.status is GenerationStatus.failed:
                raise RegistryError(
                    f"workspace {workspace_id!r}: generation {number} failed and cannot be "
                    "activated",
                    path=self.location,
                )
            if revision is None:
                raise RegistryError(
                    f"workspace {workspace_id!r}: no revision is activated; activate revision "
                    f"{generation.revision} before generation {number}",
                    path=self.location,
                )
            if generation.revision != revision:
                raise RegistryError(
                    f"workspace {workspace_id!r}: generation {number} was built from revision "
                    f"{generation.revision}, but the activated revision is {revision}; "
                    "activate that revision first",
                    path=self.location,
                )
            q(
                "UPDATE evidence_generation SET status = ?, updated_at = ? "
                "WHERE workspace_id = ? AND status = ?",
                (GenerationStatus.retired.value, now, workspace_id, GenerationStatus.active.value),
            )
            q(
                "UPDATE evidence_generation SET status = ?, activated_at = ?, updated_at = ? "
                "WHERE workspace_id = ? AND number = ?",
                (GenerationStatus.active.value, now, now, workspace_id, number),
            )
            q(
                "UPDATE evidence_workspace SET active_generation = ? WHERE workspace_id = ?",
                (number, workspace_id),
            )

    def active_generation(self, workspace_id: str) -> Generation | None:
        """The generation the pointer names, or None."""
        return self.active_state(workspace_id)[1]

    def active_state(self, workspace_id: str) -> tuple[str | None, Generation | None]:
        """``(activated_revision, active_generation)`` read in one query (the hot path)."""
        with self._tx("read", write=False) as q:
            rows = q(
                f"SELECT w.activated_revision, {_GEN_COLUMNS} FROM evidence_workspace w "
                "LEFT JOIN evidence_generation g "
                "ON g.workspace_id = w.workspace_id AND g.number = w.active_generation "
                "WHERE w.workspace_id = ?",
                (workspace_id,),
            )
        if not rows:
            return None, None
        revision, *generation = rows[0]
        return revision, (None if generation[0] is None else _generation(generation))

    def get_generation(self, workspace_id: str, number: int) -> Generation | None:
        """One generation, or None."""
        with self._tx("read", write=False) as q:
            return self._select_generation(q, workspace_id, number)

    def generations(self, workspace_id: str) -> list[Generation]:
        """Every generation of the workspace, newest first."""
        with self._tx("read", write=False) as q:
            rows = q(
                f"SELECT {_GEN_COLUMNS} FROM evidence_generation g WHERE g.workspace_id = ? "
                "ORDER BY g.number DESC",
                (workspace_id,),
            )
        return [_generation(row) for row in rows]

    def latest_generation_for_revision(
        self,
        workspace_id: str,
        revision: str,
        *,
        statuses: Sequence[GenerationStatus | str] = (
            GenerationStatus.active,
            GenerationStatus.retired,
        ),
    ) -> Generation | None:
        """The newest generation built from ``revision`` with one of ``statuses`` (rollback)."""
        wanted = [GenerationStatus(s).value for s in statuses]
        if not wanted:
            return None
        marks = ", ".join("?" for _ in wanted)
        with self._tx("read", write=False) as q:
            rows = q(
                f"SELECT {_GEN_COLUMNS} FROM evidence_generation g "
                f"WHERE g.workspace_id = ? AND g.revision = ? AND g.status IN ({marks}) "
                "ORDER BY g.number DESC LIMIT 1",
                (workspace_id, revision, *wanted),
            )
        return _generation(rows[0]) if rows else None
