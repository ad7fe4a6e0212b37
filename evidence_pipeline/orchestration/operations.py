"""What operators and curators do from the Dagster UI: activate a revision, publish one with no
maintenance window, prepare one source.

Every expected refusal (an :class:`EvidenceError`: nothing activated, a dirty tree, an unknown
revision, a busy publisher, a locked index, a refused batch …) leaves a step as a
:class:`Refusal` — a ``dg.Failure`` with a one-line description and the error's code, path and
problems as metadata — instead of a Python traceback (:func:`refusals`). The CLI, which runs the
same jobs in-process, gets the original error back (``Refusal.error``).
"""

import functools
import hashlib
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import dagster as dg
from dagster._core.definitions.data_version import (
    DATA_VERSION_IS_USER_PROVIDED_TAG,
    DATA_VERSION_TAG,
)
from pydantic import Field

from evidence_pipeline.authoring.planner import BatchPlanner, SourceProposal, SourceReport
from evidence_pipeline.authoring.prepare import (
    PreparePlan,
    PrepareResult,
    apply_plan,
    call_model,
    model_request,
    only_source,
    plan_prepare,
    recovered_result,
    take_in,
)
from evidence_pipeline.authoring.session import AuthoringSession
from evidence_pipeline.authoring.sources import Change
from evidence_pipeline.formats.manifest import MANIFEST_NAME
from evidence_pipeline.gitrepo import open_repo, resolve_revision
from evidence_pipeline.orchestration.metadata import (
    commit_links,
    generations_metadata,
    problems_table,
    table,
)
from evidence_pipeline.orchestration.partitions import SOURCE_PARTITIONS, check_source_key
from evidence_pipeline.orchestration.progress import embedding_progress, forward, tell
from evidence_pipeline.orchestration.resources import (
    EmbedderResource,
    IndexResource,
    ModelBackendResource,
    WorkspaceResource,
)
from evidence_pipeline.publishing.activation import list_generations
from evidence_pipeline.publishing.guard import PublishError, open_registry
from evidence_pipeline.publishing.publish import (
    ActivationResult,
    PublishResult,
    activate,
    publish_revision,
)
from evidence_runtime.errors import EvidenceError
from evidence_runtime.workspace import Workspace

F = TypeVar("F", bound=Callable[..., Any])


class Refusal(dg.Failure):
    """An expected refusal as Dagster shows it: one line, the code and where, no traceback."""

    def __init__(self, error: EvidenceError) -> None:
        metadata: dict[str, Any] = {"code": error.code}
        for name in ("path", "evidence_id", "field"):
            value = getattr(error, name, None)
            if value:
                metadata[name] = str(value)
        problems = getattr(error, "problems", None)
        if problems:
            metadata["problems"] = dg.MetadataValue.md(problems_table(problems))
        super().__init__(description=" ".join(f"{error.code}: {error}".split()),
                         metadata=metadata, allow_retries=False)
        self.error = error


