"""``tht workspace publish`` and ``tht workspace generations``: publishing without a maintenance
window, and the generations and revisions a rollback can reach.

``publish`` builds and evaluates the candidate of a revision while the current generation keeps
serving, then moves the activated revision and the active generation together in one registry
transaction; a failed gate or load changes nothing and says which generation still serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from evidence_pipeline.cli.common import (
    EXIT_ERROR,
    EXIT_PROBLEMS,
    embedding_bar,
    emit_json,
    error_document,
    fail,
    json_option,
    print_problems,
    stderr,
    stdout,
    user_errors,
    workspace_root,
)
from evidence_pipeline.cli.shared_records import print_comparison, shared_records_after
from evidence_runtime.errors import EvidenceError

if TYPE_CHECKING:
    from evidence_pipeline.publishing.activation import GenerationsReport


def serving(root: Path) -> dict[str, Any] | None:
    """The pair search serves now (``revision``, ``generation``), read from the registry after
    a publish; None when the registry cannot be read."""
    from evidence_pipeline.publishing.activation import list_generations

    try:
        report = list_generations(root)
    except EvidenceError:
        return None
    return {"revision": report.activated_revision, "generation": report.active_generation}


def _unchanged(state: dict[str, Any] | None) -> str:
    if state is None:
        return "nothing was switched"
    if state["generation"] is None:
        return "nothing was switched: no generation was serving, and none serves"
    return (f"nothing was switched: generation {state['generation']} still serves revision "
            f"{(state['revision'] or 'none')[:12]}")


@click.command("publish")
@workspace_root
@click.option("--revision", help="Git revision to publish (default: HEAD of a clean tree).")
@json_option
@user_errors
def publish_cmd(workspace_root: Path, revision: str | None, as_json: bool) -> None:
    """Publish a revision with no maintenance window: build, verify and evaluate its
    generation while the current one keeps serving, then switch the activated revision and
    the active generation together in one registry transaction.

    A failed gate (exit 1) or a failed load (exit 2) changes nothing: the previous revision
    is still served. `activate` + `preprocess evidence` keep working as before.
    """
    from evidence_pipeline.cli.app import print_evaluation
    from evidence_pipeline.publishing.publish import GateFailed, PublishError, publish_revision

    out = stderr if as_json else stdout
    run = publish_revision
    try:
        # --- Dagster: with DAGSTER_HOME set, the same function runs as the job publish_revision
        from evidence_pipeline.orchestration import runs

        if runs.enabled():
            run = runs.run_publish  # same contract, recorded in Dagster
        # --- end Dagster ----------------------------------------------------------------------
        with embedding_bar() as bar:
            result = run(workspace_root, revision=revision,
                         progress=lambda m: out.print(f"• {escape(m)}"), embedding=bar)
    except GateFailed as exc:
        state = serving(workspace_root)
        if as_json:
            emit_json({"published": False, "code": exc.code, "generation": exc.report.generation,
                       "revision": exc.report.revision, "activated": False,
                       "evaluation": exc.report.summary_with_misses(), "serving": state,
                       "problems": []})
        else:
            print_evaluation(exc.report)
        fail(f"{exc}; {_unchanged(state)}", EXIT_PROBLEMS)
        return
    except EvidenceError as exc:
        state = serving(workspace_root)
        problems = exc.problems if isinstance(exc, PublishError) else []
        code = EXIT_PROBLEMS if problems else EXIT_ERROR
        if as_json:
            doc = error_document(exc.code, exc.message, path=exc.path,
                                 evidence_id=exc.evidence_id, field=exc.field)
            emit_json({"published": False, "code": exc.code, "generation": None,
                       "activated": False, "evaluation": None, "serving": state,
                       "problems": ([p.model_dump(mode="json") for p in problems]
                                    or doc["problems"])})
        elif problems:
            print_problems(problems)
        fail(f"{exc}; {_unchanged(state)}", code)
        return
    shared = shared_records_after(workspace_root)  # spec §16, while a snapshot is saved
    if as_json:
        emit_json({"published": True, **result.to_json(), "serving": serving(workspace_root),
                   **({"shared_records": shared} if shared else {})})
        return
    assert result.evaluation is not None  # switched: its gate passed
    ev = result.evaluation.summary
    stdout.print(f"[green]generation {result.generation} serves revision "
                 f"{result.revision[:12]}[/] (revision and generation switched together): "
                 f"{result.counts['units']} units, {result.counts['fragments']} fragments "
                 f"({result.counts['fragments_embedded']} embedded); gate passed, "
                 f"hit@5 {ev.hit_at_5}/{ev.queries}, hit@10 {ev.hit_at_10}/{ev.queries}")
    if shared:
        print_comparison(shared)


@click.command("generations")
@workspace_root
@json_option
@user_errors
def generations_cmd(workspace_root: Path, as_json: bool) -> None:
    """The generations of the workspace, newest first: revision, state, evaluation, and which
    ones `tht workspace activate --revision R` brings back at once (rollback). Reads the
    registry only."""
    from evidence_pipeline.publishing.activation import list_generations

    report = list_generations(workspace_root)
    if as_json:
        emit_json(report.to_json())
        return
    print_generations(report)


STATE_STYLE = {"serving": "green", "active": "yellow", "retained": "cyan", "failed": "red"}


def print_generations(report: GenerationsReport) -> None:
    """The table, then the pointers and the rollback commands."""
    if not report.generations:
        stdout.print(f"workspace {report.workspace_id}: no generation yet (tht workspace "
                     "publish)")
        return
    rows: list[list[str]] = []
    for g in report.generations:
        style = STATE_STYLE.get(g.state)
        state = f"[{style}]{g.state}[/]" if style else g.state
        evaluated = f"{g.hit_at_10}/{g.queries}" if g.evaluated and g.queries else "–"
        gate = "–" if g.gate_passed is None else ("passed" if g.gate_passed else "failed")
        rows.append([str(g.number), g.revision[:12], state + (" ↩" if g.rollback else ""),
                     "●" if g.active else "", evaluated, gate,
                     g.created_at[5:16].replace("T", " "), escape(g.subject or "")])
    table = Table(title=f"generations — workspace {report.workspace_id}", header_style="bold",
                  box=box.SIMPLE_HEAD)
    headers = ("gen", "revision", "state", "active", "evaluated", "gate", "created")
    widths = [max(len(col), *(Text.from_markup(r[i]).cell_len for r in rows))
              for i, col in enumerate(headers)]
    for col, width in zip(headers, widths, strict=True):
        table.add_column(col, no_wrap=True, width=width)
    # the commit's subject gets what the terminal has left, or no column below 8 characters
    left = stdout.width - sum(widths) - 3 * (len(headers) + 1) - 1  # padding, rules, edges
    if left >= 8:
        table.add_column("commit", no_wrap=True, overflow="ellipsis", width=left)
    for row in rows:
        table.add_row(*(row if left >= 8 else row[:-1]))
    stdout.print(table)
    stdout.print("evaluated: expected units in the fused top 10 / queries; created: UTC; "
                 "↩: a rollback target")
    active = report.active_generation
    stdout.print(f"activated revision {(report.activated_revision or 'none')[:12]}, active "
                 f"generation {active if active is not None else 'none'}")
    for g in report.rollback_targets:
        stdout.print(f"↩ rollback to generation {g.number}: tht workspace activate <root> "
                     f"--revision {g.revision[:12]}")
