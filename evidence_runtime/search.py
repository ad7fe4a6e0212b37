"""``search(query, purpose, context)``: grouped, cited Evidence candidates, or ``unavailable``.

The searcher owns everything of spec §10: the query text (§9.6), the mandatory filters
(workspace, revision, generation, purpose), explicit constraints, the two prefetches and their
fusion (``index.fusion``),
grouping fragments into one result per unit, and the check that the active generation matches
the activated revision. Faults never become an empty ``available`` (spec §13.3).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict

from evidence_runtime.closing import Closeable
from evidence_runtime.embeddings import Embedder, make_embedder
from evidence_runtime.errors import (
    ConfigError,
    DiskFullError,
    EmbedderError,
    EvidenceError,
    IndexCorruptError,
    IndexError_,
    IndexLockedError,
    IndexUnavailableError,
    RegistryError,
)
from evidence_runtime.index import (
    DEFAULT_RRF_K,
    DEFAULT_RRF_WEIGHTS,
    Bm25Settings,
    EvidenceIndex,
    Fusion,
    Hit,
    IndexConfig,
    Match,
    QueryMode,
    open_index,
)
from evidence_runtime.index.fusion import DEFAULT_FUSION
from evidence_runtime.query import EvidenceSearchContext, render_query
from evidence_runtime.registry import Generation, GenerationStatus, Registry
from evidence_runtime.units import EvidencePurpose
from evidence_runtime.workspace import Workspace, load_workspace

RECORD_KIND = "evidence_fragment"
MAX_MESSAGE = 300
# a result shows at most this much of a fragment (the unit contract's own, longer bound on
# supporting excerpts is units.MAX_EXCERPT_CHARS)
MAX_RESULT_EXCERPT_CHARS = 600
DEFAULT_LIMIT = 10
# The payload fields a result cannot be built without (the others have defaults): every
# fragment of a generation must hold them (checked once per generation by the searcher, and by
# ``tht workspace check``).
RESULT_FIELDS = ("evidence_id", "evidence_kind", "source_file", "source_sha256")


class UnavailableCode(StrEnum):
    """Stable reasons for ``unavailable`` (spec §13.3)."""

    not_configured = "not_configured"
    registry_unavailable = "registry_unavailable"
    no_active_generation = "no_active_generation"
    revision_mismatch = "revision_mismatch"
    generation_unknown = "generation_unknown"
    generation_missing = "generation_missing"
    index_unreachable = "index_unreachable"
    index_locked = "index_locked"
    index_error = "index_error"
    index_corrupt = "index_corrupt"
    disk_full = "disk_full"
    embedder_failed = "embedder_failed"
    document_missing = "document_missing"


class DocumentRef(BaseModel):
    """Where the full curated document lives: resolved only on request."""

    model_config = ConfigDict(frozen=True)

    workspace_id: str
    revision: str
    path: str  # relative to the workspace root, e.g. evidence/curated/formula/x.md


class ResultProvenance(BaseModel):
    model_config = ConfigDict(frozen=True)

    source_file: str
    source_sha256: str
    supporting_excerpts: tuple[str, ...]


class EvidenceResult(BaseModel):
    """One Evidence Unit found: its best fragments grouped, with provenance and a citation."""

    model_config = ConfigDict(frozen=True)

    evidence_id: str
    kind: str
    title: str
    score: float
    excerpts: tuple[str, ...]
    fragment_ordinals: tuple[int, ...]
    provenance: ResultProvenance
    citation: str
    document: DocumentRef


class _Outcome(BaseModel):
    """``available``, or ``unavailable`` with a code and a message saying why."""

    model_config = ConfigDict(frozen=True)

    status: Literal["available", "unavailable"]
    code: UnavailableCode | None = None
    message: str | None = None

    @property
    def available(self) -> bool:
        return self.status == "available"


class EvidenceSearchOutcome(_Outcome):
    """``available`` (generation queried, zero or more results) or ``unavailable`` (code)."""

    generation: int | None = None
    revision: str | None = None
    purpose: EvidencePurpose | None = None
    results: tuple[EvidenceResult, ...] = ()

    @property
    def evidence_ids(self) -> list[str]:
        return [r.evidence_id for r in self.results]


class DocumentOutcome(_Outcome):
    """The full curated document of a result, or ``unavailable`` with ``document_missing``."""

    text: str | None = None


def unavailable(code: UnavailableCode, message: str, **kw: Any) -> EvidenceSearchOutcome:
    text = message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE - 1] + "…"
    return EvidenceSearchOutcome(status="unavailable", code=code, message=text, **kw)


def _index_code(exc: IndexError_) -> UnavailableCode:
    if isinstance(exc, IndexLockedError):
        return UnavailableCode.index_locked
    if isinstance(exc, DiskFullError):
        return UnavailableCode.disk_full
    if isinstance(exc, IndexCorruptError):
        return UnavailableCode.index_corrupt
    if isinstance(exc, IndexUnavailableError):
        return UnavailableCode.index_unreachable
    return UnavailableCode.index_error


def build_match(workspace_id: str, revision: str, generation: int, purpose: EvidencePurpose,
                context: EvidenceSearchContext | None) -> Match:
    """Mandatory filters plus the caller's explicit constraints (and nothing implicit)."""
    match: Match = {
        "workspace_id": workspace_id,
        "workspace_revision": revision,
        "vector_generation": generation,
        "record_kind": RECORD_KIND,
        "purposes": purpose.value,
    }
    if context is not None:
        c = context.constraints
        if c.kinds:
            match["evidence_kind"] = sorted({k.value for k in c.kinds})
        if c.tables:
            match["tables"] = sorted(set(c.tables))
        if c.columns:
            match["columns"] = sorted(set(c.columns))
        if c.concepts:
            match["concepts"] = sorted(set(c.concepts))
    return match