def refusals(fn: F) -> F:
    """Decorate an op or asset body: an :class:`EvidenceError` it raises leaves the step as a
    :class:`Refusal` (goes under ``@dg.asset``/``@dg.op``; generators are kept generators)."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def generator(*args: Any, **kwargs: Any) -> Iterator[Any]:
            try:
                yield from fn(*args, **kwargs)
            except EvidenceError as exc:
                raise Refusal(exc) from None

        return generator  # type: ignore[return-value]

    @functools.wraps(fn)
    def plain(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EvidenceError as exc:
            raise Refusal(exc) from None

    return plain  # type: ignore[return-value]


# --- activate ------------------------------------------------------------------------------------


class ActivateConfig(dg.Config):
    """Options of an activation (tht workspace activate)."""

    # required, so the launchpad scaffolds it empty instead of offering the last revision typed
    revision: str = Field(
        description="The Git revision to activate (a commit, tag or branch); empty: HEAD, "
                    "which needs a clean work tree. An older revision is refused: roll back "
                    "with the rollback job.")


class RollbackRefused(EvidenceError):
    """The activate job was given a revision older than the one activated."""

    code = "rollback_refused"


def _older_than_active(ws: Workspace, sha: str) -> str | None:
    """Why activating ``sha`` would be a rollback, or None: a retained generation of it older
    than the active one, or a commit the activated revision already contains."""
    wid = ws.config.workspace_id
    with open_registry(ws) as registry:
        activated, active = registry.active_state(wid)
        previous = registry.latest_generation_for_revision(wid, sha)
    if active is not None and previous is not None and previous.number < active.number:
        return (f"its generation {previous.number} is older than the active generation "
                f"{active.number}")
    if activated and activated != sha:
        with open_repo(ws.root) as repo:
            if repo.is_ancestor(repo.commit(sha), repo.commit(activated)):
                return f"the activated revision {activated[:12]} already contains it"
    return None


def record_active(context: dg.OpExecutionContext, ws: Workspace,
                  **extra: Any) -> int | None:
    """Record on ``active_generation`` what an operation changed: the generation that serves
    now (its data version, as the publish run records it), its revision and the generations
    one can roll back to. Returns the active generation's number."""
    wid = ws.config.workspace_id
    with open_registry(ws) as registry:
        activated, active = registry.active_state(wid)
    number = active.number if active is not None else None
    metadata: dict[str, Any] = {
        "activated_revision": activated or "none",
        "serving": (f"generation {number}" if active is not None and active.revision == activated
                    else "nothing: search answers revision_mismatch until publish runs"),
        **commit_links(activated),
        **generations_metadata(list_generations(ws)),
        **{k: v for k, v in extra.items() if v is not None}}
    if active is not None:
        metadata["revision"] = active.revision
        context.log_event(dg.AssetMaterialization(
            "active_generation", metadata=metadata,
            tags={DATA_VERSION_TAG: str(active.number), DATA_VERSION_IS_USER_PROVIDED_TAG: "true"}))
    else:
        context.log_event(dg.AssetObservation("active_generation", metadata=metadata))
    return number


@dg.op(out=dg.Out(ActivationResult), pool="index")
@refusals
def activate_revision(context: dg.OpExecutionContext, config: ActivateConfig,
                      workspace: WorkspaceResource) -> dg.Output[ActivationResult]:
    """Record the revision to publish (never an older one); a retained generation of it
    becomes active at once."""
    ws = workspace.load()
    wanted = config.revision.strip() or None
    sha = resolve_revision(ws.root, wanted or "HEAD")
    why = _older_than_active(ws, sha)
    if why is not None:
        raise RollbackRefused(
            f"revision {sha[:12]} would be a rollback ({why}); activate moves forward only. "
            "To go back, run the rollback job with the generation to make active "
            "(active_generation's metadata lists them)", path=str(ws.root), field="revision")
    result = activate(ws, revision=wanted)
    again = result.reactivated_generation
    tell(context, f"revision {result.revision[:12]} activated; " + (
        f"generation {again} is active again (no publishing needed)" if again is not None
        else "activated_revision_sensor publishes it (or run the publish job)"))
    record_active(context, ws, operation="activate")
    return dg.Output(result, metadata={
        "revision": result.revision, **commit_links(result.revision),
        "reactivated_generation": dg.MetadataValue.int(again) if again is not None else "none"})


@dg.job(name="activate",
        description="tht workspace activate: record the revision to publish (config revision; "
                    "empty: HEAD of a clean tree). A retained generation of it is reactivated "
                    "at once; otherwise activated_revision_sensor launches publish. An older "
                    "revision is refused (rollback_refused): use the rollback job.",
        tags={"tht/trigger": "operator"})
def activate_job() -> None:
    activate_revision()


# --- publish: no maintenance window ------------------------------------------------------------


class PublishConfig(dg.Config):
    """Options of a publication (tht workspace publish)."""

    revision: str | None = Field(
        default=None, description="The Git revision to publish (a commit, tag or branch). "
                                  "Default: HEAD, which needs a clean work tree.")


