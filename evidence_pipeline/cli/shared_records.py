"""``tht workspace shared-records``: the Schema and Memory records sharing the collection (§16).

Before the upgrade an operator saves counts, a sample of ids and fixed dense searches per
record type (``--save``); after it, ``--compare`` (and every ``preprocess`` while a snapshot
exists) says whether they are unchanged.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from evidence_pipeline.cli.common import (
    EXIT_PROBLEMS,
    emit_json,
    json_option,
    stdout,
    user_errors,
    workspace_root,
)


@click.command("shared-records")
@workspace_root
@click.option("--save", is_flag=True,
              help="Keep the records now as the snapshot to compare with (before an upgrade).")
@click.option("--compare", is_flag=True,
              help="Compare the saved snapshot with the records now; exit 1 when they differ.")
@json_option
@user_errors
def shared_records_cmd(workspace_root: Path, save: bool, compare: bool, as_json: bool) -> None:
    """Schema and Memory records sharing the collection (spec §16): count, sample of ids and
    fixed dense searches per record type. Reads the index only."""
    from evidence_pipeline.publishing import shared_records
    from evidence_runtime.workspace import load_workspace

    if save and compare:
        raise click.UsageError("--save and --compare exclude each other")
    ws = load_workspace(workspace_root)
    if compare:
        comparison = shared_records.compare(ws)
        if as_json:
            emit_json(comparison.model_dump(mode="json"))
        else:
            print_comparison(comparison.model_dump(mode="json"))
        if not comparison.unchanged:
            sys.exit(EXIT_PROBLEMS)
        return
    snap = shared_records.save(ws) if save else shared_records.current(ws)
    if as_json:
        emit_json(snap.model_dump(mode="json"))
        return
    table = Table(title=f"shared records — {escape(snap.index)}", header_style="bold")
    for col in ("record type", "count", f"sample (first 3 of {shared_records.SAMPLE_SIZE})"):
        table.add_column(col, overflow="fold")
    for name, t in snap.types.items():
        table.add_row(name, str(t.count), escape(", ".join(t.sample[:3])))
    stdout.print(table)
    stdout.print(f"{snap.total} shared record(s) beside {snap.evidence_points} Evidence point(s)")
    if save:
        stdout.print(f"saved to {escape(str(shared_records.snapshot_path(ws)))}; after the "
                     "upgrade, run with --compare (preprocess compares too)")


def shared_records_after(root: Path) -> dict[str, Any] | None:
    """``preprocess``'s comparison with the saved snapshot, or None when none was saved."""
    from evidence_pipeline.publishing.shared_records import compare_if_saved
    from evidence_runtime.workspace import load_workspace

    return compare_if_saved(load_workspace(root))


def print_comparison(doc: dict[str, Any]) -> None:
    """The comparison as a status line and one line per record type (or the fault)."""
    if "error" in doc:
        stdout.print(f"[yellow]shared records not compared[/] ({doc['error']}): "
                     f"{escape(doc['message'])}")
        return
    verdict = "[green]unchanged[/]" if doc["unchanged"] else "[red]changed[/]"
    stdout.print(f"shared records (Schema, Memory) {verdict} since the snapshot of "
                 f"{doc['saved_at']}:")
    for name, t in doc["types"].items():
        what = []
        if t["missing_sample"]:
            what.append(f"{len(t['missing_sample'])} sampled id(s) gone: "
                        f"{', '.join(t['missing_sample'][:3])}")
        if t["dense_changed"]:
            what.append("dense probes return other records")
        state = "; ".join(what) or ("unchanged" if t["unchanged"] else "count changed")
        stdout.print(f"  {name}: {t['saved']} → {t['now']} ({escape(state)})")