def group_hits(hits: Sequence[Hit], *, limit: int, revision: str,
               workspace_id: str) -> list[EvidenceResult]:
    """Fragments of one unit become one result (best fragment's score); ties by evidence id."""
    groups: dict[str, list[Hit]] = {}
    for hit in hits:
        lacking = [f for f in RESULT_FIELDS if f not in hit.payload]
        if lacking:  # a damaged payload_storage: never a KeyError, never a partial answer
            raise IndexCorruptError(f"point {hit.id} has no payload field(s) "
                                    f"{', '.join(lacking)}: the index is damaged",
                                    field=lacking[0])
        groups.setdefault(str(hit.payload["evidence_id"]), []).append(hit)
    ranked = sorted(groups.items(), key=lambda kv: (-max(h.score for h in kv[1]), kv[0]))
    results: list[EvidenceResult] = []
    for eid, group in ranked[:limit]:
        group.sort(key=lambda h: (-h.score, int(h.payload.get("fragment_ordinal", 0))))
        best = group[0].payload
        excerpts = tuple(_excerpt(str(h.payload.get("text", ""))) for h in group[:3])
        path = str(best.get("curated_path", ""))
        results.append(EvidenceResult(
            evidence_id=eid,
            kind=str(best["evidence_kind"]),
            title=str(best.get("title", eid)),
            score=float(group[0].score),
            excerpts=excerpts,
            fragment_ordinals=tuple(int(h.payload.get("fragment_ordinal", 0)) for h in group),
            provenance=ResultProvenance(
                source_file=str(best["source_file"]),
                source_sha256=str(best["source_sha256"]),
                supporting_excerpts=tuple(best.get("supporting_excerpts", ())),
            ),
            citation=f"{eid} — {best.get('title', eid)} ({best['source_file']}, "
                     f"revisione {revision[:12]})",
            document=DocumentRef(workspace_id=workspace_id, revision=revision, path=path),
        ))
    return results


