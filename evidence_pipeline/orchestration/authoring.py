"""Authoring assets: per-source hashing, normalization, model step and checks, then the batch.

Per-source stages are partitioned by source file. A prepare run is the graph asset
``applied_batch``: one planning step hashes every source against the manifest and fans out one
step per changed source only (an unchanged source produces no step and no model call); after
``collect()`` one step takes every proposal in, checks the whole batch and applies it all or
nothing — the functions ``tht evidence prepare`` runs, in the same order. The partitioned assets
run the same functions for one source from the UI (a preview: nothing is written).

Every stage records a data version: a source's is its hash, so an unchanged source materializes
``source_file`` with the hash it had (the partition is not "Missing", a backfill over unchanged
sources ends green) and, having no output, runs nothing downstream. Steps run in the pool
``authoring`` (``dagster.yaml``: one authoring run at a time, never holding back publishing).
"""

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dagster as dg
from pydantic import Field

from evidence_pipeline.authoring.planner import SourceProposal, SourceReport
from evidence_pipeline.authoring.prepare import (
    MODEL_CALLS,
    RESTRUCTURED,
    PreparePlan,
    PrepareResult,
    apply_plan,
    call_model,
    model_request,
    plan_prepare,
    recovered_result,
)
from evidence_pipeline.authoring.session import AuthoringSession
from evidence_pipeline.authoring.sources import Change, SourceChange, SourceError, compare, intake
from evidence_pipeline.formats.manifest import MANIFEST_NAME, empty_manifest, read_manifest
from evidence_pipeline.orchestration.metadata import (
    CURATORS,
    catalog,
    corpus_metadata,
    digest,
    problems_table,
    source_links,
    version_tags,
)
from evidence_pipeline.orchestration.observation import (
    EVIDENCE_SOURCE,
    committed_blobs,
    head_commit,
    observed,
)
from evidence_pipeline.orchestration.operations import (
    Refusal,
    preview_metadata,
    preview_source,
)
from evidence_pipeline.orchestration.partitions import (
    SOURCE_PARTITIONS,
    check_source_key,
    is_source_key,
    mapping_key,
    sync_source_partitions,
)
from evidence_pipeline.orchestration.progress import forward
from evidence_pipeline.orchestration.resources import ModelBackendResource, WorkspaceResource
from evidence_pipeline.publishing.progress import PhaseProgress
from evidence_pipeline.review.build import review_path
from evidence_pipeline.validation.corpus import LoadedUnit
from evidence_pipeline.validation.problems import Severity, ValidationReport
from evidence_pipeline.validation.validator import validate_corpus
from evidence_runtime.errors import EvidenceError
from evidence_runtime.workspace import Workspace

GROUP = "authoring"
POOL = "authoring"
CATALOG = catalog(GROUP, CURATORS)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _source_version(change: SourceChange) -> str:
    """The data version of ``source_file``: the source's sha256 (as the manifest records it)."""
    assert change.source is not None
    return change.source.sha256.removeprefix("sha256:")


def _proposal_version(proposal: SourceProposal) -> str:
    """The data version of ``restructured_units``: the proposed units (or the model's error)."""
    if proposal.reply is None:
        failure = proposal.failure
        return digest({"failure": [failure.code, failure.message] if failure else None})
    return digest({"units": [[u.id, u.data, u.body] for u in proposal.reply.units],
                   "retire": list(proposal.reply.retirement_candidates)})


def _report_version(report: SourceReport) -> str:
    """The data version of ``validated_units``: the unit ids the source ends with."""
    return digest({"path": report.path, "units": list(report.units)})


def _proposal_metadata(proposal: SourceProposal) -> dict[str, Any]:
    out: dict[str, Any] = {"model_seconds": dg.MetadataValue.float(round(proposal.seconds, 3))}
    if proposal.reply is not None:
        out["proposed_units"] = dg.MetadataValue.int(len(proposal.reply.units))
        out["retirement_candidates"] = dg.MetadataValue.int(
            len(proposal.reply.retirement_candidates))
        out["titles"] = ", ".join(str(u.data.get("title", "?")) for u in proposal.reply.units)
    if proposal.failure is not None:
        out["model_error"] = f"{proposal.failure.code}: {proposal.failure.message}"
    return out


# --- per source (partitioned): the four stages in one step, one run for any number of sources ---

