"""The migration check of spec §16: the Schema and Memory records sharing the collection.

Evidence shares the workspace's collection with records that other modules own (``record_kind``
schema_table, schema_column, memory, solved_question: spec §8). Adding ``bm25`` and publishing
generations must leave them exactly as they were. :func:`take` records, per record type, how
many there are, a stable sample of their ids and the ids a few fixed dense searches return;
:func:`save` keeps that under the state directory before the upgrade, and :func:`compare` says
afterwards whether anything changed. Every read goes through the runtime's read-only index API.

A record whose ``record_kind`` is none of the known types (or missing) is counted as ``other``:
the read API lists ids by filter, so such records are found as "neither Evidence nor a known
type", without a dense probe of their own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field

from evidence_pipeline.state import ensure_state_dir
from evidence_runtime.embeddings import make_embedder
from evidence_runtime.errors import ErrorCode, EvidenceError
from evidence_runtime.index import EvidenceIndex, open_index
from evidence_runtime.search import RECORD_KIND, index_config
from evidence_runtime.workspace import Workspace

SHARED_RECORD_KINDS = ("schema_table", "schema_column", "memory", "solved_question")
OTHER = "other"
SNAPSHOT_NAME = "shared-records.json"
SAMPLE_SIZE = 20
PROBES = 3  # fixed dense searches per record type
PROBE_LIMIT = 10
PROBE_SEED = 16  # spec §16
UNAVAILABLE = ErrorCode.shared_records_unavailable


class RecordType(BaseModel):
    """One record type: how many, a sample of ids, and the ids each fixed dense probe returns
    (best first; ``None`` for ``other``, which has no filter to probe with)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int
    sample: list[str]
    dense: list[list[str]] | None = None


