"""The CLI's bridge to Dagster: with ``DAGSTER_HOME`` set, ``tht evidence prepare``,
``tht workspace preprocess evidence`` and ``tht workspace publish`` execute the ``prepare``,
``publish`` and ``publish_revision`` jobs in-process against that instance, so a curator's run
appears in the Dagster UI.

Results and errors are the plain functions' own: the same :class:`PrepareResult` or
:class:`PublishResult`, the same :class:`PrepareError`, :class:`PublishError` or
:class:`GateFailed` with their problems and report. Dagster is imported only here, lazily.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evidence_runtime.errors import ConfigError, EvidenceError

if TYPE_CHECKING:
    import dagster as dg

    from evidence_pipeline.authoring.prepare import PrepareResult
    from evidence_pipeline.publishing.publish import PublishResult

HOME_ENV = "DAGSTER_HOME"
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def enabled() -> bool:
    """Whether the CLI runs its jobs through Dagster (``DAGSTER_HOME`` is set)."""
    return bool(os.environ.get(HOME_ENV))


@contextmanager
def _instance() -> Iterator[dg.DagsterInstance]:
    import dagster as dg

    home = os.environ.get(HOME_ENV, "")
    if not Path(home).is_dir():
        raise ConfigError(f"{HOME_ENV} is set to {home!r}, which is not a directory; create it "
                          f"or unset {HOME_ENV} to run without Dagster", field=HOME_ENV)
    dagster_log = logging.getLogger("dagster")
    level = dagster_log.level
    dagster_log.setLevel(logging.ERROR)  # e.g. "no dagster.yaml, using defaults": not for the CLI
    try:
        instance = dg.DagsterInstance.get()
    except Exception as exc:  # a bad dagster.yaml: one clear line, not a traceback
        raise ConfigError(f"cannot open the Dagster instance in {home}: {exc}",
                          field=HOME_ENV) from None
    finally:
        dagster_log.setLevel(level)
    with instance:
        yield instance


def _resources(root: Path) -> dict[str, Any]:
    # exactly the CLI's settings: thoth.yaml and the environment, no code-location overrides
    from evidence_pipeline.orchestration.resources import (
        EmbedderResource,
        IndexResource,
        ModelBackendResource,
        WorkspaceResource,
    )

    return {"workspace": WorkspaceResource(root=str(Path(root).resolve())),
            "index": IndexResource(), "embedder": EmbedderResource(),
            "model": ModelBackendResource()}


def _execute(job_name: str, root: Path, run_config: dict[str, Any],
             progress: Callable[[Any], None] | None) -> tuple[Any, list[BaseException]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from evidence_pipeline.definitions import defs
        from evidence_pipeline.orchestration.progress import (
            capturing_failures,
            listening,
            remember_failure,
        )
        from evidence_runtime.workspace import load_workspace

        job = defs.resolve_job_def(job_name).with_hooks({remember_failure})
        # the workspace id, as the sensor's runs are tagged: one value per workspace
        wid = load_workspace(root).config.workspace_id
        with _instance() as instance, capturing_failures() as failures, \
                listening(progress or (lambda _item: None)):
            result = job.execute_in_process(
                run_config={**run_config, **QUIET}, instance=instance,
                resources=_resources(root), raise_on_error=False,
                tags={"tht/trigger": "cli", "tht/workspace": wid})
    return result, failures


def _raise_step_failure(result: Any, failures: list[BaseException]) -> None:
    """Re-raise what a failed step raised (an expected error keeps its class and details,
    also when the step turned it into a ``dg.Failure`` for the UI)."""
    from evidence_pipeline.orchestration.operations import Refusal

    for exc in failures:
        if isinstance(exc, Refusal):
            raise exc.error
        if isinstance(exc, EvidenceError):
            raise exc
    from dagster import DagsterAssetCheckFailedError

    for exc in failures:
        if not isinstance(exc, DagsterAssetCheckFailedError):
            raise exc
    messages = [e.step_failure_data.error.message.strip() for e in result.all_events
                if e.is_step_failure and e.step_failure_data.error is not None]
    raise EvidenceError(f"the Dagster run {result.run_id} failed: "
                        f"{messages[0] if messages else 'see the run in the Dagster UI'}",
                        code="dagster_run_failed")


def _failed_checks(result: Any) -> set[str]:
    return {e.asset_check_evaluation_data.check_name for e in result.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION"
            and not e.asset_check_evaluation_data.passed}


def run_prepare(root: Path, *, backend: str | None = None, upgrade: bool = False,
                progress: Callable[[Any], None] | None = None,
                model_progress: Callable[[Any], None] | None = None) -> PrepareResult:
    """``prepare`` as the Dagster job ``prepare``; raises what :func:`prepare` raises
    (``model_progress`` hears the model calls' count, as from :func:`prepare`)."""
    from evidence_pipeline.orchestration.authoring import applied_batch, plan_sources
    from evidence_pipeline.orchestration.jobs import prepare_job
    from evidence_pipeline.publishing.progress import PhaseProgress

    def heard(item: Any) -> None:
        listener = model_progress if isinstance(item, PhaseProgress) else progress
        if listener is not None:
            listener(item)

    batch = applied_batch.node_def.name
    config = {"ops": {batch: {"ops": {plan_sources.name: {"config": {
        "upgrade": upgrade, "backend": backend}}}}}}
    result, failures = _execute(prepare_job.name, root, config, heard)
    if not result.success and not _applied(result):
        _raise_step_failure(result, failures)
    return result.output_for_node(batch)


def _applied(result: Any) -> bool:
    # the batch was applied even when only the validation check of the work tree failed
    from evidence_pipeline.orchestration.authoring import applied_batch, apply_sources

    step = f"{applied_batch.node_def.name}.{apply_sources.name}"
    return any(e.is_step_success and (e.step_key or "").startswith(step)
               for e in result.all_events)


def run_preprocess(root: Path, *, progress: Callable[[Any], None] | None = None,
                   embedding: Callable[[Any], None] | None = None) -> PublishResult:
    """``preprocess`` as the Dagster job ``publish``; raises what :func:`preprocess` raises
    (``embedding`` hears the embedding progress, as from :func:`preprocess`)."""
    from evidence_pipeline.orchestration.jobs import publish_job
    from evidence_pipeline.orchestration.publishing import (
        active_generation,
        evaluation_gate,
        generation_evaluation,
        publishable,
        published_corpus,
    )
    from evidence_pipeline.publishing.publish import gate_failure, require_publishable

    heard = _listener(progress, embedding)

    result, failures = _execute(publish_job.name, root, {}, heard)
    if result.success:
        published = result.output_for_node(active_generation.node_def.name)
        published.timings = _timings(result, published.timings)
        return published
    failed = _failed_checks(result)
    if publishable.check_key.name in failed:
        require_publishable(result.output_for_node(published_corpus.node_def.name))
    if evaluation_gate.check_key.name in failed:
        raise gate_failure(result.output_for_node(generation_evaluation.node_def.name))
    _raise_step_failure(result, failures)
    raise AssertionError("unreachable")


def _listener(progress: Callable[[Any], None] | None,
              embedding: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """What a publish run says, handed on: the embedding progress to ``embedding``, every other
    message to ``progress``."""
    from evidence_pipeline.publishing.embedding_cache import EmbeddingProgress

    def heard(item: Any) -> None:
        if isinstance(item, EmbeddingProgress):
            if embedding is not None:
                embedding(item)
        elif progress is not None:
            progress(item)
    return heard


def run_publish(root: Path, *, revision: str | None = None,
                progress: Callable[[Any], None] | None = None,
                embedding: Callable[[Any], None] | None = None) -> PublishResult:
    """``tht workspace publish`` as the Dagster job ``publish_revision``; raises what
    :func:`publish_revision` raises (a failed gate: :class:`GateFailed` with its report)."""
    from evidence_pipeline.orchestration.operations import (
        publish_and_switch,
        publish_revision_job,
    )

    heard = _listener(progress, embedding)

    config = {"ops": {publish_and_switch.name: {"config": {"revision": revision}}}}
    result, failures = _execute(publish_revision_job.name, root, config, heard)
    if result.success:
        return result.output_for_node(publish_and_switch.name)
    _raise_step_failure(result, failures)
    raise AssertionError("unreachable")


def _stage_timings() -> dict[str, str]:
    """Step key of each timed stage → the ``preprocess`` timing it reports."""
    from evidence_pipeline.orchestration.publishing import (
        generation_evaluation,
        published_corpus,
    )

    # fragments_s and embed_s come from the candidate's own timings (candidate_generation
    # cuts and embeds the whole revision; the per-source source_fragments is not in publish)
    return {published_corpus.node_def.name: "validate_s",
            generation_evaluation.node_def.name: "evaluate_s"}


def _timings(result: Any, timings: dict[str, float]) -> dict[str, float]:
    """Stage seconds from the run's steps, as ``preprocess`` reports them."""
    stage_timings = _stage_timings()
    stages: dict[str, float] = {}
    total = 0.0
    for event in result.all_events:
        if event.is_step_success:
            seconds = event.event_specific_data.duration_ms / 1000
            total += seconds
            if event.step_key in stage_timings:
                stages[stage_timings[event.step_key]] = seconds
    merged = {**stages, **timings, "total_s": total}
    order = ("validate_s", "fragments_s", "embed_s", "upload_s", "verify_s", "evaluate_s",
             "total_s")
    return {k: merged[k] for k in order if k in merged}