SOURCE_STAGES = ("source_file", "normalized_source", "restructured_units", "validated_units")
source_file, normalized_source, restructured_units, validated_units = (
    dg.AssetKey(name) for name in SOURCE_STAGES)
_STAGE_SPECS = {
    "source_file": ({"markdown"}, [EVIDENCE_SOURCE],
                    "A source note taken in and hashed (the hash is its data version). Stale "
                    "when the committed note changed (evidence_source)."),
    "normalized_source": ({"markdown"}, [source_file],
                          "The source's mechanical normalization (spec 5.2), as intake "
                          "computed it."),
    "restructured_units": ({"llm"}, [normalized_source],
                           "The one model call of a changed or new source: its proposed units "
                           "(not yet written). An unchanged source keeps its curated units: "
                           "no model call."),
    "validated_units": ({"markdown"}, [restructured_units],
                        "The proposal checked as a prepare of this source alone would: its "
                        "units, their review items and the diff against the curated tree "
                        "(nothing is written)."),
}


@dg.multi_asset(
    name="source_stages", partitions_def=SOURCE_PARTITIONS, can_subset=True, pool=POOL,
    # a backfill of any number of sources is one run (one intake, one plan), not one run each
    backfill_policy=dg.BackfillPolicy.single_run(),
    specs=[dg.AssetSpec(name, deps=deps, description=text, group_name=GROUP, kinds=kinds,
                        partitions_def=SOURCE_PARTITIONS, skippable=True, **CATALOG)
           for name, (kinds, deps, text) in _STAGE_SPECS.items()])
def source_stages(context: dg.AssetExecutionContext, workspace: WorkspaceResource,
                  model: ModelBackendResource) -> Iterator[dg.MaterializeResult]:
    """The selected per-source stages of the run's sources (one partition, a range or a whole
    backfill): every source hashed against the manifest once; a changed or new one gets its
    model call and its preview; an unchanged one records its curated units (no model call).
    Every selected stage is recorded on every partition with its data version, so a green
    backfill fills all four assets. A source whose preview is refused is named, the others
    are recorded, and the step fails at the end."""
    ws = workspace.load()
    stages = {key.path[-1] for key in context.selected_asset_keys}
    keys = [check_source_key(k) for k in context.partition_keys]
    refused = record_sources(context, ws, keys, stages, model)
    context.log.info(f"{len(keys)} source(s) recorded" + (
        f"; refused: {', '.join(refused)}" if refused else ""))
    if refused:
        raise Refusal(next(iter(refused.values())) if len(refused) == 1 else EvidenceError(
            f"{len(refused)} source previews refused: " + "; ".join(
                f"{k}: {e.code}: {e}" for k, e in refused.items()),
            path=", ".join(refused), code=next(iter(refused.values())).code))
    # every stage is recorded per partition above (a result here would give all the run's
    # partitions one and the same metadata)
    yield from ()


def _unchanged_version(path: str, units: list[str]) -> str:
    return digest({"path": path, "units": units})


