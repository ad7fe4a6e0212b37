"""The one small error hierarchy of thoth-evidence.

Every error names what it is about (file, unit id, field) so that the CLI can print one clear
line; tracebacks are for bugs only. An error that differs from another only in what it is about
is :class:`EvidenceError` with its :class:`ErrorCode`; a subclass exists only where callers
catch it apart from the rest or where it carries more data (in the style of simonw/llm's
``errors.py``).
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Every stable ``code`` an error carries (``--json`` ``problems[].code``; tests assert them).

    Besides these, ``evaluate`` reports ``evaluation_unavailable_<reason>`` with a reason of
    :class:`evidence_runtime.search.UnavailableCode`.
    """

    # runtime
    evidence_error = "evidence_error"
    unit_format = "unit_format"
    encoding_invalid = "encoding_invalid"
    front_matter_missing = "front_matter_missing"
    front_matter_malformed = "front_matter_malformed"
    yaml_forbidden_construct = "yaml_forbidden_construct"
    config_error = "config_error"
    index_error = "index_error"
    index_unreachable = "index_unreachable"
    index_locked = "index_locked"
    index_schema_mismatch = "index_schema_mismatch"
    index_corrupt = "index_corrupt"
    disk_full = "disk_full"
    embedder_error = "embedder_error"
    registry_error = "registry_error"
    registry_locked = "registry_locked"
    registry_corrupt = "registry_corrupt"
    registry_conflict = "registry_conflict"
    stage_without_evidence = "stage_without_evidence"
    invalid_query = "invalid_query"
    unknown_stage = "unknown_stage"
    # workspace, Git and local state
    git_error = "git_error"
    workspace_busy = "workspace_busy"
    workspace_changed = "workspace_changed"
    lock_unavailable = "lock_unavailable"
    state_dir_unwritable = "state_dir_unwritable"
    demo_error = "demo_error"
    # authoring
    source_invalid = "source_invalid"
    source_missing = "source_missing"
    source_changed = "source_changed"
    source_too_large = "source_too_large"
    source_encoding_invalid = "source_encoding_invalid"
    source_type_not_allowed = "source_type_not_allowed"
    source_conflict = "source_conflict"
    unsafe_path = "unsafe_path"
    manifest_malformed = "manifest_malformed"
    pipeline_version_incompatible = "pipeline_version_incompatible"
    model_error = "model_error"
    model_timeout = "model_timeout"
    model_process_failed = "model_process_failed"
    model_http_error = "model_http_error"
    model_unreachable = "model_unreachable"
    model_malformed_json = "model_malformed_json"
    model_invalid_output = "model_invalid_output"
    model_unknown_id = "model_unknown_id"
    prepare_failed = "prepare_failed"
    apply_failed = "apply_failed"
    batch_invalid = "batch_invalid"
    recovery_conflict = "recovery_conflict"
    interrupted_apply_recovered = "interrupted_apply_recovered"
    resolve_failed = "resolve_failed"
    formula_import_failed = "formula_import_failed"
    legacy_formula_malformed = "legacy_formula_malformed"
    legacy_store_missing = "legacy_store_missing"
    credentials_found = "credentials_found"
    curated_unreadable = "curated_unreadable"
    id_duplicate = "id_duplicate"
    proposal_invalid = "proposal_invalid"
    proposal_refused = "proposal_refused"
    # publishing and evaluation
    publish_failed = "publish_failed"
    publish_busy = "publish_busy"
    no_activated_revision = "no_activated_revision"
    generation_missing = "generation_missing"
    verification_failed = "verification_failed"
    evaluation_gate_failed = "evaluation_gate_failed"
    evaluation_mismatch = "evaluation_mismatch"
    evaluation_malformed = "evaluation_malformed"
    evaluation_unavailable = "evaluation_unavailable"
    baseline_unreadable = "baseline_unreadable"
    materialize_failed = "materialize_failed"
    vector_cache_error = "vector_cache_error"
    shared_records_unavailable = "shared_records_unavailable"
    shared_records_no_snapshot = "shared_records_no_snapshot"
    # orchestration
    partition_key_invalid = "partition_key_invalid"
    dagster_run_failed = "dagster_run_failed"


class EvidenceError(Exception):
    """Base class of every expected (user-facing) error.

    ``code`` is a stable machine-readable string (an :class:`ErrorCode`); ``path``,
    ``evidence_id`` and ``field`` say what the error is about when known.
    """

    code: str = ErrorCode.evidence_error

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
        # a plain str on the instance: codes end up in JSON, YAML and pydantic records
        self.code = str(self.code if code is None else code)
        self.path = path
        self.evidence_id = evidence_id
        self.field = field

    def __str__(self) -> str:
        where = [p for p in (self.path, self.evidence_id, self.field) if p]
        prefix = ": ".join(where)
        return f"{prefix}: {self.message}" if prefix else self.message


class UnitFormatError(EvidenceError):
    """A curated file cannot be read as an Evidence Unit (encoding, front matter, YAML)."""

    code = ErrorCode.unit_format


class ConfigError(EvidenceError):
    """The workspace descriptor or a configuration value is missing or wrong."""

    code = ErrorCode.config_error


class IndexError_(EvidenceError):
    """Base of index (Qdrant) errors; ``index_schema_mismatch`` when the collection's vectors
    do not match what Evidence needs (nothing was changed)."""

    code = ErrorCode.index_error


class IndexUnavailableError(IndexError_):
    """The index cannot be reached (server down, shard missing or unreadable)."""

    code = ErrorCode.index_unreachable


class IndexMissingError(IndexUnavailableError):
    """There is no index at the configured place (never published there, or lost)."""


class IndexCorruptError(IndexError_):
    """The index does not hold what the registry recorded for a generation: a named vector or
    payload fields of some of its points are missing (damaged files; repair with
    ``tht workspace check --repair``)."""

    code = ErrorCode.index_corrupt


class DiskFullError(IndexUnavailableError):
    """The embedded shard cannot be used safely: its filesystem has less free space than the
    shard's unallocated (sparse) regions the engine may write into, and a write into a hole
    with no space left would kill the process (SIGBUS)."""

    code = ErrorCode.disk_full


class IndexLockedError(IndexError_):
    """The embedded shard is held by another process (Qdrant Edge takes an exclusive lock)."""

    code = ErrorCode.index_locked


class IndexSchemaError(IndexError_):
    """The collection's vectors do not match what Evidence needs; nothing was changed."""

    code = ErrorCode.index_schema_mismatch


class EmbedderError(EvidenceError):
    """The embedding model failed or returned something unusable."""

    code = ErrorCode.embedder_error


class RegistryError(EvidenceError):
    """The registry (activated revision, generations) cannot be read or written;
    ``registry_corrupt`` when its stored data cannot be read back (a damaged file or value)."""

    code = ErrorCode.registry_error


class RegistryLockedError(RegistryError):
    """Another writer held the registry longer than the busy/lock timeout; nothing was changed."""

    code = ErrorCode.registry_locked
