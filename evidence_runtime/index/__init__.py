"""Index access for readers: one interface, two engines (Qdrant Edge in-process, Qdrant server).

``base`` holds the interface (:class:`EvidenceIndex`), the record types and the helpers both
engines share; ``edge`` and ``server`` one engine each; ``fusion`` how a fused search
combines its two lists (the same code for both engines); ``config`` where the index lives and
:func:`open_index`. Nothing here writes: the publisher's writers extend these classes in
``evidence_pipeline.publishing.index_writer``.
"""

from evidence_runtime.index.base import (
    BM25_MODEL,
    BM25_VECTOR,
    DEFAULT_RRF_K,
    DEFAULT_RRF_WEIGHTS,
    Bm25Settings,
    EvidenceIndex,
    Hit,
    Match,
    QueryMode,
)
from evidence_runtime.index.config import INDEX_ENGINES, IndexConfig, open_index
from evidence_runtime.index.edge import EdgeIndex
from evidence_runtime.index.fusion import FUSION_METHODS, Fusion, FusionMethod
from evidence_runtime.index.server import ServerIndex

__all__ = [
    "BM25_MODEL",
    "BM25_VECTOR",
    "DEFAULT_RRF_K",
    "DEFAULT_RRF_WEIGHTS",
    "FUSION_METHODS",
    "INDEX_ENGINES",
    "Bm25Settings",
    "EdgeIndex",
    "EvidenceIndex",
    "Fusion",
    "FusionMethod",
    "Hit",
    "IndexConfig",
    "Match",
    "QueryMode",
    "ServerIndex",
    "open_index",
]