class Snapshot(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    taken_at: str
    index: str
    evidence_points: int
    types: dict[str, RecordType]

    @property
    def total(self) -> int:
        return sum(t.count for t in self.types.values())


class TypeComparison(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    saved: int
    now: int
    missing_sample: list[str] = Field(default_factory=list)
    dense_changed: bool = False

    @computed_field  # type: ignore[prop-decorator]
    @property
    def unchanged(self) -> bool:
        return self.saved == self.now and not self.missing_sample and not self.dense_changed


class Comparison(BaseModel):
    """A saved snapshot against the collection now; ``unchanged`` only when every type has the
    same count, every sampled id and the same dense probe results."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    saved_at: str
    compared_at: str
    index: str
    unchanged: bool
    types: dict[str, TypeComparison]


def _stable_sample(ids: list[str]) -> list[str]:
    """A sample that does not depend on insertion order or on how ids sort (ints and UUIDs
    alike): the ids whose SHA-256 comes first."""
    return sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())[:SAMPLE_SIZE]


def _probes(dim: int) -> np.ndarray:
    vectors = np.random.default_rng(PROBE_SEED).standard_normal((PROBES, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _read(index: EvidenceIndex, *, dense_dim: int, where: str
          ) -> tuple[Snapshot, dict[str, set[str]]]:
    """The snapshot of the collection now, and every id of each record type."""
    everything = set(index.scroll_ids({}))
    evidence = set(index.scroll_ids({"record_kind": RECORD_KIND}))
    probes = _probes(dense_dim)
    ids: dict[str, set[str]] = {}
    types: dict[str, RecordType] = {}
    for kind in SHARED_RECORD_KINDS:
        found = index.scroll_ids({"record_kind": kind})
        dense = [[h.id for h in index.dense_search(p, match={"record_kind": kind},
                                                   limit=PROBE_LIMIT)]
                 for p in probes] if found else []
        ids[kind] = set(found)
        types[kind] = RecordType(count=len(found), sample=_stable_sample(found), dense=dense)
    other = sorted(everything - evidence - set().union(*ids.values()))
    ids[OTHER] = set(other)
    types[OTHER] = RecordType(count=len(other), sample=_stable_sample(other))
    snapshot = Snapshot(taken_at=datetime.now(UTC).isoformat(timespec="seconds"), index=where,
                        evidence_points=len(evidence), types=types)
    return snapshot, ids


def take(index: EvidenceIndex, *, dense_dim: int, where: str) -> Snapshot:
    """Counts, a sample of ids and fixed dense searches of every non-Evidence record type."""
    return _read(index, dense_dim=dense_dim, where=where)[0]


def compare_with(saved: Snapshot, index: EvidenceIndex, *, dense_dim: int,
                 where: str) -> Comparison:
    """``saved`` against ``index`` now."""
    now, ids = _read(index, dense_dim=dense_dim, where=where)
    names = [*SHARED_RECORD_KINDS, OTHER]
    names += sorted(saved.types.keys() - set(names))  # a type an older snapshot knew
    empty = RecordType(count=0, sample=[])
    types: dict[str, TypeComparison] = {}
    for name in names:
        before, after = saved.types.get(name, empty), now.types.get(name, empty)
        present = ids.get(name, set())
        types[name] = TypeComparison(
            saved=before.count, now=after.count,
            missing_sample=[i for i in before.sample if i not in present],
            dense_changed=(before.dense or []) != (after.dense or []))
    return Comparison(saved_at=saved.taken_at, compared_at=now.taken_at, index=where,
                      unchanged=all(t.unchanged for t in types.values()), types=types)


# --------------------------------------------------------------------------- the workspace


def snapshot_path(ws: Workspace) -> Path:
    return ws.state_dir / SNAPSHOT_NAME


def describe_index(ws: Workspace) -> str:
    cfg = index_config(ws)
    return f"edge:{cfg.path}" if cfg.engine == "edge" else f"server:{cfg.url}/{cfg.collection}"


def _reading(ws: Workspace) -> tuple[EvidenceIndex, int, str]:
    """The collection opened read-only, the dense size of the workspace's embedder (no model
    is loaded) and the collection's description."""
    dim = make_embedder(ws.config.embeddings.model).dim
    return open_index(index_config(ws), language=ws.config.language), dim, describe_index(ws)


def current(ws: Workspace) -> Snapshot:
    """The shared records of the workspace's collection now."""
    index, dim, where = _reading(ws)
    with contextlib.closing(index):
        return take(index, dense_dim=dim, where=where)


def save(ws: Workspace) -> Snapshot:
    """Record the shared records now as the snapshot to compare with (replaces an older one)."""
    snap = current(ws)
    path = snapshot_path(ws)
    ensure_state_dir(ws.state_dir)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{SNAPSHOT_NAME}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(snap.model_dump_json(indent=2) + "\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise EvidenceError(f"cannot write the snapshot: {exc.strerror or exc}",
                            code=UNAVAILABLE, path=str(path)) from None
    return snap


def saved(ws: Workspace) -> Snapshot | None:
    """The saved snapshot, or None when none was saved; ``shared_records_unavailable`` when
    the file cannot be read."""
    path = snapshot_path(ws)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EvidenceError(f"cannot read the snapshot: {exc.strerror}",
                            code=UNAVAILABLE, path=str(path)) from None
    try:
        return Snapshot.model_validate_json(text)
    except ValidationError as exc:
        raise EvidenceError(f"the snapshot is not readable: {exc.errors()[0]['msg']}",
                            code=UNAVAILABLE, path=str(path)) from None


def compare(ws: Workspace) -> Comparison:
    """The saved snapshot against the collection now; ``shared_records_no_snapshot``
    without one."""
    before = saved(ws)
    if before is None:
        raise EvidenceError("no snapshot of the shared records was saved; run "
                            "`tht workspace shared-records <root> --save` first",
                            code=ErrorCode.shared_records_no_snapshot,
                            path=str(snapshot_path(ws)))
    index, dim, where = _reading(ws)
    with contextlib.closing(index):
        return compare_with(before, index, dense_dim=dim, where=where)


def compare_if_saved(ws: Workspace) -> dict[str, Any] | None:
    """For ``preprocess``: the comparison as a JSON document when a snapshot exists (a fault
    reading it becomes ``{"error": code, "message": …}``), None when none was saved."""
    if not snapshot_path(ws).exists():
        return None
    try:
        return compare(ws).model_dump(mode="json")
    except EvidenceError as exc:
        return {"error": exc.code, "message": exc.message}
