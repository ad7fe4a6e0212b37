"""The ``tht`` command line: curators and operators run the same functions as the assets.

Exit 0 on success; non-zero with one clear line on stderr on failure; ``--json`` prints one JSON
document on stdout and nothing else there. Tracebacks are for bugs only.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from evidence_runtime.errors import EvidenceError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_PROBLEMS = 1
EXIT_ERROR = 2

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = EXIT_ERROR) -> None:
    """Print one line on stderr and exit."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def user_errors(func: F) -> F:
    """Turn expected errors into one clear stderr line and a non-zero exit."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except EvidenceError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper  # type: ignore[return-value]


def print_problems(problems: list[Any]) -> None:
    """One line per problem: severity, code, file, unit, field, message (grep-friendly)."""
    for p in problems:
        style = "red" if p.severity.value == "error" else "yellow"
        where = "  ".join(x for x in (p.path, p.evidence_id, p.field) if x)
        stdout.print(f"[{style}]{p.severity.value:6}[/] [bold]{p.code}[/]  {escape(where)}: "
                     f"{escape(p.message)}")


def emit_json(document: Any) -> None:
    click.echo(json.dumps(document, ensure_ascii=False, indent=2, sort_keys=False))


workspace_root = click.argument(
    "workspace_root", type=click.Path(file_okay=False, path_type=Path)
)
json_option = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")


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
    from evidence_pipeline.validate import Severity, Status, sort_problems, validate_workspace


    report = validate_workspace(workspace_root)
    if as_json:
        emit_json(report.to_json())
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
@click.option("--backend", type=click.Choice(["pi", "openai", "structural"]),
              help="Model backend (default: thoth.yaml model.backend).")
@click.option("--no-diff", is_flag=True, help="Do not print the diff of the proposed change.")
@json_option
@user_errors
def prepare(workspace_root: Path, upgrade: bool, backend: str | None, no_diff: bool,
            as_json: bool) -> None:
    """Restructure changed sources into curated units (one model call per changed source).

    All or nothing: any problem leaves the work tree unchanged. Makes no commit.
    """
    from evidence_pipeline.prepare import PrepareError, SourceReport
    from evidence_pipeline.prepare import prepare as run_prepare

    out = stderr if as_json else stdout
    colours = {"unchanged": "dim", "changed": "yellow", "new": "green", "removed": "red",
               "renamed": "cyan"}

    def progress(report: SourceReport) -> None:
        timing = f"  model {report.model_seconds:.2f}s" if report.model_seconds is not None \
            else ""
        c = colours[report.change.value]
        renamed = f" (from {report.renamed_from})" if report.renamed_from else ""
        out.print(f"[{c}]{report.change.value:9}[/] {escape(report.path)}{renamed}  "
                  f"{len(report.units)} unit(s){timing}")

    try:
        result = run_prepare(workspace_root, backend=backend, upgrade=upgrade, progress=progress)
    except PrepareError as exc:
        if as_json:
            emit_json({"status": "failed", "model_calls": None,
                       "problems": [p.to_json() for p in exc.problems]})
        else:
            print_problems(exc.problems)
        fail(str(exc), EXIT_PROBLEMS)
        return
    if as_json:
        emit_json(result.to_json())
        return
    for line in result.recovered:
        stdout.print(f"[yellow]recovered[/]: {line}")
    counts: dict[str, int] = {}
    for r in result.sources:
        counts[r.change.value] = counts.get(r.change.value, 0) + 1
    table = Table(title="prepare", show_header=True, header_style="bold")
    for col in ("sources", "unchanged", "changed", "new", "renamed", "removed", "model calls",
                "files written", "files deleted", "review items"):
        table.add_column(col, justify="right")
    table.add_row(str(len(result.sources)), *(str(counts.get(k, 0)) for k in
                  ("unchanged", "changed", "new", "renamed", "removed")),
                  str(result.model_calls), str(len(result.written)), str(len(result.deleted)),
                  str(result.review_items))
    stdout.print(table)
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
    from evidence_pipeline.resolve import resolve as run_resolve

    if retire and source:
        raise click.UsageError("--retire and --source are mutually exclusive")
    if not retire and not source:
        raise click.UsageError("give one of --retire or --source")
    result = run_resolve(workspace_root, evidence_id, retire=retire, source=source)
    if as_json:
        emit_json({"action": result.action, "evidence_id": result.evidence_id,
                   "written": result.written, "deleted": result.deleted})
    else:
        stdout.print(f"{result.action} {result.evidence_id}: wrote {', '.join(result.written)}"
                     + (f"; deleted {', '.join(result.deleted)}" if result.deleted else "")
                     + " (no commit made; review with git diff)")


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


if __name__ == "__main__":  # pragma: no cover
    main()