@dg.op(out=dg.Out(PublishResult), pool="index")
@refusals
def publish_and_switch(context: dg.OpExecutionContext, config: PublishConfig,
                       workspace: WorkspaceResource, index: IndexResource,
                       embedder: EmbedderResource) -> Iterator[Any]:
    """Build, verify and evaluate the revision's generation while the current one serves, then
    switch the activated revision and the active generation in one registry transaction. A
    failed gate or load leaves the step failed and both pointers as they were."""
    ws = workspace.load()
    result = publish_revision(ws, revision=config.revision, embedder=embedder.make(ws),
                              index_factory=lambda w, dim: index.open(w, dense_dim=dim),
                              progress=lambda m: tell(context, m),
                              embedding=embedding_progress(context))
    assert result.evaluation is not None  # switched: its gate passed
    s = result.evaluation.summary
    metadata: dict[str, Any] = {
        "generation": dg.MetadataValue.int(result.generation),
        "revision": result.revision,
        "hit@10": f"{s.hit_at_10}/{s.queries}",
        "retired_points_deleted": ", ".join(map(str, result.retired_points_deleted)) or "none"}
    tell(context, f"generation {result.generation} serves revision {result.revision[:12]} "
                  "(revision and generation switched together)")
    # the asset the switch changed, recorded as a publish run of the asset job records it
    record_active(context, ws, operation="publish",
                  generation=dg.MetadataValue.int(result.generation),
                  hit_at_10=metadata["hit@10"])
    yield dg.Output(result, metadata=metadata)


@dg.job(name="publish_revision",
        description="tht workspace publish: build and evaluate the revision's generation (config: "
                    "revision; default HEAD of a clean tree) while the current one serves, then "
                    "switch revision and generation together. A failed gate changes nothing.",
        tags={"tht/trigger": "operator", "dagster/priority": "10"})
def publish_revision_job() -> None:
    publish_and_switch()


class RollbackConfig(dg.Config):
    """Which generation the rollback makes active again."""

    generation: int = Field(description="A retained generation (active_generation's metadata "
                                        "lists the rollback targets).")


@dg.op(out=dg.Out(ActivationResult), pool="index")
@refusals
def rollback_generation(context: dg.OpExecutionContext, config: RollbackConfig,
                        workspace: WorkspaceResource) -> dg.Output[ActivationResult]:
    """Make a retained generation active again (its revision activated; no re-indexing)."""
    ws = workspace.load()
    wid = ws.config.workspace_id
    with open_registry(ws) as registry:
        before = registry.active_generation(wid)
        target = registry.get_generation(wid, config.generation)
        newest = None if target is None else registry.latest_generation_for_revision(
            wid, target.revision)
    if target is None:
        raise PublishError(f"there is no generation {config.generation}",
                           code="generation_missing", path=str(ws.root), field="generation")
    if newest is None or newest.number != target.number:
        hint = f"; roll back to generation {newest.number}" if newest is not None else ""
        raise PublishError(f"generation {target.number} ({target.status.value}) cannot be made "
                           f"active again{hint}", code="generation_not_retained",
                           path=str(ws.root), field="generation")
    result = activate(ws, revision=target.revision)
    tell(context, f"generation {result.reactivated_generation} (revision "
                  f"{result.revision[:12]}) is active again")
    record_active(context, ws, operation="rollback",
                  rolled_back_from=str(before.number) if before is not None else None)
    return dg.Output(result, metadata={
        "revision": result.revision, **commit_links(result.revision),
        "reactivated_generation": dg.MetadataValue.int(config.generation)})


@dg.job(name="rollback",
        description="Make a retained generation active again (config generation): its revision "
                    "is activated and search serves it at once, no re-indexing "
                    "(tht workspace activate --revision of that generation's revision).",
        tags={"tht/trigger": "operator"})
def rollback_job() -> None:
    rollback_generation()


# --- one source: the preview, and a prepare of that source alone ---------------------------------

MAX_DIFF_CHARS = 20_000


def diff_markdown(diff: str) -> dg.MetadataValue:
    """A unified diff as a Markdown code block (cut at :data:`MAX_DIFF_CHARS`)."""
    if not diff:
        return dg.MetadataValue.md("no change")
    cut = diff if len(diff) <= MAX_DIFF_CHARS else diff[:MAX_DIFF_CHARS] + "\n… (cut)\n"
    return dg.MetadataValue.md(f"```diff\n{cut}```")


def preview_source(plan: PreparePlan, proposal: SourceProposal) -> tuple[BatchPlanner, str]:
    """What a prepare of the proposal's source alone would write: the planner (new curated
    files and manifest) and the diff against the curated tree. Nothing is written; a proposal
    prepare would refuse raises :class:`PrepareError` with its problems."""
    planner = take_in(only_source(plan, proposal.path), lambda _change: proposal)
    _, diff = planner.batch()
    return planner, diff


