"""``tht workspace check [--repair]``: like ``git fsck``, verify the registry, the index (each
retained generation's points, named vectors and payload fields), staged authoring batches and
stale evaluation copies; ``--repair`` rebuilds a damaged generation from Git and the vector
cache (issue 28 item 3)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape

from evidence_pipeline.cli.common import (
    EXIT_PROBLEMS,
    emit_json,
    json_option,
    stdout,
    user_errors,
    workspace_root,
)

if TYPE_CHECKING:
    from evidence_pipeline.publishing.check import CheckReport


@click.command("check")
@workspace_root
@click.option("--repair", is_flag=True,
              help="Rebuild each damaged generation from its revision (Git and the vector "
                   "cache, no embedding) and remove stale evaluation copies.")
@json_option
@user_errors
def check_cmd(workspace_root: Path, repair: bool, as_json: bool) -> None:
    """Verify the registry, the index (points, both named vectors and the payload fields of
    every retained generation), staged batches and stale evaluation copies.

    Exit 0 when nothing is wrong (or everything found was repaired), 1 otherwise.
    """
    from evidence_pipeline.authoring.recovery import staged_batches
    from evidence_pipeline.publishing.check import check_workspace
    from evidence_runtime.workspace import load_workspace

    ws = load_workspace(workspace_root)
    report = check_workspace(ws, repair=repair, staged=staged_batches(ws))
    if as_json:
        emit_json(report.model_dump(mode="json"))
    else:
        print_report(report)
    if report.status == "damaged":
        sys.exit(EXIT_PROBLEMS)


def print_report(report: CheckReport) -> None:
    for g in report.generations:
        stdout.print(f"generation {g.number} ({g.status}): {g.points} point(s) of "
                     f"{g.expected if g.expected is not None else '?'}; dense {g.dense}, "
                     f"bm25 {g.bm25}, payload {g.payload}")
    for f in report.findings:
        mark = "[green]repaired[/]" if f.repaired else "[red]damaged[/]"
        why = f" ({escape(f.repair_error)})" if f.repair_error else ""
        stdout.print(f"{mark} {f.code}: {escape(f.message)}{why}")
    colour = {"ok": "green", "repaired": "green", "damaged": "red"}[report.status]
    stdout.print(f"[{colour}]{report.status}[/]: {len(report.findings)} finding(s)")
