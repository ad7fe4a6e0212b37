"""``tht evidence recover``: show, finish or drop a batch an interrupted authoring run left staged.

Every authoring command finishes an interrupted apply by itself, except over a file changed since
the batch was staged (a curator's uncommitted edit): then it refuses, keeping both, and this
command settles it. ``--finish`` applies the batch (each edited file is first copied to
``.tht/conflicts/<batch>/``); ``--drop`` discards it, putting back the files it had already
replaced unless they changed since. Without an option it only shows what is pending.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from evidence_pipeline.authoring import apply
from evidence_pipeline.authoring.session import AuthoringSession, authoring_dir
from evidence_runtime.workspace import Workspace, load_workspace


class RecoverResult(BaseModel):
    """What ``recover`` found and did; ``model_dump(mode="json")`` is ``recover --json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: str  # "inspected" | "finished" | "dropped"
    batches: list[apply.PendingBatch]
    set_aside: list[str] = Field(default_factory=list)  # copies of edited files (--finish)
    restored: list[str] = Field(default_factory=list)  # files put back (--drop)
    kept: list[str] = Field(default_factory=list)  # files left as edited (--drop)


def staged_batches(ws: Workspace) -> list[apply.PendingBatch]:
    """The batches interrupted authoring runs left staged, read only (what ``recover`` shows,
    ``tht workspace check`` and its Dagster asset check report)."""
    return apply.inspect(ws.root, authoring_dir(ws))


def recover_workspace(root: Path, *, finish: bool = False, drop: bool = False) -> RecoverResult:
    """Show the batches left staged; with ``finish`` or ``drop`` (not both), settle them."""
    if finish and drop:
        raise ValueError("finish and drop are exclusive")
    ws = load_workspace(root)
    with AuthoringSession.open(ws, what="recover", recovering=False) as session:
        local = authoring_dir(session.ws)
        found = apply.inspect(ws.root, local)
        if not (finish or drop):
            return RecoverResult(action="inspected", batches=found)
        set_aside: list[str] = []
        restored: list[str] = []
        kept: list[str] = []
        for batch_dir in apply.pending(local):
            if batch_dir.name.endswith((apply.APPLIED, apply.DISCARDED)) \
                    or not (batch_dir / apply.COMMITTED).is_file():
                continue  # nothing to decide: applied, or never committed
            if finish:
                set_aside += apply.finish(ws.root, local, batch_dir)
            else:
                back, left = apply.drop(ws.root, batch_dir)
                restored += back
                kept += left
        # what is left (never committed, or already applied or discarded) goes the usual way
        apply.recover(ws.root, local)
        return RecoverResult(action="finished" if finish else "dropped", batches=found,
                             set_aside=set_aside, restored=restored, kept=kept)
