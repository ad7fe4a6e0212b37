"""``tht evidence import-formulas`` and ``import-proposals``: the two formula maintenance imports.

Both write curated formula units, their sources and the manifest all or nothing, and make no
commit; review the change with ``git diff`` and ``tht evidence validate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.table import Table

from evidence_pipeline.cli.common import (
    EXIT_PROBLEMS,
    emit_json,
    fail,
    json_option,
    stdout,
    user_errors,
    workspace_root,
)

if TYPE_CHECKING:  # the importers load Git, the validator and sqlglot: only when a command runs
    from evidence_pipeline.authoring.formulas import FormulaImportError, ImportResult


def _report(result: ImportResult, *, as_json: bool, what: str) -> None:
    if as_json:
        emit_json(result.model_dump(mode="json"))
        return
    for line in result.recovered:
        stdout.print(f"[yellow]recovered[/]: {escape(line)}")
    if result.status == "recovered":
        stdout.print("an interrupted import was completed; review it, then run the import again")
        return
    table = Table(title=what, show_header=True, header_style="bold")
    for col in ("file", "unit", "status"):
        table.add_column(col, overflow="fold")
    for entry in result.entries:
        codes = escape(", ".join(entry.review_codes))
        if entry.status != "imported":
            status = f"[dim]{entry.status}[/]" + (f" ({codes})" if codes else "")
        elif codes:
            status = f"[yellow]{codes}[/]"
        else:
            status = "[green]ok[/]"
        table.add_row(escape(entry.origin), escape(entry.evidence_id or ""), status)
    stdout.print(table)
    imported = sum(e.status == "imported" for e in result.entries)
    if result.status == "unchanged":
        stdout.print("nothing to do: every entry is already imported")
    else:
        stdout.print(f"{imported} unit(s) imported, {len(result.written)} file(s) written "
                     "(no commit made; review with git diff and tht evidence validate)")


def _refused(exc: FormulaImportError, *, as_json: bool) -> None:
    if as_json:
        emit_json({"status": "failed", "entries": [],
                   "problems": [p.model_dump(mode="json") for p in exc.problems]})
    fail(str(exc), EXIT_PROBLEMS)


@click.command("import-formulas")
@workspace_root
@click.argument("legacy_dir", type=click.Path(file_okay=False, path_type=Path))
@json_option
@user_errors
def import_formulas_cmd(workspace_root: Path, legacy_dir: Path, as_json: bool) -> None:
    """Migrate a legacy formula store (LEGACY_DIR/formulas/*.sql.md) into formula units.

    Each file is copied under evidence/source/ and cited by its unit; an entry that is not one
    composable expression is kept with a review item. All or nothing; makes no commit.
    """
    from evidence_pipeline.authoring.formulas import FormulaImportError, import_formulas

    try:
        result = import_formulas(workspace_root, legacy_dir)
    except FormulaImportError as exc:
        _refused(exc, as_json=as_json)
        return
    _report(result, as_json=as_json, what="import-formulas")


@click.command("import-proposals")
@workspace_root
@click.argument("artifacts", nargs=-1, required=True,
                type=click.Path(dir_okay=False, path_type=Path))
@json_option
@user_errors
def import_proposals_cmd(workspace_root: Path, artifacts: tuple[Path, ...],
                         as_json: bool) -> None:
    """Import formula proposals from workflow-session artifacts (JSON) for review.

    Each proposal becomes a source note and a formula unit awaiting review. Sessions never write
    the repository; this is the only way in. All or nothing; makes no commit.
    """
    from evidence_pipeline.authoring.formulas import FormulaImportError, import_proposals

    try:
        result = import_proposals(workspace_root, list(artifacts))
    except FormulaImportError as exc:
        _refused(exc, as_json=as_json)
        return
    _report(result, as_json=as_json, what="import-proposals")
