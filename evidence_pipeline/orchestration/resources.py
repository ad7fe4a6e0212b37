"""Dagster resources: the workspace, the Evidence index, the dense embedder, the model backend.

Each builds what the CLI builds from ``thoth.yaml``; a field left unset keeps the workspace's own
setting. Secret values (registry URL with its password, API keys) are never written in config:
bind them with ``dg.EnvVar``.
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from evidence_pipeline.authoring.backends.base import ModelBackend
from evidence_pipeline.authoring.backends.factory import make_backend
from evidence_pipeline.publishing.index_writer import IndexWriter, open_index_writer
from evidence_runtime.embeddings import Embedder, make_embedder
from evidence_runtime.index import IndexConfig
from evidence_runtime.search import index_config
from evidence_runtime.workspace import RegistrySection, Workspace, load_workspace


class WorkspaceResource(dg.ConfigurableResource):
    """The workspace repository (thoth.yaml at its root) the pipeline reads and writes."""

    root: str = Field(description="Workspace root: a Git repository with thoth.yaml.")
    registry_url: str | None = Field(
        default=None,
        description="Registry database URL (holds a password: bind with EnvVar). Default: "
                    "thoth.yaml registry.url, THT_REGISTRY_URL, else SQLite in the state dir.")

    def load(self) -> Workspace:
        """Read ``thoth.yaml``; a :class:`ConfigError` names the field at fault."""
        ws = load_workspace(self.root)
        if self.registry_url:
            config = ws.config.model_copy(
                update={"registry": RegistrySection(url=self.registry_url)})
            ws = Workspace(root=ws.root, config=config)
        return ws


class IndexResource(dg.ConfigurableResource):
    """The workspace's Evidence index: an embedded Qdrant Edge shard or a Qdrant server, as
    the index section of thoth.yaml says (THT_QDRANT_URL read exactly as by the CLI and by
    search, in index_config). Where the index lives is the workspace's decision, not this
    resource's: the CLI, the searches and the Dagster runs use one index and one registry.
    Only the server's API key can be given here, as a secret bound with EnvVar.
    """

    api_key: str | None = Field(default=None,
                                description="Qdrant API key (a secret: bind with EnvVar).")

    def config(self, ws: Workspace) -> IndexConfig:
        """Where the index lives (:func:`index_config`: a ``THT_QDRANT_URL`` that contradicts
        ``index.engine`` is a :class:`ConfigError`)."""
        out = index_config(ws)
        if self.api_key:
            out = out.model_copy(update={"api_key": self.api_key})
        return out

    def open(self, ws: Workspace, *, dense_dim: int | None = None,
             create: bool = True) -> IndexWriter:
        """Open (with ``create``, prepare) the index for publishing; close it promptly: an
        Edge shard is held by one process at a time."""
        return open_index_writer(self.config(ws), language=ws.config.language,
                                 dense_dim=dense_dim, create=create)


class EmbedderResource(dg.ConfigurableResource):
    """The dense embedder of thoth.yaml (the runtime embeds questions with the same model,
    so only the thread count can be changed here)."""

    threads: int | None = Field(default=None, ge=1, le=64,
                                description="Inference threads (default: thoth.yaml).")

    def make(self, ws: Workspace) -> Embedder:
        cfg = ws.config.embeddings
        return make_embedder(cfg.model, max_chunk_chars=cfg.max_chunk_chars,
                             threads=self.threads or cfg.threads)


class ModelBackendResource(dg.ConfigurableResource):
    """The model backend of prepare: the model section of thoth.yaml unless overridden."""

    backend: str | None = Field(default=None,
                                description="pi | openai | structural (default: thoth.yaml).")
    api_key: str | None = Field(
        default=None, description="API key of the openai backend (a secret: bind with EnvVar; "
                                  "default: the variable named by model.api_key_env).")

    def make(self, ws: Workspace, *, backend: str | None = None) -> ModelBackend:
        """Build the backend (``backend`` wins over this resource, which wins over thoth.yaml);
        an unknown name or bad setting is a :class:`ConfigError`."""
        name = backend or self.backend or ws.config.model.backend
        model = make_backend(name, ws.config.model.settings())
        if self.api_key and hasattr(model, "api_key"):
            model.api_key = self.api_key
        return model