def missing_points(index: EvidenceIndex, workspace_id: str, generation: Generation) -> str | None:
    """Why ``generation`` has lost its points in ``index`` (fewer than the registry recorded,
    or none where it recorded no count), or None when they are there.

    A generation without its points must never answer an empty ``available`` (spec §13.3):
    the index was lost or rebuilt after the registry recorded it.
    """
    found = index.count({"workspace_id": workspace_id, "vector_generation": generation.number,
                         "record_kind": RECORD_KIND})
    expected = generation.counts.get("fragments")
    if isinstance(expected, int) and not isinstance(expected, bool):
        if found >= expected:
            return None
        return (f"generation {generation.number} has {found} of its {expected} points in the "
                "index (the index was lost or rebuilt)")
    if found:
        return None
    return f"generation {generation.number} has no points in the index (lost or rebuilt)"


def damaged_points(index: EvidenceIndex, workspace_id: str,
                   generation: Generation) -> str | None:
    """Why ``generation``'s points cannot be trusted (some lack the dense vector, the BM25
    vector or the payload fields a result is built from, or hold fewer of them than the registry
    recorded at publication), or None when they are whole.

    A shard whose ``vector_storage`` or ``payload_storage`` was lost is reopened by the engine
    with that part empty: searches would answer from one branch alone, or fail on a missing
    field (issue 28). The searcher answers ``unavailable``/``index_corrupt`` instead.
    """
    counts = index.point_counts({"workspace_id": workspace_id,
                                 "vector_generation": generation.number,
                                 "record_kind": RECORD_KIND}, payload_fields=RESULT_FIELDS)
    recorded: Any = generation.counts.get("vectors")
    wanted = {"dense": counts.points, "bm25": counts.points}
    if isinstance(recorded, dict):
        for name, value in cast(dict[str, Any], recorded).items():
            if name in wanted and isinstance(value, int) and not isinstance(value, bool):
                wanted[name] = max(wanted[name], value)
    found = {"dense": counts.dense, "bm25": counts.bm25}
    short = [f"{found[name]} of {n} hold the {name} vector" for name, n in wanted.items()
             if found[name] < n]
    if counts.payload < counts.points:
        short.append(f"{counts.payload} of {counts.points} hold their payload fields")
    if not short:
        return None
    return (f"generation {generation.number} is damaged in the index: {'; '.join(short)}; "
            "repair it with `tht workspace check --repair`")


def generation_bm25(generation: Generation, language: str) -> Bm25Settings:
    """The BM25 settings ``generation``'s fragments were tokenized with (recorded by the
    publisher in its config as ``bm25``), so that queries are tokenized the same way; a
    generation recorded without them used the language's defaults."""
    recorded: Any = generation.config.get("bm25")
    if not isinstance(recorded, dict):
        return Bm25Settings(language=str(generation.config.get("bm25_language") or language))
    values = cast(dict[str, Any], recorded)
    words: list[Any] = list(values.get("stopwords") or ())
    return Bm25Settings(language=str(values.get("language") or language),
                        avg_len=float(values.get("avg_len", Bm25Settings.avg_len)),
                        stopwords=tuple(str(w) for w in words))


def _excerpt(text: str) -> str:
    # the fragment text starts with the unit's labels (title, kind, applies_to): show the content
    _head, sep, content = text.partition("\n\n")
    text = content if sep and content.strip() else text
    if len(text) <= MAX_RESULT_EXCERPT_CHARS:
        return text
    return text[:MAX_RESULT_EXCERPT_CHARS - 1] + "…"


