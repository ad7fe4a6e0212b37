"""The one small error hierarchy of thoth-evidence.

Every error names what it is about (file, unit id, field) so that the CLI can print one clear
line; tracebacks are for bugs only.
"""

from __future__ import annotations


class EvidenceError(Exception):
    """Base class of every expected (user-facing) error.

    ``code`` is a stable machine-readable string; ``path``, ``evidence_id`` and ``field`` say
    what the error is about when known.
    """

    code: str = "evidence_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        path: str | None = None,
        evidence_id: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.path = path
        self.evidence_id = evidence_id
        self.field = field

    def __str__(self) -> str:
        where = [p for p in (self.path, self.evidence_id, self.field) if p]
        prefix = ": ".join(where)
        return f"{prefix}: {self.message}" if prefix else self.message


class UnitFormatError(EvidenceError):
    """A curated file cannot be read as an Evidence Unit (encoding, front matter, YAML)."""

    code = "unit_format"


class ConfigError(EvidenceError):
    """The workspace descriptor or a configuration value is missing or wrong."""

    code = "config_error"


class IndexError_(EvidenceError):
    """Base of index (Qdrant) errors."""

    code = "index_error"


class IndexUnavailableError(IndexError_):
    """The index cannot be reached (server down, shard missing or unreadable)."""

    code = "index_unreachable"


class IndexMissingError(IndexUnavailableError):
    """There is no index at the configured place (never published there, or lost)."""

    code = "index_unreachable"


class IndexLockedError(IndexError_):
    """The embedded shard is held by another process (Qdrant Edge takes an exclusive lock)."""

    code = "index_locked"


class IndexSchemaError(IndexError_):
    """The collection's vectors do not match what Evidence needs; nothing was changed."""

    code = "index_schema_mismatch"


class EmbedderError(EvidenceError):
    """The embedding model failed or returned something unusable."""

    code = "embedder_error"


class RegistryError(EvidenceError):
    """The registry (activated revision, generations) cannot be read or written."""

    code = "registry_error"


class RegistryLockedError(RegistryError):
    """Another writer held the registry longer than the busy/lock timeout; nothing was changed."""

    code = "registry_locked"


class RegistryCorruptError(RegistryError):
    """The registry's stored data cannot be read back (a damaged file or a corrupt value)."""

    code = "registry_corrupt"
