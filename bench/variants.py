"""Variants of quality.py runs (issue 16 item 4), through the library's own settings.

Fusion (``rrf_k``, ``prefetch_limit``, ``rrf_weights``) is a searcher setting (thoth.yaml's
``index`` section, read by ``EvidenceSearcher.for_workspace``): a variant sets it on the
searcher. BM25 (``bm25_avg_len``, ``bm25_stopwords``) is a setting of the publication: a variant
writes it into the workspace's thoth.yaml, commits, activates and publishes again (fragment
vectors come from the vector cache), and the generation records it. Only the fragment without
its header has no setting (it was not adopted): a scratch Edge shard with the same points,
texts re-embedded. bench/sweep.py compares many variants at once on scratch shards.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import git, log, tht


@dataclass(frozen=True)
class Variant:
    rrf_k: int | None = None
    prefetch: int | None = None
    weights: tuple[float, float] | None = None
    bm25_avg_len: str | None = None  # a number or "corpus"
    bm25_stopwords: tuple[str, ...] | None = None
    no_header: bool = False

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, False)}

    def publication(self) -> dict[str, Any]:
        """The thoth.yaml ``index`` keys this variant publishes with (empty: none)."""
        out: dict[str, Any] = {}
        if self.bm25_avg_len is not None:
            out["bm25_avg_len"] = (self.bm25_avg_len if self.bm25_avg_len == "corpus"
                                   else float(self.bm25_avg_len))
        if self.bm25_stopwords is not None:
            out["bm25_stopwords"] = list(self.bm25_stopwords)
        return out


def set_index_settings(ws: Path, settings: dict[str, Any]) -> bool:
    """Write ``settings`` into thoth.yaml's ``index`` section; True when the file changed."""
    from evidence_pipeline.formats.curated_writer import dump_rt
    from evidence_runtime.yamlio import load_rt

    path = ws / "thoth.yaml"
    text = path.read_text(encoding="utf-8")
    doc = load_rt(text, path=str(path))
    index = doc.setdefault("index", {})
    for key, value in settings.items():
        index[key] = value
    new = dump_rt(doc)
    if new == text:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def republish(ws: Path, settings: dict[str, Any], why: str) -> dict[str, Any] | None:
    """Publish ``ws`` again with ``settings`` in thoth.yaml (commit, activate, preprocess);
    None when thoth.yaml already had them and the active generation was built with them."""
    changed = set_index_settings(ws, settings)
    if not changed and not _stale(ws):
        return None
    log(f"[quality] publishing {ws.name} again: {why}")
    if changed:
        git(ws, "commit", "-q", "-am", f"index settings: {settings}")
    tht("workspace", "activate", str(ws))
    published, _ = tht("workspace", "preprocess", "evidence", str(ws))
    return published


def _stale(ws: Path) -> bool:
    """Whether the active generation's BM25 settings differ from what thoth.yaml gives now."""
    from evidence_runtime.index.base import DEFAULT_BM25_AVG_LEN
    from evidence_runtime.registry import Registry
    from evidence_runtime.search import generation_bm25
    from evidence_runtime.workspace import load_workspace

    w = load_workspace(ws)
    with Registry.open(w.registry_url) as registry:
        _rev, gen = registry.active_state(w.config.workspace_id)
    if gen is None:
        return True
    recorded = generation_bm25(gen, w.config.language)
    cfg = w.config.index
    if recorded.stopwords != tuple(sorted(set(cfg.bm25_stopwords))):
        return True
    if cfg.bm25_avg_len == "corpus":  # measured at publication: was it?
        return recorded.avg_len == DEFAULT_BM25_AVG_LEN
    return recorded.avg_len != float(cfg.bm25_avg_len)


def open_searcher(ws: Path, variant: Variant, embedder: Any, scratch: Path
                  ) -> tuple[Any, dict[str, Any]]:
    """The workspace's searcher (its thoth.yaml settings) with the variant's fusion settings;
    for ``no_header``, over a scratch Edge shard holding the same points with other texts (the
    published one is never changed). Returns the searcher and what a scratch shard was built
    with (empty: none)."""
    from evidence_runtime.search import EvidenceSearcher

    searcher = EvidenceSearcher.for_workspace(ws, embedder=embedder)
    _fusion(searcher, variant)
    if not variant.no_header:
        return searcher, {}
    idx, built = scratch_index(searcher, scratch, embedder=embedder)
    searcher.close()  # releases the published shard
    scratch_searcher = EvidenceSearcher.for_workspace(ws, embedder=embedder, index=idx)
    _fusion(scratch_searcher, variant)
    return scratch_searcher, built


def _fusion(searcher: Any, variant: Variant) -> None:
    if variant.rrf_k is not None:
        searcher.rrf_k = variant.rrf_k
    if variant.prefetch is not None:
        searcher.prefetch_limit = variant.prefetch
    if variant.weights is not None:
        searcher.rrf_weights = variant.weights


def scratch_index(searcher: Any, path: Path, *, embedder: Any) -> tuple[Any, dict[str, Any]]:
    """A new Edge shard with the active generation's points, each fragment without its header
    (re-embedded with the passage model), BM25 with the generation's own settings."""
    import qdrant_edge as qe

    from evidence_pipeline.publishing.index_writer import EdgeIndexWriter, IndexPoint
    from evidence_runtime.search import generation_bm25

    state = searcher.resolve_generation()
    if not isinstance(state, tuple):
        raise SystemExit(f"search unavailable ({state.code}): {state.message}")
    gen = state[0]
    shard = searcher.index()._live()  # payloads: no reader API returns whole points
    records: list[Any] = []
    offset = None
    while True:
        page, offset = shard.scroll(qe.ScrollRequest(offset=offset, limit=1024,
                                                     with_payload=True, with_vector=False))
        records.extend(page)
        if offset is None:
            break
    texts = [without_header(dict(r.payload)) for r in records]
    log(f"[quality] embedding {len(texts)} fragments without their header")
    dense = embedder.embed_passages(texts)
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    index = EdgeIndexWriter.open(path, language=searcher.language, dense_dim=int(dense.shape[1]))
    index.ensure_schema(dense_dim=int(dense.shape[1]))
    index.upsert([IndexPoint(id=str(r.id), dense=dense[i], text=texts[i],
                             payload={**dict(r.payload), "text": texts[i]})
                  for i, r in enumerate(records)], bm25=generation_bm25(gen, searcher.language))
    return index, {"fragments": len(records), "header": False}


def close(searcher: Any, built: dict[str, Any]) -> None:
    """Close the searcher, and the scratch shard it was given (not its own)."""
    if built:
        searcher.index().close()
    searcher.close()


def without_header(payload: dict[str, Any]) -> str:
    """The fragment's content without the labels every fragment of its unit repeats."""
    _head, sep, content = payload["text"].partition("\n\n")
    return content if sep and content.strip() else payload["text"]
