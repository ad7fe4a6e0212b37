"""Where the index lives (:class:`IndexConfig`) and :func:`open_index`, the reader's factory."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evidence_runtime.errors import ConfigError, IndexMissingError
from evidence_runtime.index.base import EvidenceIndex
from evidence_runtime.index.edge import DEFAULT_LOCK_WAIT_S, EdgeIndex
from evidence_runtime.index.server import Bm25Mode, ServerIndex

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

__all__ = ["INDEX_ENGINES", "IndexConfig", "open_index", "server_client"]

INDEX_ENGINES = ("edge", "server")


class IndexConfig(BaseModel):
    """The workspace's ``index`` block with paths and environment resolved.

    ``engine: edge`` names a Qdrant Edge shard directory (``path``); ``engine: server`` a
    collection on a Qdrant server (``url``, ``collection``), with optional ``api_key`` (or
    ``api_key_env``, the name of the variable holding it), ``bm25`` (``server`` | ``client``),
    ``timeout`` and ``prefer_grpc``. ``url: ":memory:"`` is qdrant-client's in-process mode,
    which needs ``bm25: client`` (its default there). ``lock_wait_s``: how long an open of the
    embedded shard waits while another process holds it (then ``IndexLockedError``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: Literal["edge", "server"] = "edge"
    path: str | None = None
    url: str | None = None
    collection: str | None = None
    api_key: str | None = Field(default=None, repr=False)
    api_key_env: str | None = None
    bm25: Bm25Mode | None = None
    timeout: int = 10
    prefer_grpc: bool = False
    lock_wait_s: float = Field(default=DEFAULT_LOCK_WAIT_S, ge=0, le=600)

    @classmethod
    def of(cls, config: IndexConfig | Mapping[str, Any]) -> IndexConfig:
        """A config as given, or built from a mapping: keys that are ``None`` count as absent
        and other keys are ignored, so a whole validated ``index`` section can be passed. An
        unknown engine or a wrong value is :class:`ConfigError` naming the field."""
        if isinstance(config, IndexConfig):
            return config
        values = {k: v for k, v in config.items() if v is not None and k in cls.model_fields}
        engine = values.get("engine", "edge")
        if engine not in INDEX_ENGINES:
            raise ConfigError(
                f"unknown index engine {engine!r}; expected one of: {', '.join(INDEX_ENGINES)}",
                field="index.engine",
            )
        bm25 = values.get("bm25")
        if bm25 is not None and bm25 not in ("server", "client"):
            raise ConfigError(
                f"bm25 must be 'server' or 'client', not {bm25!r}", field="index.bm25"
            )
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            field = ".".join(str(p) for p in err["loc"])
            raise ConfigError(f"{err['msg']}", field=f"index.{field}") from None

    @property
    def in_memory(self) -> bool:
        return self.url == ":memory:"

    @property
    def bm25_mode(self) -> Bm25Mode:
        """``bm25`` as set, else ``client`` in qdrant-client's in-memory mode, else ``server``."""
        return self.bm25 or ("client" if self.in_memory else "server")

    def edge_path(self) -> Path:
        """The shard directory; :class:`ConfigError` when the engine is not edge or has none."""
        if self.engine != "edge" or not self.path:
            raise ConfigError("the edge index needs a path", field="index.path")
        return Path(self.path)

    def server_target(self) -> tuple[str, str]:
        """``(url, collection)`` of the server engine; :class:`ConfigError` naming the field
        that is missing or wrong."""
        if not self.url:
            raise ConfigError("the server index needs a url", field="index.url")
        if not self.collection:
            raise ConfigError("the server index needs a collection", field="index.collection")
        if self.in_memory and self.bm25_mode == "server":
            raise ConfigError(
                "qdrant-client's in-memory mode cannot run qdrant/bm25; use bm25: client",
                field="index.bm25",
            )
        return self.url, self.collection

    def resolved_api_key(self) -> str | None:
        """The API key, read from ``api_key_env`` when only that is given."""
        if self.api_key is not None or self.api_key_env is None:
            return self.api_key
        api_key = os.environ.get(self.api_key_env)
        if not api_key:
            raise ConfigError(
                f"environment variable {self.api_key_env} (the Qdrant API key) is not set",
                field="index.api_key_env",
            )
        return api_key


def server_client(config: IndexConfig) -> tuple[QdrantClient, str]:
    """A qdrant-client for the server engine and the collection name (checked first)."""
    url, collection = config.server_target()
    api_key = config.resolved_api_key()
    from qdrant_client import QdrantClient

    if config.in_memory:
        return QdrantClient(location=":memory:"), collection
    try:
        client = QdrantClient(
            url=url, api_key=api_key, timeout=config.timeout, prefer_grpc=config.prefer_grpc
        )
    except Exception as exc:  # bad URL shapes are raised at construction
        raise ConfigError(f"cannot use index url {url!r}: {exc}", field="index.url") from exc
    return client, collection


def open_index(
    config: IndexConfig | Mapping[str, Any], *, language: str = "italian"
) -> EvidenceIndex:
    """Open the published index for reading.

    An embedded shard that does not exist, or a server collection that does not, is
    :class:`IndexMissingError` (an ``IndexUnavailableError``); an unknown engine or a missing
    value is :class:`ConfigError`; relative paths are the caller's to resolve.
    """
    cfg = IndexConfig.of(config)
    if cfg.engine == "edge":
        return EdgeIndex.open(cfg.edge_path(), language=language, lock_wait_s=cfg.lock_wait_s)
    client, collection = server_client(cfg)
    index = ServerIndex(client, collection, language=language, bm25=cfg.bm25_mode)
    if not index.exists():
        index.close()
        raise IndexMissingError("the collection does not exist", path=collection)
    return index