class EvidenceSearcher(Closeable):
    """A long-lived searcher: opens the index and the embedder once; safe to share between
    threads. Opening failures are retried on the next call (the searcher recovers when, e.g.,
    a publisher releases the embedded shard).

    On the embedded engine the open shard is held until :meth:`close` (or
    ``evidence_runtime.reset()``): opening it costs ~0.1-0.2 s, too much per call. So, as
    DESIGN.md "Embedded index concurrency" says, one process at a time: while a publisher holds
    the shard, searches answer ``unavailable``/``index_locked`` and succeed again once it is
    done; while a searcher holds it, publishing fails fast with ``index_locked``. Publishing
    next to a live application needs a Qdrant server (the same code, ``engine: server``)."""

    def __init__(self, *, workspace_id: str, registry: Registry | None = None,
                 embedder: Embedder, registry_url: str | None = None,
                 index: EvidenceIndex | None = None, index_config: IndexConfig | None = None,
                 language: str = "italian", revisions_dir: Path | None = None,
                 rrf_k: int = DEFAULT_RRF_K, prefetch_limit: int = 50,
                 rrf_weights: tuple[float, float] | None = DEFAULT_RRF_WEIGHTS,
                 fusion: Fusion | None = None) -> None:
        self.workspace_id = workspace_id
        self._registry = registry
        self._registry_url = registry_url
        self.embedder = embedder
        self.language = language
        self.revisions_dir = revisions_dir
        self.prefetch_limit = prefetch_limit
        # how the two branches are fused (index.fusion); without one, the default fusion
        # with rrf_k and rrf_weights as its RRF settings (what fusion rrf uses)
        self.fusion = fusion or Fusion(DEFAULT_FUSION, rrf_k=rrf_k, weights=rrf_weights)
        self._index = index
        self._owns_index = index is None
        self._owns_registry = False
        self._index_config = index_config
        self._lock = threading.Lock()
        self._present: int | None = None  # the generation whose points were last found whole

    @classmethod
    def for_workspace(cls, workspace: Workspace | Path | str, *,
                      index: EvidenceIndex | None = None,
                      registry: Registry | None = None,
                      embedder: Embedder | None = None,
                      index_target: IndexConfig | None = None) -> EvidenceSearcher:
        """A searcher configured from a workspace's ``thoth.yaml`` and state directory (the
        index it opens: ``index_target``, default the workspace's)."""
        ws = workspace if isinstance(workspace, Workspace) else load_workspace(workspace)
        cfg = ws.config
        emb = embedder or make_embedder(cfg.embeddings.model,
                                        max_chunk_chars=cfg.embeddings.max_chunk_chars,
                                        threads=cfg.embeddings.threads)
        searcher = cls(
            workspace_id=cfg.workspace_id,
            registry=registry,
            registry_url=ws.registry_url,
            embedder=emb,
            index=index,
            index_config=index_target or index_config(ws),
            language=cfg.language,
            revisions_dir=ws.state_dir / "revisions",
            prefetch_limit=cfg.index.prefetch_limit,
            fusion=cfg.index.fusion_settings(),
        )
        searcher._owns_registry = registry is None
        return searcher

    @property
    def rrf_k(self) -> int:
        return self.fusion.rrf_k

    @rrf_k.setter
    def rrf_k(self, value: int) -> None:
        self.fusion = dataclasses.replace(self.fusion, rrf_k=value)

    @property
    def rrf_weights(self) -> tuple[float, float] | None:
        """RRF's (dense, BM25) weights; None: equal."""
        return self.fusion.weights

    @rrf_weights.setter
    def rrf_weights(self, value: tuple[float, float] | None) -> None:
        self.fusion = dataclasses.replace(self.fusion, weights=value)

    # --- resources ------------------------------------------------------------------------

    @property
    def registry(self) -> Registry:
        """The registry, opened on first use from the workspace's URL (a fault opening it is
        :class:`RegistryError`, answered as ``registry_unavailable`` by :meth:`search`)."""
        with self._lock:
            if self._registry is None:
                if self._registry_url is None:
                    raise RegistryError("no registry configured")
                self._registry = Registry.open(self._registry_url)
            return self._registry

    def index(self) -> EvidenceIndex:
        with self._lock:
            if self._index is None:
                if self._index_config is None:
                    raise IndexUnavailableError("no index configured")
                self._index = open_index(self._index_config, language=self.language)
            return self._index

    def close(self) -> None:
        """Release the index (the embedded shard lock) and the registry connection if this
        searcher opened them."""
        with self._lock:
            if self._index is not None and self._owns_index:
                self._index.close()
                self._index = None
            if self._owns_registry and self._registry is not None:
                self._registry.close()
                self._registry = None

    # --- search ---------------------------------------------------------------------------

    def resolve_generation(self, generation: int | None = None,
                           ) -> tuple[Generation, str] | EvidenceSearchOutcome:
        """The generation to query and the activated revision (a candidate asked for explicitly:
        the revision it was built from), or an unavailable outcome."""
        try:
            revision, active = self.registry.active_state(self.workspace_id)
            chosen = active if generation is None else self.registry.get_generation(
                self.workspace_id, generation)
        except RegistryError as exc:  # unreachable, locked, damaged or corrupt: fail closed
            self._reset_registry()
            return unavailable(UnavailableCode.registry_unavailable, exc.message)
        if generation is not None and chosen is None:
            return unavailable(UnavailableCode.generation_unknown,
                               f"generation {generation} does not exist")
        if generation is not None and chosen is not None and (
                chosen.status is GenerationStatus.failed
                or not chosen.counts.get("points_retained", True)):
            # its points were removed: searching it would answer an empty, misleading list
            why = "failed" if chosen.status is GenerationStatus.failed else "was retired"
            return unavailable(UnavailableCode.generation_unknown,
                               f"generation {generation} {why} and its points were removed",
                               generation=generation)
        if generation is not None and chosen is not None and (
                chosen.status is GenerationStatus.candidate):
            # a candidate is evaluated by its publisher before its revision is activated
            # (tht workspace publish switches both at once); it is never served
            return chosen, chosen.revision
        if chosen is None:
            return unavailable(UnavailableCode.no_active_generation,
                               "no Evidence generation is active for this workspace")
        if revision is None or chosen.revision != revision:
            return unavailable(
                UnavailableCode.revision_mismatch,
                f"generation {chosen.number} was built from revision {chosen.revision[:12]} "
                f"but the activated revision is {(revision or 'none')[:12]}: Evidence is in a "
                "maintenance window until the new generation is published",
                generation=chosen.number)
        return chosen, revision

    def search(self, query: str, purpose: EvidencePurpose | str,
               context: EvidenceSearchContext | None = None, *, limit: int = DEFAULT_LIMIT,
               generation: int | None = None, mode: QueryMode = "fused",
               ) -> EvidenceSearchOutcome:
        """Search the active generation (or an explicit one, for evaluation).

        Raises ``EmptyQueryError`` (a ``ValueError``) for an empty question: that is a caller
        bug, not a fault of the Evidence service.
        """
        purpose = EvidencePurpose(purpose)
        text = render_query(query, context)
        state = self.resolve_generation(generation)
        if isinstance(state, EvidenceSearchOutcome):
            return state.model_copy(update={"purpose": purpose})
        gen, revision = state
        elsewhere = self._other_engine(gen)
        if elsewhere is not None:
            return unavailable(UnavailableCode.generation_missing, elsewhere,
                               generation=gen.number, purpose=purpose)
        match = build_match(self.workspace_id, revision, gen.number, purpose, context)
        hits: list[Hit] = []
        try:
            # embedded before the index is opened: a searcher that opens the embedded shard
            # holds it (other processes wait, index.lock_wait_s) for the query alone, not for
            # a model load
            dense = self.embedder.embed_query(text) if mode != "bm25" else None
        except EmbedderError as exc:
            return unavailable(UnavailableCode.embedder_failed, exc.message, purpose=purpose)
        try:
            index = self.index()
            lost = self._lost_points(index, gen)
            if lost is None:
                hits = index.query(dense=dense, text=text if mode != "dense" else None,
                                   match=match, limit=max(limit * 4, limit), mode=mode,
                                   prefetch_limit=self.prefetch_limit, fusion=self.fusion,
                                   bm25=generation_bm25(gen, self.language))
                if not hits:  # nothing found: is it the question, or the points are gone?
                    lost = self._lost_points(index, gen, recount=True)
            if lost is not None:
                return unavailable(UnavailableCode.generation_missing,
                                   f"{lost}: publish the activated revision again "
                                   "(tht workspace preprocess evidence)",
                                   generation=gen.number, purpose=purpose)
            results = group_hits(hits, limit=limit, revision=revision,
                                 workspace_id=self.workspace_id)
        except ConfigError as exc:  # e.g. the server's API key variable is not set
            return unavailable(UnavailableCode.not_configured, str(exc), purpose=purpose)
        except IndexError_ as exc:
            # a damaged shard is released too, so that `tht workspace check --repair` can
            # open it; the next call opens it again
            if self._owns_index and isinstance(exc, (IndexLockedError, IndexUnavailableError,
                                                     IndexCorruptError)):
                self._reset_index()
            if isinstance(exc, IndexCorruptError):
                return unavailable(UnavailableCode.index_corrupt, exc.message,
                                   generation=gen.number, purpose=purpose)
            return unavailable(_index_code(exc), exc.message, purpose=purpose)
        return EvidenceSearchOutcome(status="available", generation=gen.number,
                                     revision=revision, purpose=purpose,
                                     results=tuple(results))

    def _other_engine(self, gen: Generation) -> str | None:
        """Why ``gen`` cannot be in the configured index: it was published to the other
        engine (the workspace's engine changed since); None when it may be."""
        recorded = gen.config.get("engine")
        engine = self._index_config.engine if self._index_config is not None else None
        if engine is None or recorded is None or recorded == engine:
            return None
        return (f"generation {gen.number} was published to the {recorded} index, but this "
                f"workspace reads the {engine} index (thoth.yaml index.engine): publish the "
                "activated revision again (tht workspace preprocess evidence)")

    def _lost_points(self, index: EvidenceIndex, gen: Generation, *,
                     recount: bool = False) -> str | None:
        """Why ``gen``'s points are missing, or None: counted once per generation change
        (cheap, one count), and again when ``recount``. The first time, the points are also
        checked whole (:func:`damaged_points`): :class:`IndexCorruptError` when they are not."""
        if self._present == gen.number and not recount:
            return None
        lost = missing_points(index, self.workspace_id, gen)
        if lost is None and self._present != gen.number:
            damaged = damaged_points(index, self.workspace_id, gen)
            if damaged is not None:
                self._present = None
                raise IndexCorruptError(damaged, path=self._where())
        self._present = None if lost else gen.number
        return lost

    def _where(self) -> str | None:
        cfg = self._index_config
        if cfg is None:
            return None
        return cfg.path if cfg.engine == "edge" else cfg.collection

    def _reset_registry(self) -> None:
        """Forget a registry this searcher opened, so the next call opens it again (it may
        have been repaired or restored meanwhile)."""
        with self._lock:
            if self._owns_registry and self._registry is not None:
                with contextlib.suppress(EvidenceError):
                    self._registry.close()
                self._registry = None

    def _reset_index(self) -> None:
        with self._lock:
            if self._index is not None:
                with contextlib.suppress(EvidenceError):
                    self._index.close()
                self._index = None

    # --- documents ------------------------------------------------------------------------

    def document(self, result: EvidenceResult) -> DocumentOutcome:
        """Resolve a result's full curated document from the materialized activated revision."""
        ref = result.document
        if self.revisions_dir is None:
            return DocumentOutcome(status="unavailable", code=UnavailableCode.document_missing,
                                   message="no revisions directory configured")
        file = self.revisions_dir / ref.revision / ref.path
        try:
            return DocumentOutcome(status="available", text=file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return DocumentOutcome(status="unavailable", code=UnavailableCode.document_missing,
                                   message=f"{ref.path} is missing at revision "
                                           f"{ref.revision[:12]}")


def index_config(ws: Workspace) -> IndexConfig:
    """The ``index`` section of a workspace with paths and environment resolved: the one
    index every entry point uses (a ``THT_QDRANT_URL`` that contradicts ``index.engine`` is a
    :class:`ConfigError`, see :meth:`Workspace.index_url`)."""
    cfg = ws.config.index
    url = ws.index_url()
    if cfg.engine == "edge":
        return IndexConfig(engine="edge", path=str(ws.index_path), lock_wait_s=cfg.lock_wait_s)
    return IndexConfig(engine="server", url=url, collection=ws.config.collection,
                       api_key_env=cfg.api_key_env, bm25=cfg.bm25)


# ---------------------------------------------------------------------------------------------
# Module-level API
# ---------------------------------------------------------------------------------------------

_default: EvidenceSearcher | None = None
_default_lock = threading.Lock()


def configure(workspace_root: Path | str | None = None, *,
              searcher: EvidenceSearcher | None = None) -> EvidenceSearcher:
    """Set the process-wide searcher used by :func:`search` (from a workspace or given).

    A previously configured searcher is closed.
    """
    global _default
    new = searcher or EvidenceSearcher.for_workspace(
        Path(workspace_root) if workspace_root else Path.cwd())
    with _default_lock:
        old, _default = _default, new
    if old is not None and old is not new:
        old.close()
    return new


def reset() -> None:
    """Close and forget the process-wide searcher (releasing the embedded shard); the next
    :func:`search` configures again from ``THT_WORKSPACE``."""
    global _default
    with _default_lock:
        old, _default = _default, None
    if old is not None:
        old.close()


def _configured() -> EvidenceSearcher | str:
    """The process-wide searcher, configured once from ``THT_WORKSPACE`` when needed."""
    global _default
    with _default_lock:
        if _default is not None:
            return _default
        root = os.environ.get("THT_WORKSPACE")
        if not root:
            return ("no workspace configured: call evidence_runtime.configure(root) or set "
                    "THT_WORKSPACE")
        try:
            _default = EvidenceSearcher.for_workspace(Path(root))
        except EvidenceError as exc:
            return str(exc)
        return _default


def search(query: str, purpose: EvidencePurpose | str,
           context: EvidenceSearchContext | None = None) -> EvidenceSearchOutcome:
    """The Evidence search of spec §10 on the configured workspace (see :func:`configure`).

    Without a configured searcher the ``THT_WORKSPACE`` environment variable names the root;
    with neither the outcome is ``unavailable`` with code ``not_configured``.
    """
    purpose = EvidencePurpose(purpose)
    searcher = _configured()
    if isinstance(searcher, str):
        render_query(query, context)  # an empty question is a caller bug even here
        return unavailable(UnavailableCode.not_configured, searcher, purpose=purpose)
    return searcher.search(query, purpose, context)


def resolve_document(result: EvidenceResult) -> DocumentOutcome:
    """The full curated document of ``result`` from the configured workspace's activated
    revision, or ``unavailable`` (``document_missing`` / ``not_configured``)."""
    searcher = _configured()
    if isinstance(searcher, str):
        return DocumentOutcome(status="unavailable", code=UnavailableCode.not_configured,
                               message=searcher)
    return searcher.document(result)


__all__ = [
    "DocumentOutcome",
    "DocumentRef",
    "EvidenceResult",
    "EvidenceSearchOutcome",
    "EvidenceSearcher",
    "ResultProvenance",
    "UnavailableCode",
    "configure",
    "reset",
    "resolve_document",
    "search",
]
