"""Source files as dynamic partitions: one key per note under ``evidence/source/``.

A key is the source's path relative to ``evidence/`` — the same string as its manifest entry and
its units' ``provenance.source_file`` — so keys and sources map one to one. Dagster does not
check dynamic keys; :func:`check_source_key` refuses what could escape the tree, hide, or be
misread by Dagster's partition-selection syntax.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import dagster as dg

from evidence_pipeline.authoring.sources import (
    ALLOWED_SUFFIXES,
    SourceError,
    check_rel_path,
    list_sources,
)
from evidence_runtime.errors import ErrorCode, EvidenceError

SOURCE_PARTITIONS = dg.DynamicPartitionsDefinition(name="evidence_sources")
MAX_KEY_CHARS = 512
# "..." is Dagster's key-range separator; commas, brackets and wildcards its selection syntax
_NOT_IN_KEYS = ("...", ",", "[", "]", "*", "?", '"')
_MAPPING_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")


class PartitionKeyError(EvidenceError):
    """A partition key that does not name exactly one acceptable source file."""

    code = ErrorCode.partition_key_invalid


def check_source_key(key: str) -> str:
    """The source path (relative to ``evidence/``) a partition key names; refuses unsafe keys."""
    shown = repr(key)
    if not isinstance(key, str) or not key:
        raise PartitionKeyError("empty partition key", path=shown)
    if len(key) > MAX_KEY_CHARS:
        raise PartitionKeyError(f"partition key longer than {MAX_KEY_CHARS} characters",
                                path=shown[:80])
    try:
        check_rel_path(key)
    except SourceError as exc:
        raise PartitionKeyError(exc.message, path=shown) from None
    parts = key.split("/")
    if parts[0] != "source" or len(parts) < 2:
        raise PartitionKeyError("a source key names a file under source/", path=shown)
    for part in parts[1:]:
        if not part or part.startswith(".") or part != part.strip():
            raise PartitionKeyError("empty, hidden or space-padded path component", path=shown)
    if not key.endswith(ALLOWED_SUFFIXES):
        raise PartitionKeyError("only .md, .txt and .sql.md sources have partitions",
                                path=shown)
    for bad in _NOT_IN_KEYS:
        if bad in key:
            raise PartitionKeyError(f"{bad!r} is not allowed in a partition key", path=shown)
    if unicodedata.normalize("NFC", key) != key:
        raise PartitionKeyError("the name is not in Unicode NFC form (it would look like "
                                "another name)", path=shown)
    return key


def is_source_key(key: str) -> bool:
    try:
        check_source_key(key)
    except PartitionKeyError:
        return False
    return True


def source_keys(evidence_dir: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """The partition keys of the files under ``source/``, and (name, reason) for the refused."""
    paths, errors = list_sources(evidence_dir)
    keys: list[str] = []
    refused = [(e.path or "?", e.message) for e in errors]
    for path in paths:
        try:
            keys.append(check_source_key(path))
        except PartitionKeyError as exc:
            refused.append((exc.path or "?", exc.message))
    return keys, refused


def partition_requests(current: Sequence[str], keys: Sequence[str]
                       ) -> list[dg.AddDynamicPartitionsRequest
                                 | dg.DeleteDynamicPartitionsRequest]:
    """The requests that make the partitions equal ``keys`` (a rename is a delete and an add)."""
    have, want = set(current), set(keys)
    requests: list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest] = []
    if want - have:
        requests.append(SOURCE_PARTITIONS.build_add_request(sorted(want - have)))
    if have - want:
        requests.append(SOURCE_PARTITIONS.build_delete_request(sorted(have - want)))
    return requests


def sync_source_partitions(instance: dg.DagsterInstance, evidence_dir: Path
                           ) -> tuple[list[str], list[str]]:
    """Bring the instance's partitions in step with ``source/`` now: (added, removed)."""
    keys, _ = source_keys(evidence_dir)
    current = instance.get_dynamic_partitions(SOURCE_PARTITIONS.name)
    added = sorted(set(keys) - set(current))
    removed = sorted(set(current) - set(keys))
    if added:
        instance.add_dynamic_partitions(SOURCE_PARTITIONS.name, added)
    for key in removed:
        instance.delete_dynamic_partition(SOURCE_PARTITIONS.name, key)
    return added, removed


def mapping_key(path: str) -> str:
    """A ``DynamicOut`` mapping key for a source path (``[A-Za-z0-9_]+``, unique by hash)."""
    slug = _MAPPING_UNSAFE.sub("_", path.removeprefix("source/")).strip("_")[:48]
    return f"{slug}_{hashlib.sha256(path.encode('utf-8')).hexdigest()[:10]}"
