"""What a run tells: to the Dagster log always, and to the CLI when it runs the job in-process.

The CLI executes the jobs with ``execute_in_process`` in its own process, so a listener set here
sees each progress line as it happens, and a failure hook hands back the exception a step raised
(its message, problems and report), exactly as the plain functions would have raised it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg

from evidence_pipeline.publishing.embedding_cache import EmbeddingProgress

_listeners: list[Callable[[Any], None]] = []
_failures: list[list[BaseException]] = []


@contextmanager
def listening(callback: Callable[[Any], None]) -> Iterator[None]:
    """Send what steps :func:`forward` to ``callback`` while the block runs."""
    _listeners.append(callback)
    try:
        yield
    finally:
        _listeners.remove(callback)


def forward(item: Any) -> None:
    for callback in list(_listeners):
        callback(item)


def embedding_progress(context: dg.OpExecutionContext) -> Callable[[EmbeddingProgress], None]:
    """Embedding progress of a step (and that of the step's other slow phases, a
    ``PhaseProgress`` each): a log line at each tenth of the way (the run's log as a progress
    bar), and every update to a listening CLI (which draws its own bar)."""
    logged: dict[str, int] = {}

    def report(progress: EmbeddingProgress) -> None:
        forward(progress)
        phase = getattr(progress, "phase", "embedding")
        tenth = 10 * progress.done // progress.total if progress.total else 10
        if tenth > logged.get(phase, -1):
            logged[phase] = tenth
            context.log.info(progress.line())

    return report


def tell(context: dg.OpExecutionContext, message: str) -> None:
    """A progress line: into the run's log, and to a listening CLI."""
    context.log.info(message)
    forward(message)


@contextmanager
def capturing_failures() -> Iterator[list[BaseException]]:
    """Collect the exceptions raised by failed steps of in-process runs started in the block."""
    found: list[BaseException] = []
    _failures.append(found)
    try:
        yield found
    finally:
        _failures.remove(found)


@dg.failure_hook(name="remember_failure")
def remember_failure(context: dg.HookContext) -> None:
    """Keep a failed step's exception for the in-process caller (a no-op elsewhere)."""
    if _failures and context.op_exception is not None:
        _failures[-1].append(context.op_exception)
