"""The registry (spec §7.2, §8, §13.2): per workspace, the activated Git revision and the
generations of the Evidence index with the pointer to the active one.

One ``Registry`` class on two engines: SQLite (stdlib, the embedded default; WAL mode so readers
in other processes never wait for a writer) and PostgreSQL (psycopg 3, optional extra
``postgres``). The SQL is portable; a small adapter per engine hides the paramstyle, the
transaction start and the error types.

This is the read side: the runtime only reads the activated revision and the generations.
The publisher's ``RegistryWriter`` (``evidence_pipeline.publishing.registry_writer``) creates
the schema and makes every change, keeping the invariants listed there. A registry nobody has
written to yet (no schema) reads as empty. Every fault reading it back, a damaged file or a
stored value that is not what was written, is a :class:`RegistryError` (corrupt data:
code ``registry_corrupt``), never another exception.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Generator, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Self, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from evidence_runtime.closing import Closeable
from evidence_runtime.errors import ErrorCode, RegistryError, RegistryLockedError

__all__ = ["Generation", "GenerationStatus", "Registry"]

SCHEMA_VERSION = 1
_T = TypeVar("_T")
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


GEN_COLUMNS = (
    "g.workspace_id, g.number, g.revision, g.status, g.config, g.counts, g.evaluation, "
    "g.created_at, g.activated_at"
)

Query = Callable[..., list[tuple[Any, ...]]]


def _json_object(text: Any) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {type(value).__name__}, not an object")
    return cast(dict[str, Any], value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{type(value).__name__}, not text")
    return value


def read_generation(row: Sequence[Any], location: str) -> Generation:
    """A generation from its stored row; :class:`RegistryError` ``registry_corrupt`` naming the
    column at fault when the row is not what the registry writes."""
    ws, number, revision, status, config, counts, evaluation, created, activated = row

    def read(column: str, parse: Callable[[Any], _T], value: Any) -> _T:
        try:
            return parse(value)
        except (ValueError, TypeError) as exc:  # JSONDecodeError and bad enum values included
            raise RegistryError(
                f"the registry is corrupt: generation {number!r} of workspace {ws!r}: "
                f"column {column} cannot be read back ({exc})",
                code=ErrorCode.registry_corrupt, path=location,
            ) from None

    return Generation(
        workspace_id=read("workspace_id", _text, ws),
        number=read("number", int, number),
        revision=read("revision", _text, revision),
        status=read("status", GenerationStatus, status),
        config=read("config", _json_object, config),
        counts=read("counts", _json_object, counts),
        evaluation=None if evaluation is None else read("evaluation", _json_object, evaluation),
        created_at=read("created_at", _text, created),
        activated_at=None if activated is None else read("activated_at", _text, activated),
    )


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
        primary = code & 0xFF if isinstance(code, int) else None  # extended codes keep it low
        if primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            return RegistryError(
                f"cannot {action} the registry: the file is corrupt ({text})",
                code=ErrorCode.registry_corrupt, path=self.location,
            )
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in text:
            return RegistryLockedError(
                f"cannot {action} the registry: it is locked by another writer "
                f"(waited {self.timeout:g} s); nothing was changed, retry later",
                path=self.location,
            )
        return RegistryError(f"cannot {action} the registry: {text}", path=self.location)

    @contextmanager
    def transaction(self, *, write: bool) -> Generator[Query, None, None]:
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
    def transaction(self, *, write: bool) -> Generator[Query, None, None]:
        if self.conn is None or self.conn.closed:
            self._connect()  # the server went away and came back: one new connection
        conn: Any = self.conn

        def q(sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
            cur = conn.execute(sql.replace("?", "%s"), tuple(params))
            return cur.fetchall() if cur.description is not None else []

        with conn.transaction():
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


class Registry(Closeable):
    """The registry of one installation (all workspaces), read-only; safe to share between
    threads."""

    def __init__(self, adapter: _Adapter) -> None:
        self._adapter = adapter
        self._lock = threading.RLock()
        self._closed = False
        self._schema_seen = False

    @classmethod
    def open(cls, url_or_path: str | Path, *, timeout: float = DEFAULT_TIMEOUT_S) -> Self:
        """Open a SQLite file or a ``postgresql://`` URL.

        ``timeout`` is how long a transaction waits for a lock held by a writer before failing
        with ``RegistryLockedError``. A schema newer than this program is :class:`RegistryError`.
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
            registry._prepare_schema()
        except BaseException:
            adapter.close()
            raise
        return registry

    @property
    def location(self) -> str:
        """Where the registry lives (a path, or a URL without its password)."""
        return self._adapter.location

    def close(self) -> None:
        """Close the connection; idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._adapter.close()

    # -- plumbing

    @contextmanager
    def _tx(self, action: str, *, write: bool) -> Generator[Query, None, None]:
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
        if not rows:
            return None
        try:
            return int(rows[0][0])
        except (ValueError, TypeError):
            raise RegistryError(
                f"the registry is corrupt: schema version {rows[0][0]!r} is not a number",
                code=ErrorCode.registry_corrupt, path=self.location,
            ) from None

    def _check_version(self, found: int | None) -> None:
        if found is None or found > SCHEMA_VERSION:
            raise RegistryError(
                f"registry schema version {found} is not supported by this program "
                f"(it knows version {SCHEMA_VERSION}); upgrade thoth-evidence",
                path=self.location,
            )

    def _prepare_schema(self) -> None:
        """Check the schema version when there is a schema (a reader never creates one)."""
        with self._tx("read the schema of", write=False) as q:
            self._has_schema(q)

    def _has_schema(self, q: Query) -> bool:
        """Whether the schema exists (checked until it does; then remembered)."""
        if not self._schema_seen:
            found = self._schema_version(q)
            if found is None:
                return False
            self._check_version(found)
            self._schema_seen = True
        return True

    @contextmanager
    def _read(self) -> Generator[Query | None, None, None]:
        """A read transaction; ``None`` instead of a query while nothing was ever written."""
        with self._tx("read", write=False) as q:
            yield q if self._has_schema(q) else None

    def _generation(self, row: Sequence[Any]) -> Generation:
        return read_generation(row, self.location)

    def _select_generation(self, q: Query, workspace_id: str, number: int) -> Generation | None:
        rows = q(
            f"SELECT {GEN_COLUMNS} FROM evidence_generation g "
            "WHERE g.workspace_id = ? AND g.number = ?",
            (workspace_id, number),
        )
        return self._generation(rows[0]) if rows else None

    # -- reads

    def activated_revision(self, workspace_id: str) -> str | None:
        """The activated Git revision, or None when none was ever activated."""
        with self._read() as q:
            if q is None:
                return None
            rows = q(
                "SELECT activated_revision FROM evidence_workspace WHERE workspace_id = ?",
                (workspace_id,),
            )
        return self._revision(rows[0][0]) if rows else None

    def _revision(self, value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value
        raise RegistryError(
            f"the registry is corrupt: the activated revision is {type(value).__name__}, "
            "not text",
            code=ErrorCode.registry_corrupt, path=self.location,
        )

    def active_generation(self, workspace_id: str) -> Generation | None:
        """The generation the pointer names, or None."""
        return self.active_state(workspace_id)[1]

    def active_state(self, workspace_id: str) -> tuple[str | None, Generation | None]:
        """``(activated_revision, active_generation)`` read in one query (the hot path)."""
        with self._read() as q:
            if q is None:
                return None, None
            rows = q(
                f"SELECT w.activated_revision, {GEN_COLUMNS} FROM evidence_workspace w "
                "LEFT JOIN evidence_generation g "
                "ON g.workspace_id = w.workspace_id AND g.number = w.active_generation "
                "WHERE w.workspace_id = ?",
                (workspace_id,),
            )
        if not rows:
            return None, None
        revision, *generation = rows[0]
        return self._revision(revision), (
            None if generation[0] is None else self._generation(generation)
        )

    def get_generation(self, workspace_id: str, number: int) -> Generation | None:
        """One generation, or None."""
        with self._read() as q:
            return None if q is None else self._select_generation(q, workspace_id, number)

    def generations(self, workspace_id: str) -> list[Generation]:
        """Every generation of the workspace, newest first."""
        with self._read() as q:
            if q is None:
                return []
            rows = q(
                f"SELECT {GEN_COLUMNS} FROM evidence_generation g WHERE g.workspace_id = ? "
                "ORDER BY g.number DESC",
                (workspace_id,),
            )
        return [self._generation(row) for row in rows]

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
        with self._read() as q:
            if q is None:
                return None
            rows = q(
                f"SELECT {GEN_COLUMNS} FROM evidence_generation g "
                f"WHERE g.workspace_id = ? AND g.revision = ? AND g.status IN ({marks}) "
                "ORDER BY g.number DESC LIMIT 1",
                (workspace_id, revision, *wanted),
            )
        return self._generation(rows[0]) if rows else None
