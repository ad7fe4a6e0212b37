"""``tht evidence suggest``: a fix for each miss of a generation's gate, as a patch to review."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from evidence_pipeline.cli.common import emit_json, json_option, stdout, user_errors, workspace_root


@click.command("suggest")
@workspace_root
@click.option("--generation", type=int,
              help="Suggest for this generation (default: the newest one with a recorded "
                   "evaluation, a failed candidate included).")
@json_option
@user_errors
def suggest_cmd(workspace_root: Path, generation: int | None, as_json: bool) -> None:
    """Write a fix for each miss of the gate's evaluation as a patch to review:
    <state>/suggestions/generation-<n>.patch (default generation: the newest evaluated one).

    A purpose_filtered miss gets the query's purpose added to the unit; a ranked_low or
    not_retrieved miss gets the question's content words the unit never uses as concepts. The
    patch is never applied: review it, then git apply, validate, commit and publish.
    """
    from evidence_pipeline.publishing.suggest import suggest_generation
    from evidence_runtime.workspace import load_workspace

    result = suggest_generation(load_workspace(workspace_root), generation=generation)
    if as_json:
        emit_json(result.model_dump(mode="json"))
        return
    chosen = "" if generation is not None else " (the newest evaluated one)"
    stdout.print(f"generation {result.generation}{chosen}, revision {result.revision[:12]}: "
                 f"{result.misses} miss(es), {len(result.suggestions)} suggestion(s)")
    for s in result.suggestions:
        stdout.print(f"[green]suggest[/] {s.query} {escape(s.evidence_id)} ({s.reason}): "
                     f"{escape(s.text)}")
    for u in result.unsuggested:
        stdout.print(f"[yellow]no suggestion[/] {u.query} {escape(u.evidence_id)} "
                     f"({u.reason}): {escape(u.why)}")
    if result.patch:
        stdout.print(f"patch written, not applied: {escape(result.patch)}\n"
                     f"review it, then: git apply {escape(result.patch)}")
    else:
        stdout.print("nothing to patch")
