"""Collections as Schema and Memory have them before Evidence's upgrade: the default dense vector
only, optionally with ``(id, dense, payload)`` records written by another system."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import qdrant_edge as qe
from qdrant_client import QdrantClient, models

from evidence_runtime.index.base import as_floats

DenseRecord = tuple[str | int, Sequence[float], Mapping[str, Any]]


def create_dense_only_shard(
    path: Path | str, *, dense_dim: int, records: Iterable[DenseRecord] = ()
) -> None:
    """An Edge shard with only the default dense vector (and ``records``); closed on return."""
    shard = qe.EdgeShard.create(
        str(path),
        qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=dense_dim, distance=qe.Distance.Cosine)),
    )
    try:
        points = [qe.Point(rid, as_floats(vec), dict(payload)) for rid, vec, payload in records]
        if points:
            shard.update(qe.UpdateOperation.upsert_points(points))
        shard.flush()
    finally:
        shard.close()


def create_dense_only_collection(
    client: QdrantClient, collection: str, *, dense_dim: int, records: Iterable[DenseRecord] = ()
) -> None:
    """A server collection with only the default dense vector (and ``records``)."""
    client.create_collection(
        collection,
        vectors_config=models.VectorParams(size=dense_dim, distance=models.Distance.COSINE),
    )
    points = [
        models.PointStruct(id=rid, vector=as_floats(vec), payload=dict(payload))
        for rid, vec, payload in records
    ]
    if points:
        client.upsert(collection, points=points, wait=True)
