"""What every ``tht`` command shares: exit codes, the error line, ``--json`` output, options.

Exit 0 on success; non-zero with one clear line on stderr on failure; ``--json`` prints one JSON
document on stdout and nothing else there. Tracebacks are for bugs only.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape

from evidence_runtime.errors import EvidenceError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_PROBLEMS = 1
EXIT_ERROR = 2

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def embedding_bar() -> Iterator[Callable[[Any], None]]:
    """A progress bar on stderr for the embedding of new fragments (the slow part of publishing
    a new corpus); the callback takes ``EmbeddingProgress``, and draws a bar of its own for each
    other phase a ``PhaseProgress`` names (validation, upload, evaluation; prepare's model
    calls). Drawn only on a terminal, and cleared when done: the command's own output stays as
    it is."""
    if not stderr.is_terminal:
        yield lambda _progress: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=stderr, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def update(progress: Any) -> None:
            label = getattr(progress, "label", "embedding new fragments")
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=None)
            bar.update(tasks[label], total=progress.total, completed=progress.done)

        yield update


def fail(message: str, code: int = EXIT_ERROR) -> None:
    """Print one line on stderr and exit."""
    # names taken from the input may hold control characters: escape them, keep one line
    message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def user_errors(func: F) -> F:
    """Turn expected errors into one clear stderr line and a non-zero exit.

    With ``--json`` the error is also the one JSON document on stdout:
    ``{"status": "error", "problems": [{"code", "severity", "path", "evidence_id", "field",
    "message"}]}``, so that a machine never has to parse stderr.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except EvidenceError as exc:
            if kwargs.get("as_json"):
                emit_json(error_document(exc.code, exc.message, path=exc.path,
                                         evidence_id=exc.evidence_id, field=exc.field))
            fail(str(exc))
        except KeyboardInterrupt:
            if kwargs.get("as_json"):
                emit_json(error_document("interrupted", "interrupted"))
            fail("interrupted", 130)

    return wrapper  # type: ignore[return-value]


def error_document(code: str, message: str, *, path: str | None = None,
                   evidence_id: str | None = None, field: str | None = None) -> dict[str, Any]:
    """The ``--json`` document of a command that could not run."""
    return {"status": "error", "problems": [{
        "code": code, "severity": "error", "path": path, "evidence_id": evidence_id,
        "field": field, "message": message}]}


def print_problems(problems: list[Any]) -> None:
    """One line per problem: severity, code, file, unit, field, message (grep-friendly)."""
    for p in problems:
        style = "red" if p.severity.value == "error" else "yellow"
        where = "  ".join(x for x in (p.path, p.evidence_id, p.field) if x)
        stdout.print(f"[{style}]{p.severity.value:6}[/] [bold]{p.code}[/]  {escape(where)}: "
                     f"{escape(p.message)}")


def refuse(message: str, problems: list[Any], document: dict[str, Any], *,
           as_json: bool) -> None:
    """A command refused with a list of problems: ``document`` plus ``problems`` as the JSON
    document, or one line per problem; then the one error line and exit 1."""
    if as_json:
        emit_json({**document, "problems": [p.model_dump(mode="json") for p in problems]})
    else:
        print_problems(problems)
    fail(message, EXIT_PROBLEMS)


def emit_json(document: Any) -> None:
    click.echo(json.dumps(document, ensure_ascii=False, indent=2, sort_keys=False))


workspace_root = click.argument(
    "workspace_root", type=click.Path(file_okay=False, path_type=Path)
)
json_option = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
