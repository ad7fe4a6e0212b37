"""How far a publication's slow phases are: the embedding (``EmbeddingProgress``) and, the same
way, validation, upload and evaluation (:class:`PhaseProgress`).

A phase's progress travels on the callback that already carries the embedding's
(``preprocess(embedding=…)``, the Dagster step's ``embedding_progress(context)``): the CLI draws
one bar per phase on a terminal, a Dagster run logs a line at each tenth of each phase.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evidence_pipeline.publishing.embedding_cache import EmbeddingProgress

__all__ = ["PhaseProgress", "PhaseReporter", "phase_reporter"]

# how many updates a phase sends at most (besides its first and last): a bar moves smoothly,
# and a large corpus does not pay a callback per file
_STEPS = 50


@dataclass(frozen=True)
class PhaseProgress(EmbeddingProgress):
    """``done`` of ``total`` ``items`` of the publication phase ``phase`` (an
    ``EmbeddingProgress``, so every listener of the embedding hears it too)."""

    phase: str = "embedding"
    items: str = "new fragment(s)"

    def line(self) -> str:
        percent = 100 * self.done // self.total if self.total else 100
        return f"{self.phase}: {self.done}/{self.total} {self.items} ({percent}%)"

    @property
    def label(self) -> str:
        """What a progress bar says: ``validating curated file(s)``."""
        return f"{self.phase} {self.items}"


PhaseReporter = Callable[[int, int], None]


def phase_reporter(listener: Callable[[Any], None] | None, phase: str, items: str
                   ) -> PhaseReporter | None:
    """A ``(done, total)`` callback that sends :class:`PhaseProgress` of ``phase`` to
    ``listener``: the start, the end, and about every fiftieth of the way between; None
    without a listener."""
    if listener is None:
        return None
    sent = -1

    def report(done: int, total: int) -> None:
        nonlocal sent
        step = max(1, total // _STEPS)
        if (done in (0, total) or done - sent >= step) and done != sent:
            sent = done
            listener(PhaseProgress(done, total, phase, items))

    return report
