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
        if problems:
            table = Table(show_header=True, header_style="bold", expand=False)
            for col in ("severity", "code", "file", "unit", "field", "message"):
                table.add_column(col, overflow="fold")
            for p in problems:
                style = "red" if p.severity is Severity.error else "yellow"
                table.add_row(f"[{style}]{p.severity.value}[/]", p.code, p.path or "",
                              p.evidence_id or "", p.field or "", p.message)
            stdout.print(table)
        colour = {"publishable": "green", "blocked": "yellow", "invalid": "red"}[
            report.status.value]
        errors = sum(p.severity is Severity.error for p in problems)
        reviews = len(problems) - errors
        stdout.print(f"[{colour}]{report.status.value}[/]: {report.units} units, "
                     f"{errors} errors, {reviews} review items")
    if report.status is not Status.publishable:
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


if __name__ == "__main__":  # pragma: no cover
    main()
