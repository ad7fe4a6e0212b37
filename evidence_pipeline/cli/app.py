"""The ``tht`` command line: curators and operators run the same functions as the assets.

The groups and the authoring, publishing and search commands; the formula imports live in
``cli.formulas``, what all commands share in ``cli.common``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.markup import escape
from rich.table import Table

from evidence_pipeline.authoring.backends.base import BACKEND_NAMES
from evidence_pipeline.cli.check import check_cmd
from evidence_pipeline.cli.common import (
    EXIT_ERROR,
    EXIT_PROBLEMS,
    embedding_bar,
    emit_json,
    error_document,
    fail,
    json_option,
    print_problems,
    refuse,
    stderr,
    stdout,
    user_errors,
    workspace_root,
)
from evidence_pipeline.cli.excerpts import excerpt_lines
from evidence_pipeline.cli.formulas import import_formulas_cmd, import_proposals_cmd
from evidence_pipeline.cli.publish import generations_cmd, publish_cmd
from evidence_pipeline.cli.review import review_cmd
from evidence_pipeline.cli.shared_records import (
    print_comparison,
    shared_records_after,
    shared_records_cmd,
)
from evidence_pipeline.cli.suggest import suggest_cmd
from evidence_runtime.errors import EvidenceError
from evidence_runtime.units import EvidenceKind, EvidencePurpose

if TYPE_CHECKING:
    from evidence_pipeline.publishing.evaluate import EvaluationReport

F = TypeVar("F", bound=Callable[..., Any])
ID_PREFIX = "evidence:"  # every evidence id's; the evaluation table leaves it out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="thoth-evidence")
def main() -> None:
    """thoth-evidence: curate, publish and search the domain Evidence of a workspace."""


@main.group()
def evidence() -> None:
    """Authoring and search: prepare, validate, resolve, evaluate, search."""


@main.group()
def workspace() -> None:
    """Operating a workspace: activate a revision, publish (preprocess) Evidence."""


# ---------------------------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------------------------


@evidence.command()
@workspace_root
@json_option
@user_errors
def validate(workspace_root: Path, as_json: bool) -> None:
    """Check every curated unit, its sources and the manifest (writes nothing).

    Exit 0 only when the corpus is publishable.
    """
    from evidence_pipeline.validation.problems import Severity, Status, sort_problems
    from evidence_pipeline.validation.validator import validate_workspace


    report = validate_workspace(workspace_root)
    if as_json:
        emit_json(report.model_dump(mode="json"))
    else:
        problems = sort_problems(report.problems)
        print_problems(problems)
        colour = {"publishable": "green", "blocked": "yellow", "invalid": "red"}[
            report.status.value]
        errors = sum(p.severity is Severity.error for p in problems)
        reviews = len(problems) - errors
        stdout.print(f"[{colour}]{report.status.value}[/]: {report.units} units, "
                     f"{errors} errors, {reviews} review items")
    if report.status is not Status.publishable:
        sys.exit(EXIT_PROBLEMS)


# ---------------------------------------------------------------------------------------------
# prepare / resolve
# ---------------------------------------------------------------------------------------------




def print_diff(diff: str) -> None:
    """A unified diff, coloured for people."""
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            stdout.print(f"[bold]{escape(line)}[/]")
        elif line.startswith("@@"):
            stdout.print(f"[cyan]{escape(line)}[/]")
        elif line.startswith("+"):
            stdout.print(f"[green]{escape(line)}[/]")
        elif line.startswith("-"):
            stdout.print(f"[red]{escape(line)}[/]")
        else:
            stdout.print(escape(line))


@evidence.command()
@workspace_root
@click.option("--upgrade", is_flag=True,
              help="Reprocess every source (new pipeline version); needs a clean repository.")
@click.option("--backend", type=click.Choice(BACKEND_NAMES),
              help="Model backend (default: thoth.yaml model.backend).")
@click.option("--no-diff", is_flag=True, help="Do not print the diff of the proposed change.")
@json_option
@user_errors
def prepare(workspace_root: Path, upgrade: bool, backend: str | None, no_diff: bool,
            as_json: bool) -> None:
    """Restructure changed sources into curated units (one model call per changed source).

    All or nothing: any problem leaves the work tree unchanged. Makes no commit.
    """
    from evidence_pipeline.authoring.planner import SourceReport
    from evidence_pipeline.authoring.prepare import PrepareError
    from evidence_pipeline.authoring.prepare import prepare as run_prepare

    out = stderr if as_json else stdout
    colours = {"unchanged": "dim", "changed": "yellow", "new": "green", "removed": "red",
               "renamed": "cyan", "restored": "cyan"}

    def progress(report: SourceReport) -> None:
        if report.change.value == "unchanged":
            return  # counted in the summary line (each one is in --json's sources)
        timing = f"  model {report.model_seconds:.2f}s" if report.model_seconds is not None \
            else ""
        c = colours[report.change.value]
        renamed = f" (from {report.renamed_from})" if report.renamed_from else ""
        kept = "".join(f"\n          [dim]{escape(eid)} kept by code: same {by}[/]"
                       for eid, by in report.ids_kept_by_code.items())
        info = "".join(f"\n          [dim]info: {escape(note)}[/]" for note in report.notes)
        out.print(f"[{c}]{report.change.value:9}[/] {escape(report.path)}{renamed}  "
                  f"{len(report.units)} unit(s){timing}{kept}{info}")

    try:
        # --- Dagster: with DAGSTER_HOME set, the same stages run as the job `prepare` -------
        from evidence_pipeline.orchestration import runs

        if runs.enabled():
            run_prepare = runs.run_prepare  # same contract, recorded in Dagster
        # --- end Dagster ----------------------------------------------------------------------
        with embedding_bar() as bar:  # a bar per phase: here the model calls
            result = run_prepare(workspace_root, backend=backend, upgrade=upgrade,
                                 progress=progress, model_progress=bar)
    except PrepareError as exc:
        refuse(str(exc), exc.problems, {"status": "failed", "model_calls": exc.model_calls,
                                        "not_attempted": exc.not_attempted}, as_json=as_json)
        return
    if as_json:
        emit_json(result.model_dump(mode="json"))
        return
    for line in result.recovered:
        stdout.print(f"[yellow]recovered[/]: {line}")
    counts: dict[str, int] = {}
    for r in result.sources:
        counts[r.change.value] = counts.get(r.change.value, 0) + 1
    stdout.print(
        f"[bold]prepare[/]: {len(result.sources)} sources — "
        + ", ".join(f"{counts.get(k, 0)} {k}" for k in
                    ("unchanged", "changed", "new", "renamed", "restored", "removed"))
        + f"; {result.model_calls} model call(s); {len(result.written)} file(s) written, "
          f"{len(result.deleted)} deleted; {result.review_items} review item(s)")
    for notice in result.notices:
        stdout.print(f"[dim]info: {escape(notice.path)}: {notice.message}[/]")
    if result.status == "unchanged":
        stdout.print("nothing to do: every source is unchanged")
    elif not no_diff:
        print_diff(result.diff)
    if result.orphans or result.retirement_candidates:
        stdout.print(f"[yellow]blocked until resolved[/]: orphans {result.orphans}, "
                     f"retirement candidates {result.retirement_candidates}")


@evidence.command()
@click.argument("evidence_id")
@click.option("--retire", is_flag=True, help="Remove the unit from the authoring corpus.")
@click.option("--source", "source", metavar="SOURCE-PATH",
              help="Relink the unit to an existing source (path under evidence/source/).")
@click.option("--workspace", "workspace_root", type=click.Path(file_okay=False, path_type=Path),
              default=Path("."), show_default=True, help="Workspace root.")
@json_option
@user_errors
def resolve(evidence_id: str, retire: bool, source: str | None, workspace_root: Path,
            as_json: bool) -> None:
    """Resolve an orphan or retirement candidate: --retire or --source (exactly one)."""
    from evidence_pipeline.authoring.resolve import resolve as run_resolve

    if retire and source:
        raise click.UsageError("--retire and --source are mutually exclusive")
    if not retire and not source:
        raise click.UsageError("give one of --retire or --source")
    result = run_resolve(workspace_root, evidence_id, retire=retire, source=source)
    if as_json:
        emit_json(result.model_dump(mode="json"))
    else:
        stdout.print(f"{result.action} {result.evidence_id}: wrote {', '.join(result.written)}"
                     + (f"; deleted {', '.join(result.deleted)}" if result.deleted else "")
                     + " (no commit made; review with git diff)")


@evidence.command()
@workspace_root
@click.option("--finish", is_flag=True, help="Apply the interrupted batch, also over files "
              "edited since it was staged (each is first copied to .tht/conflicts/<batch>/).")
@click.option("--drop", is_flag=True, help="Discard the interrupted batch; files it had "
              "already replaced are put back unless edited since; edits are kept.")
@json_option
@user_errors
def recover(workspace_root: Path, finish: bool, drop: bool, as_json: bool) -> None:
    """Show, finish or drop a batch that an interrupted prepare, resolve or import left staged.

    Needed only when a file of that batch was edited since (the other commands then refuse and
    keep both). Without --finish or --drop it only shows what is pending.
    """
    from evidence_pipeline.authoring.recovery import recover_workspace

    if finish and drop:
        raise click.UsageError("--finish and --drop are mutually exclusive")
    result = recover_workspace(workspace_root, finish=finish, drop=drop)
    if as_json:
        emit_json(result.model_dump(mode="json"))
        return
    if not result.batches:
        stdout.print("nothing to recover: no interrupted batch is staged")
    for b in result.batches:
        edited = f"; edited since: {', '.join(b.conflicts)}" if b.conflicts else ""
        stdout.print(f"{escape(b.name)}: {b.state}, {b.done}/{b.files} file(s) done"
                     f"{escape(edited)}")
    for path in result.set_aside:
        stdout.print(f"[yellow]edit set aside[/]: {escape(path)}")
    for path in result.restored:
        stdout.print(f"restored: {escape(path)}")
    for path in result.kept:
        stdout.print(f"[yellow]kept as edited[/]: {escape(path)}")
    if result.action != "inspected" and result.batches:
        stdout.print(f"{result.action}; review with git diff (no commit made)")


# ---------------------------------------------------------------------------------------------
# publishing
# ---------------------------------------------------------------------------------------------


@workspace.command()
@workspace_root
@click.option("--revision", help="Git revision to activate (default: HEAD of a clean tree).")
@json_option
@user_errors
def activate(workspace_root: Path, revision: str | None, as_json: bool) -> None:
    """Activate a reviewed Git revision of the workspace in the registry.

    If a retained generation of that revision exists it becomes active again (rollback);
    otherwise Evidence is unavailable until `preprocess evidence` publishes the revision.
    """
    from evidence_pipeline.publishing.publish import activate as run_activate

    result = run_activate(workspace_root, revision=revision)
    if as_json:
        emit_json({"revision": result.revision,
                   "reactivated_generation": result.reactivated_generation})
        return
    stdout.print(f"activated revision {result.revision}")
    if result.reactivated_generation is not None:
        stdout.print(f"generation {result.reactivated_generation} of this revision is active "
                     "again (no re-indexing)")
    else:
        stdout.print("Evidence is unavailable until `tht workspace preprocess evidence` "
                     "publishes this revision")


@workspace.group()
def preprocess() -> None:
    """Build derived indexes of the activated revision."""


@preprocess.command("evidence")
@workspace_root
@json_option
@user_errors
def preprocess_evidence(workspace_root: Path, as_json: bool) -> None:
    """Publish the activated revision as a new generation: validate, fragment, embed, upload,
    verify, evaluate; activate only if the gate passes."""
    from evidence_pipeline.publishing.publish import GateFailed, PublishError, preprocess

    out = stderr if as_json else stdout
    try:
        # --- Dagster: with DAGSTER_HOME set, the same stages run as the job `publish` -------
        from evidence_pipeline.orchestration import runs

        if runs.enabled():
            preprocess = runs.run_preprocess  # same contract, recorded in Dagster
        # --- end Dagster ----------------------------------------------------------------------
        with embedding_bar() as bar:
            result = preprocess(workspace_root, progress=lambda m: out.print(f"• {escape(m)}"),
                                embedding=bar)
    except GateFailed as exc:  # the misses say why, without a second command
        shared = shared_records_after(workspace_root)  # spec §16, while a snapshot is saved
        if as_json:
            emit_json({"generation": exc.report.generation, "activated": False,
                       "evaluation": exc.report.summary_with_misses(), "problems": [],
                       **({"shared_records": shared} if shared else {})})
        else:
            print_evaluation(exc.report)
            if shared:
                print_comparison(shared)
        fail(str(exc), EXIT_PROBLEMS)
        return
    except PublishError as exc:
        if exc.problems:  # the revision is not publishable: its problems, exit 1
            refuse(str(exc), exc.problems, {"generation": None, "activated": False,
                                            "evaluation": None}, as_json=as_json)
            return
        _could_not_run(exc, as_json=as_json)
    except EvidenceError as exc:
        _could_not_run(exc, as_json=as_json)
    shared = shared_records_after(workspace_root)  # spec §16, while a snapshot is saved
    if as_json:
        emit_json({**result.to_json(), **({"shared_records": shared} if shared else {})})
        return
    assert result.evaluation is not None  # activated: its gate passed
    ev = result.evaluation.summary
    stdout.print(f"[green]generation {result.generation} active[/] for revision "
                 f"{result.revision[:12]}: {result.counts['units']} units, "
                 f"{result.counts['fragments']} fragments "
                 f"({result.counts['fragments_embedded']} embedded); gate passed, "
                 f"hit@5 {ev.hit_at_5}/{ev.queries}, hit@10 {ev.hit_at_10}/{ev.queries}")
    if shared:
        print_comparison(shared)


def _could_not_run(exc: EvidenceError, *, as_json: bool) -> None:
    """``preprocess`` could not run (busy, index locked, nothing activated, a fault): exit 2,
    and with ``--json`` the error document with the preprocess fields and the ``code``."""
    if as_json:
        doc = error_document(exc.code, exc.message, path=exc.path,
                             evidence_id=exc.evidence_id, field=exc.field)
        emit_json({"status": doc["status"], "generation": None, "activated": False,
                   "evaluation": None, "problems": doc["problems"], "code": exc.code})
    fail(str(exc), EXIT_ERROR)


def print_evaluation(report: EvaluationReport, *, saving_baseline: bool = False) -> None:
    """The evaluation table, readable at 80 columns: per query its hits and, for each expected
    unit, its rank in the dense, BM25 and fused lists (``d/b/f``); then why each expected unit
    outside the fused top 10 is there. ``saving_baseline``: the caller saves this report as
    the baseline (so a missing one is not reported)."""
    table = Table(title=f"evaluation — generation {report.generation}, revision "
                        f"{report.revision[:12]}", header_style="bold", box=None,
                  pad_edge=False)
    for col in ("query", "purpose", "@5", "@10"):
        table.add_column(col, no_wrap=True)
    table.add_column(f"expected {ID_PREFIX}…", overflow="fold")
    table.add_column("rank d/b/f", no_wrap=True)  # dense / BM25 / fused

    def r(v: int | None) -> str:
        return "–" if v is None else str(v)

    for q in report.queries:
        for i, (eid, ranks) in enumerate(q.ranks.items()):
            first = i == 0
            missed = f"[yellow]{escape(eid.removeprefix(ID_PREFIX))}[/]" if eid in q.misses \
                else escape(eid.removeprefix(ID_PREFIX))
            table.add_row(q.id if first else "", q.purpose.value if first else "",
                          ("✓" if q.hit_at_5 else "✗") if first else "",
                          ("[green]✓[/]" if q.hit_at_10 else "[red]✗[/]") if first else "",
                          missed, f"{r(ranks.dense)}/{r(ranks.bm25)}/{r(ranks.fused)}")
    stdout.print(table)
    for qid, eid, miss in report.misses():
        stdout.print(f"[yellow]missed[/] {qid} {escape(eid)}: {miss.reason} "
                     f"({escape(miss.describe())})")
    s = report.summary
    verdict = "[green]gate passed[/]" if s.gate_passed else "[red]gate failed[/]"
    stdout.print(f"{verdict}: hit@5 {s.hit_at_5}/{s.queries}, hit@10 "
                 f"{s.hit_at_10}/{s.queries}; missed kinds: "
                 f"{', '.join(s.missed_kinds) or 'none'}; queries without results: "
                 f"{', '.join(s.empty_queries) or 'none'}")
    if report.regressions is None:
        if not saving_baseline:
            stdout.print("no baseline saved (tht evidence evaluate --save-baseline)")
    elif report.regressions:
        stdout.print(f"[red]regressions against the baseline[/]: "
                     f"{', '.join(report.regressions)}")
    else:
        stdout.print("regressions against the baseline: none")


@evidence.command()
@workspace_root
@click.option("--generation", type=int, help="Evaluate this generation (default: the active one).")
@click.option("--save-baseline", is_flag=True, help="Save this report as the baseline.")
@json_option
@user_errors
def evaluate(workspace_root: Path, generation: int | None, save_baseline: bool,
             as_json: bool) -> None:
    """Run the evaluation.yaml of the evaluated generation's revision against that generation
    (default: the active one); never changes the index.

    Exit 0 when the gate passes (every query has an expected unit in the fused top 10).
    """
    from evidence_pipeline.publishing.evaluate import (
        baseline_path,
        evaluate_generation,
        evaluation_index,
    )
    from evidence_pipeline.publishing.evaluate import save_baseline as write_baseline
    from evidence_pipeline.state import require_writable_state_dir
    from evidence_runtime.search import EvidenceSearcher, index_config
    from evidence_runtime.workspace import load_workspace

    ws = load_workspace(workspace_root)
    require_writable_state_dir(ws.state_dir)  # the shard copy and the report go there
    # on the embedded engine a copy of the shard: searches elsewhere wait only for the copy
    with evaluation_index(ws, index_config(ws)) as where, \
            EvidenceSearcher.for_workspace(ws, index_target=where) as searcher:
        report = evaluate_generation(ws, searcher, generation=generation)
    if save_baseline:
        write_baseline(report, baseline_path(ws.state_dir))
    if as_json:
        emit_json(report.model_dump(mode="json"))
    else:
        print_evaluation(report, saving_baseline=save_baseline)
        if save_baseline:
            replaced = " (replacing the previous one)" if report.regressions is not None else ""
            stdout.print(f"baseline saved{replaced}: {baseline_path(ws.state_dir)}")
    if not report.gate_passed:
        sys.exit(EXIT_PROBLEMS)


def _per_element(flag: str, dest: str, help_text: str) -> Callable[[F], F]:
    """One repeatable option per element of ``applies_to`` (table, column, concept); ``{0}`` in
    the flag, destination and help stands for the element, ``{1}`` for it capitalized."""
    def decorate(func: F) -> F:
        for element in ("concept", "column", "table"):  # applied bottom up: shown table first
            func = click.option(flag.format(element), dest.format(element), multiple=True,
                                help=help_text.format(element, element.capitalize()))(func)
        return func
    return decorate


@evidence.command()
@workspace_root
@click.argument("question")
@click.option("--purpose", required=True,
              type=click.Choice([p.value for p in EvidencePurpose]),
              help="The workflow stage asking (see the purposes above); only units "
                   "published for this purpose are searched.")
@_per_element("--{0}", "{0}s", "{1} known to the stage: added to the query text, filters nothing.")
@click.option("--kind", "kinds", multiple=True,
              type=click.Choice([k.value for k in EvidenceKind]),
              help="Binding constraint: only units of these kinds.")
@_per_element("--require-{0}", "required_{0}s",
              "Binding constraint: only units whose applies_to names one of these {0}s.")
@click.option("--limit", type=click.IntRange(1, 50), default=10, show_default=True)
@json_option
@user_errors
def search(workspace_root: Path, question: str, purpose: str, tables: tuple[str, ...],
           columns: tuple[str, ...], concepts: tuple[str, ...], kinds: tuple[str, ...],
           required_tables: tuple[str, ...], required_columns: tuple[str, ...],
           required_concepts: tuple[str, ...], limit: int, as_json: bool) -> None:
    """Search the active generation as a workflow stage would (read-only).

    \b
    Purposes (spec §11.2: the stage that asks, and what it needs):
      disambiguation  clarification (F1): what a term, a code or a value means
      rewriting       rewriting (F3): the question restated in the warehouse's terms
      schema_linking  schema linking (F4): which tables and columns hold it
      sql_generation  cte and final_sql (F6, F7): formulas, filters, joins to compute it

    --table/--column/--concept are context hints rendered into the query text (spec §9.6);
    --kind and --require-* are binding constraints (spec §10), applied as filters.
    Exit 0 when available (even with no results), 1 when Evidence is unavailable.
    """
    from evidence_runtime.query import (
        EvidenceConstraints,
        EvidenceSearchContext,
        InvalidQueryError,
        render_query,
    )
    from evidence_runtime.search import EvidenceSearcher, UnavailableCode, unavailable

    context = EvidenceSearchContext(tables=tables, columns=columns, concepts=concepts,
                                    constraints=EvidenceConstraints(
                                        kinds=kinds, tables=required_tables,
                                        columns=required_columns,
                                        concepts=required_concepts))
    try:
        opened = EvidenceSearcher.for_workspace(workspace_root)
    except EvidenceError as exc:  # DESIGN: a fault is an unavailable outcome, as search() says
        opened = unavailable(UnavailableCode.not_configured, str(exc), purpose=purpose)
    try:
        if isinstance(opened, EvidenceSearcher):
            with opened as searcher:
                outcome = searcher.search(question, purpose, context, limit=limit)
        else:
            render_query(question, context)  # a bad question is the caller's, here too
            outcome = opened
    except InvalidQueryError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        emit_json(outcome.model_dump(mode="json"))
    elif not outcome.available:
        stderr.print(f"[red]unavailable[/] ({outcome.code}): {escape(outcome.message or '')}")
    else:
        stdout.print(f"generation {outcome.generation} (revision {outcome.revision[:12]}), "
                     f"purpose {purpose}: {len(outcome.results)} result(s)")
        for i, r in enumerate(outcome.results, 1):
            stdout.print(f"\n[bold]{i}. {escape(r.title)}[/]  [dim]{r.evidence_id} · {r.kind} · "
                         f"score {r.score:.4f}[/]")
            for line in excerpt_lines(r.excerpts[0] if r.excerpts else "", question):
                stdout.print(f"   {escape(line)}")
            stdout.print(f"   [cyan]cita:[/] {escape(r.citation)}")
    if not outcome.available:
        sys.exit(EXIT_PROBLEMS)


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------


@main.group()
def demo() -> None:
    """The demo workspace (Italian clinical data-warehouse notes)."""


@demo.command("init")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace DEST if it exists.")
@user_errors
def demo_init(dest: Path, force: bool) -> None:
    """Create the demo workspace as a new Git repository in DEST."""
    from evidence_pipeline.demo import create_demo_repo

    path = create_demo_repo(dest, force=force)
    click.echo(f"demo workspace ready: {path}")


evidence.add_command(import_formulas_cmd)
evidence.add_command(import_proposals_cmd)
evidence.add_command(review_cmd)
evidence.add_command(suggest_cmd)
workspace.add_command(shared_records_cmd)
workspace.add_command(publish_cmd)
workspace.add_command(generations_cmd)
workspace.add_command(check_cmd)


if __name__ == "__main__":  # pragma: no cover
    main()
