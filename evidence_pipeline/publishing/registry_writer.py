"""The publisher's side of the registry: its schema and every change to it.

Invariants, kept by the database and by running every change in one write transaction:
generation numbers are monotonic per workspace and never reused (a counter on the workspace
row, not ``MAX(number) + 1``); at most one generation per workspace is ``active`` (a partial
unique index) and the workspace's pointer names exactly that one; activation retires the
previous active generation, activates the new one and moves the pointer all at once;
``activate_generation_and_revision`` also moves the activated revision in that same transaction
(``tht workspace publish``: no maintenance window), compare-and-set on both pointers.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from evidence_runtime.errors import ErrorCode, RegistryError
from evidence_runtime.registry import (
    SCHEMA_VERSION,
    Generation,
    GenerationStatus,
    Query,
    Registry,
)

__all__ = ["RegistryWriter"]

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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _dumps(value: Any, *, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise RegistryError(f"{what} is not JSON-serializable: {exc}", field=what) from None


def _check_id(value: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or value != value.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
        raise RegistryError(
            f"{what} must be a non-empty string without surrounding spaces, got {value!r}",
            field=what,
        )
    return value


class RegistryWriter(Registry):
    """The registry opened by the publisher: creates the schema on open, records revisions
    and generations, activates them."""

    def _prepare_schema(self) -> None:
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
        self._check_version(found)
        self._schema_seen = True

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

    def activate_generation_and_revision(
        self,
        workspace_id: str,
        number: int,
        *,
        expected: tuple[str | None, int | None],
    ) -> None:
        """Serve generation ``number``: its revision becomes the activated revision and it the
        active generation, in one transaction, so a reader never sees one pointer moved without
        the other (``tht workspace publish``: no maintenance window).

        Compare-and-set: ``expected`` is ``(activated_revision, active_generation)`` as the
        caller read them before building the candidate; when another writer moved either one
        since, :class:`RegistryError` ``registry_conflict`` and nothing changes. The generation
        must be a candidate or a retired one; the previous active generation becomes
        ``retired``.
        """
        _check_id(workspace_id, "workspace_id")
        now = _now()
        with self._tx("activate a generation and its revision in", write=True) as q:
            revision, active, _ = self._lock_workspace(q, workspace_id, now)
            if (revision, active) != tuple(expected):
                raise RegistryError(
                    f"workspace {workspace_id!r}: the registry changed while generation {number} "
                    f"was being built (expected revision {_short(expected[0])} and generation "
                    f"{expected[1]}, found revision {_short(revision)} and generation {active}); "
                    "nothing was switched, publish again",
                    code=ErrorCode.registry_conflict, path=self.location,
                )
            generation = self._select_generation(q, workspace_id, number)
            if generation is None:
                raise self._missing(workspace_id, number)
            if generation.status is GenerationStatus.failed:
                raise RegistryError(
                    f"workspace {workspace_id!r}: generation {number} failed and cannot be "
                    "activated",
                    path=self.location,
                )
            if generation.status is not GenerationStatus.active:
                q(
                    "UPDATE evidence_generation SET status = ?, updated_at = ? "
                    "WHERE workspace_id = ? AND status = ?",
                    (GenerationStatus.retired.value, now, workspace_id,
                     GenerationStatus.active.value),
                )
                q(
                    "UPDATE evidence_generation SET status = ?, activated_at = ?, updated_at = ? "
                    "WHERE workspace_id = ? AND number = ?",
                    (GenerationStatus.active.value, now, now, workspace_id, number),
                )
            if revision != generation.revision:
                q(
                    "UPDATE evidence_workspace SET activated_revision = ?, "
                    "revision_activated_at = ? WHERE workspace_id = ?",
                    (generation.revision, now, workspace_id),
                )
            q(
                "UPDATE evidence_workspace SET active_generation = ? WHERE workspace_id = ?",
                (number, workspace_id),
            )


def _short(revision: str | None) -> str:
    return "none" if revision is None else revision[:12]