def preview_metadata(planner: BatchPlanner, path: str, diff: str,
                     review_page: Path | None = None) -> dict[str, Any]:
    """The proposed units of ``path`` (id, kind, title), their review items (code and
    message) and the diff against the curated tree, as the UI shows them; with
    ``review_page``, a link to the page ``tht evidence review`` writes for the pending change
    (each unit beside its source note, the questions whose rank it moves)."""
    report = next(r for r in planner.reports if r.path == path)
    docs = {doc.evidence_id: doc for doc in planner.outputs.values() if doc is not None}
    units: list[tuple[Any, ...]] = []
    items: list[tuple[Any, ...]] = []
    for eid in report.units:
        doc = docs.get(eid)
        if doc is None:  # a previous unit this proposal leaves as it is
            units.append((eid, "", "(unchanged)", 0))
            continue
        data = doc.data()
        review = [i for i in data.get("review_items") or [] if isinstance(i, dict)]
        units.append((eid, data.get("kind"), data.get("title"), len(review)))
        items.extend((eid, i.get("code"), i.get("message")) for i in review)
    return {
        "units": dg.MetadataValue.int(len(report.units)),
        "unit_ids": ", ".join(report.units) or "none",
        "review_items": dg.MetadataValue.int(len(items)),
        "proposed_units": dg.MetadataValue.md(
            table(("unit", "kind", "title", "review items"), units)),
        "review_items_text": dg.MetadataValue.md(
            table(("unit", "code", "message"), items) if items else "no review item"),
        "diff": diff_markdown(diff),
        **({"review_page": dg.MetadataValue.url(review_page.as_uri()),
            # a browser may refuse a file: link from the UI's http page: the path to open
            "review_page_path": dg.MetadataValue.path(str(review_page)),
            "review_page_how": dg.MetadataValue.md(
                "written by `tht evidence review <root>` for the pending change of the work "
                "tree (run it after `prepare`; "
                + ("written" if review_page.is_file() else "not written yet") + ")")}
           if review_page is not None else {}),
    }


def prepare_metadata(result: PrepareResult) -> dict[str, Any]:
    """Status, counts, the units and the diff of a prepare run."""
    return {
        "status": result.status,
        "model_calls": dg.MetadataValue.int(result.model_calls),
        "files_written": dg.MetadataValue.int(len(result.written)),
        "files_deleted": dg.MetadataValue.int(len(result.deleted)),
        "review_items": dg.MetadataValue.int(result.review_items),
        "units": ", ".join(u for s in result.sources if s.change is not Change.unchanged
                           for u in s.units) or "none",
        "diff": diff_markdown(result.diff),
    }


@dg.op(out=dg.Out(PrepareResult), pool="authoring")
@refusals
def prepare_one_source(context: dg.OpExecutionContext, workspace: WorkspaceResource,
                   model: ModelBackendResource) -> dg.Output[PrepareResult]:
    """Prepare the run's partition alone: its units written and its manifest entry updated, all
    or nothing; every other source's change is left for a later prepare."""
    key = check_source_key(context.partition_key)
    ws = workspace.load()

    def progress(report: SourceReport) -> None:
        if report.change is not Change.unchanged:
            context.log.info(f"{report.change.value}: {report.path}, "
                             f"{len(report.units)} unit(s)")
        forward(report)

    with AuthoringSession.open(ws, what=f"prepare {key}") as session:
        if session.rolled_forward:
            result = recovered_result(session.recovered)
        else:
            plan = only_source(plan_prepare(session), key)
            backend = model.make(ws)
            result = apply_plan(plan, lambda change: call_model(backend,
                                                                model_request(plan, change)),
                                progress=progress)
    manifest = ws.evidence_dir / MANIFEST_NAME
    if (result.written or result.deleted) and manifest.is_file():
        # the curated files and the manifest changed: recorded on applied_batch with the data
        # version a prepare run gives it (the manifest's sha256), so curated_corpus shows stale
        version = hashlib.sha256(manifest.read_bytes()).hexdigest()
        context.log_event(dg.AssetMaterialization(
            "applied_batch", metadata={**prepare_metadata(result), "source": key},
            tags={DATA_VERSION_TAG: version, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"}))
    return dg.Output(result, metadata=prepare_metadata(result))


@dg.job(name="prepare_source", partitions_def=SOURCE_PARTITIONS,
        description="tht evidence prepare for one source (the partition chosen): its one model "
                    "call, then its curated units and manifest entry written all or nothing; "
                    "the other sources' changes stay for a later prepare.",
        tags={"tht/trigger": "curator"})
def prepare_source_job() -> None:
    prepare_one_source()