def record_sources(context: dg.AssetExecutionContext, ws: Workspace, keys: list[str],
                   stages: set[str], model: ModelBackendResource) -> dict[str, EvidenceError]:
    """Record ``stages`` of every source in ``keys``; the refused sources and why."""
    manifest = read_manifest(ws.evidence_dir) or empty_manifest()
    sources, errors = intake(ws.evidence_dir)
    changes = {c.path: c for c in compare(sources, manifest)}
    broken = {e.path: e for e in errors}
    blobs = committed_blobs(ws) if "source_file" in stages else {}
    commit = head_commit(ws)
    plan: PreparePlan | None = None
    backend = None
    refused: dict[str, EvidenceError] = {}

    def record(stage: str, key: str, version: str, metadata: dict[str, Any],
               inputs: dict[str, str], pointers: dict[str, int] | None = None) -> None:
        if stage in stages:
            context.log_event(dg.AssetMaterialization(
                stage, partition=key, metadata=metadata,
                tags=version_tags(version, inputs, pointers=pointers)))

    for key in keys:
        change = changes.get(key)
        if change is None or change.source is None:
            refused[key] = broken.get(key) or SourceError("no such source file", path=key,
                                                          code="source_missing")
            continue
        src = change.source
        hashed = _source_version(change)
        # the note as committed is the input (a committed edit then shows this stale)
        inputs = {"evidence_source": blobs[key]} if key in blobs else {}
        pointer = observed(context.instance, key, blobs[key]) if key in blobs else None
        record("source_file", key, hashed, {
            "sha256": src.sha256, "change": change.change.value,
            "characters": dg.MetadataValue.int(len(src.text)),
            **source_links(ws, commit, key)}, inputs,
            {"evidence_source": pointer} if pointer is not None else None)
        normalized = _digest(src.normalized)
        record("normalized_source", key, normalized, {
            "lines": dg.MetadataValue.int(src.normalized.count("\n")),
            "characters": dg.MetadataValue.int(len(src.normalized)),
            "normalization_changed_text": src.normalized != src.text}, {"source_file": hashed})
        if not stages & {"restructured_units", "validated_units"}:
            continue
        if change.change not in RESTRUCTURED:
            units = list(manifest.sources[key].units) if key in manifest.sources else []
            version = _unchanged_version(key, units)
            shown = {"change": change.change.value, "model_calls": dg.MetadataValue.int(0),
                     "units": dg.MetadataValue.int(len(units)),
                     "unit_ids": ", ".join(units) or "none"}
            record("restructured_units", key, version, shown, {"normalized_source": normalized})
            record("validated_units", key, version, shown, {"restructured_units": version})
            continue
        if plan is None:
            # a preview writes nothing: it does not finish an interrupted apply either
            with AuthoringSession.open(ws, what="prepare (source preview)",
                                       recovering=False) as session:
                plan = plan_prepare(session)
            backend = model.make(ws)
        planned = next((c for c in plan.changes if c.path == key), None)
        if planned is None or planned.source != src:
            refused[key] = SourceError("the source or the manifest changed while the run "
                                       "read it; materialize it again", path=key,
                                       code="source_changed")
            continue
        proposal = call_model(backend, model_request(plan, planned))
        proposed = _proposal_version(proposal)
        record("restructured_units", key, proposed, _proposal_metadata(proposal),
               {"normalized_source": normalized})
        if "validated_units" not in stages:
            continue
        try:
            planner, diff = preview_source(plan, proposal)
        except EvidenceError as exc:
            refused[key] = exc
            continue
        report = next(r for r in planner.reports if r.path == key)
        record("validated_units", key, _report_version(report),
               preview_metadata(planner, key, diff, review_path(ws)),
               {"restructured_units": proposed})
    return refused


# --- the batch: every changed source, then one all-or-nothing apply ------------------------------


class PrepareConfig(dg.Config):
    """Options of a prepare run (tht evidence prepare)."""

    upgrade: bool = Field(default=False, description="Reprocess every source (new pipeline "
                                                     "version); needs a clean repository.")
    backend: str | None = Field(default=None, description="pi | openai | structural "
                                                          "(default: the model resource).")


@dataclass(frozen=True)
class SourceStep:
    """One changed source handed to its model step."""

    change: SourceChange
    request: Any  # ModelRequest
    backend: str | None
    total: int = 1  # the run's model steps (changed sources), for the progress count


@dataclass(frozen=True)
class BatchPlan:
    """What the planning step hands to the apply step (``fingerprint`` None: recovered only)."""

    fingerprint: tuple[Any, ...] | None
    recovered: list[str]
    upgrade: bool


def _change_counts(plan: PreparePlan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for change in plan.changes:
        counts[change.change.value] = counts.get(change.change.value, 0) + 1
    return dict(sorted(counts.items()))


def _log_hashes(context: dg.OpExecutionContext, plan: PreparePlan) -> None:
    """``source_file`` of every source with a partition, at the hash it has now (one summary
    line in the log, not one per source)."""
    for change in plan.changes:
        if change.source is not None and is_source_key(change.path):
            context.log_event(dg.AssetMaterialization(
                "source_file", partition=change.path,
                metadata={"sha256": change.source.sha256, "change": change.change.value,
                          "characters": dg.MetadataValue.int(len(change.source.text))},
                tags=version_tags(_source_version(change))))
    context.log.info(f"{len(plan.changes)} source(s) hashed: " + ", ".join(
        f"{n} {what}" for what, n in _change_counts(plan).items()))


@dg.op(ins={"after": dg.In(dg.Nothing)},
       out={"steps": dg.DynamicOut(SourceStep), "plan": dg.Out(BatchPlan)}, pool=POOL)
def plan_sources(context: dg.OpExecutionContext, config: PrepareConfig,
                 workspace: WorkspaceResource) -> Iterator[dg.Output | dg.DynamicOutput]:
    """Hash every source against the manifest; one step per changed source, none otherwise."""
    ws = workspace.load()
    sync_source_partitions(context.instance, ws.evidence_dir)
    with AuthoringSession.open(ws, what="prepare") as session:
        recovered = session.recovered
        if session.rolled_forward:
            yield dg.Output(BatchPlan(None, recovered, config.upgrade), output_name="plan")
            return
        plan = plan_prepare(session, upgrade=config.upgrade)
        changed = plan.to_restructure()
        steps = [SourceStep(c, model_request(plan, c), config.backend, len(changed))
                 for c in changed]
    _log_hashes(context, plan)
    if steps:
        _model_calls(context, 0, len(steps))
    for step in steps:
        yield dg.DynamicOutput(step, mapping_key=mapping_key(step.change.path),
                               output_name="steps")
    yield dg.Output(BatchPlan(plan.fingerprint(), recovered, config.upgrade), output_name="plan",
                    metadata={k: dg.MetadataValue.int(v)
                              for k, v in _change_counts(plan).items()})


def _model_calls(context: dg.OpExecutionContext, done: int, total: int) -> None:
    """``model calls: done/total source(s)``: to a listening CLI always, into the run's log at
    each tenth of the way (as the publication's phases, ``embedding_progress``)."""
    progress = PhaseProgress(done, total, *MODEL_CALLS)
    forward(progress)
    if done in (0, total) or 10 * done // total > 10 * (done - 1) // total:
        context.log.info(progress.line())


def _model_steps_done(context: dg.OpExecutionContext) -> int:
    """How many model steps of this run have succeeded so far (a step counts itself only once
    it has returned): steps in other processes count too, so the count needs no shared state;
    two parallel steps that finish at once may both see the same count."""
    marker = f"{restructure_source.name}["
    records = context.instance.get_records_for_run(
        context.run_id, of_type=dg.DagsterEventType.STEP_SUCCESS).records
    return sum(1 for r in records if marker in (r.event_log_entry.step_key or ""))


@dg.op(pool=POOL)
def restructure_source(context: dg.OpExecutionContext, step: SourceStep,
                       workspace: WorkspaceResource,
                       model: ModelBackendResource) -> SourceProposal:
    """The model step of one changed source (a failure is kept as that source's problem)."""
    ws = workspace.load()
    proposal = call_model(model.make(ws, backend=step.backend), step.request)
    key = step.change.path
    src = step.change.source
    assert src is not None
    if is_source_key(key):  # source_file was recorded by plan_sources
        normalized = _digest(src.normalized)
        context.log_event(dg.AssetMaterialization(
            "normalized_source", partition=key,
            metadata={"characters": dg.MetadataValue.int(len(src.normalized))},
            tags=version_tags(normalized, {"source_file": _source_version(step.change)})))
        context.log_event(dg.AssetMaterialization(
            "restructured_units", partition=key, metadata=_proposal_metadata(proposal),
            tags=version_tags(_proposal_version(proposal), {"normalized_source": normalized})))
    else:
        context.log.warning(f"{key!r} has no valid partition key; no per-source record")
    _model_calls(context, min(_model_steps_done(context) + 1, step.total), step.total)
    return proposal


@dg.op(pool=POOL)
def apply_sources(context: dg.OpExecutionContext, plan: BatchPlan,
                  proposals: list[SourceProposal],
                  workspace: WorkspaceResource) -> dg.Output[PrepareResult]:
    """Take in every proposal in path order, check the whole batch, apply all or nothing."""
    ws = workspace.load()
    if plan.fingerprint is None:
        return dg.Output(recovered_result(plan.recovered), metadata={"status": "recovered"})
    by_path = {p.path: p for p in proposals}
    unchanged: list[SourceReport] = []

    def progress(report: SourceReport) -> None:
        if report.change is Change.unchanged:
            unchanged.append(report)  # one summary line for all of them, below
        else:
            renamed = f" (from {report.renamed_from})" if report.renamed_from else ""
            context.log.info(f"{report.change.value}: {report.path}{renamed}, "
                             f"{len(report.units)} unit(s)")
        forward(report)

    with AuthoringSession.open(ws, what="prepare") as session:
        recovered = [*plan.recovered, *session.recovered]
        if session.rolled_forward:
            result = recovered_result(recovered)
            return dg.Output(result, metadata={"status": result.status})
        current = plan_prepare(session, upgrade=plan.upgrade)
        if current.fingerprint() != plan.fingerprint:
            raise EvidenceError("the sources or the manifest changed while prepare ran; "
                                "nothing was written, run prepare again",
                                path=str(ws.root), code="workspace_changed")
        # the model steps have all run: every source's problem is reported
        result = apply_plan(current, lambda change: by_path[change.path], progress=progress,
                            stop_at_model_failure=False)
    if unchanged:
        context.log.info(f"unchanged: {len(unchanged)} source(s), "
                         f"{sum(len(r.units) for r in unchanged)} unit(s)")
    result = result.model_copy(update={"recovered": recovered})
    for report in result.sources:
        if report.change in (Change.changed, Change.new) and is_source_key(report.path):
            context.log_event(dg.AssetMaterialization(
                "validated_units", partition=report.path,
                metadata={"units": dg.MetadataValue.int(len(report.units)),
                          "unit_ids": ", ".join(report.units)},
                tags=version_tags(_report_version(report), {
                    "restructured_units": _proposal_version(by_path[report.path])})))
    manifest = ws.evidence_dir / MANIFEST_NAME
    version = _digest(manifest.read_text(encoding="utf-8")) if manifest.is_file() else "none"
    return dg.Output(result, data_version=dg.DataVersion(version), metadata={
        "status": result.status,
        "model_calls": dg.MetadataValue.int(result.model_calls),
        "files_written": dg.MetadataValue.int(len(result.written)),
        "files_deleted": dg.MetadataValue.int(len(result.deleted)),
        "review_items": dg.MetadataValue.int(result.review_items),
        "orphans": ", ".join(result.orphans) or "none",
        "retirement_candidates": ", ".join(result.retirement_candidates) or "none",
        "diff": dg.MetadataValue.md(f"```diff\n{result.diff[:20000]}\n```" if result.diff
                                    else "no change"),
    })


@dg.graph_asset(group_name=GROUP, ins={"validated_units": dg.AssetIn(dagster_type=dg.Nothing)},
                kinds={"git"}, **CATALOG)
def applied_batch(validated_units: Any) -> Any:
    """Every changed source restructured, then curated files and manifest applied all or
    nothing (tht evidence prepare)."""
    steps, plan = plan_sources(after=validated_units)
    return apply_sources(plan, steps.map(restructure_source).collect())


# --- the work tree after the batch ---------------------------------------------------------------


def corpus_version(report: ValidationReport, loaded: list[LoadedUnit]) -> str:
    """The data version of a validated corpus: every curated file's content and the verdict."""
    return digest({"status": report.status.value,
                   "problems": [p.line() for p in report.problems],
                   "files": [[item.rel_path, item.doc.data() if item.doc else None,
                              item.doc.body if item.doc else None] for item in loaded]})


@dg.asset(group_name=GROUP, deps=[applied_batch], kinds={"markdown"}, pool=POOL, **CATALOG)
def curated_corpus(workspace: WorkspaceResource) -> dg.Output[ValidationReport]:
    """The curated units of the work tree validated (tht evidence validate)."""
    ws = workspace.load()
    report, loaded = validate_corpus(ws)
    return dg.Output(report, data_version=dg.DataVersion(corpus_version(report, loaded)),
                     metadata=corpus_metadata(report, loaded))


def validation_result(report: ValidationReport, *, review_blocks: bool) -> dg.AssetCheckResult:
    """Passed only when publishable; review items are an error when they block publication."""
    errors = [p for p in report.problems if p.severity is Severity.error]
    severity = dg.AssetCheckSeverity.ERROR if errors or review_blocks \
        else dg.AssetCheckSeverity.WARN
    metadata: dict[str, Any] = {"status": report.status.value,
                                "units": dg.MetadataValue.int(report.units),
                                "errors": dg.MetadataValue.int(len(errors)),
                                "review_items": dg.MetadataValue.int(
                                    len(report.problems) - len(errors))}
    if report.problems:
        metadata["problems"] = dg.MetadataValue.md(problems_table(report.problems))
    return dg.AssetCheckResult(passed=report.status.value == "publishable", severity=severity,
                               metadata=metadata)


@dg.asset_check(asset=curated_corpus)
def curated_corpus_publishable(curated_corpus: ValidationReport) -> dg.AssetCheckResult:
    """The work tree is publishable: no errors, no review items, no orphans."""
    return validation_result(curated_corpus, review_blocks=False)
