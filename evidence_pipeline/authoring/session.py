"""The authoring session: the one frame of every command that writes the work tree.

prepare (CLI and Dagster), resolve and the formula imports all run in it, in this order: the
workspace lock, recovery of an interrupted apply, the clean-tree check, the manifest and its
``pipeline_version``, the current curated units; then the command plans and validates its change
and hands it to :meth:`AuthoringSession.apply`, the all-or-nothing apply (spec §5.5, §6, §13.1).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from evidence_pipeline.authoring.apply import Batch, apply_batch, recover
from evidence_pipeline.formats.manifest import (
    MANIFEST_NAME,
    Manifest,
    empty_manifest,
    require_compatible,
)
from evidence_pipeline.gitrepo import dirty_paths, require_clean
from evidence_pipeline.lock import workspace_lock
from evidence_pipeline.state import STATE_DIR_NAME
from evidence_pipeline.validation.batch import batch_problems
from evidence_pipeline.validation.corpus import SourceReader, corpus_files
from evidence_pipeline.validation.problems import Problem
from evidence_pipeline.validation.unit_cache import UnitCache
from evidence_pipeline.validation.validator import load_units
from evidence_runtime.curated import CuratedDocument
from evidence_runtime.errors import ErrorCode, EvidenceError
from evidence_runtime.units import ID_PREFIX, UnitBase
from evidence_runtime.workspace import Workspace

# What must be clean by default, relative to evidence/: the files authoring rewrites.
CURATED_AND_MANIFEST = ("curated", MANIFEST_NAME)


class BatchInvalidError(EvidenceError):
    """The batch holds a file ``validate`` would refuse (``problems`` name each); nothing was
    written."""

    code = ErrorCode.batch_invalid

    def __init__(self, message: str, problems: Sequence[Problem], **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.problems = list(problems)


@dataclass(frozen=True)
class ExistingUnit:
    """A curated unit of the work tree, as the session read it."""

    rel_path: str  # relative to evidence/
    doc: CuratedDocument
    unit: UnitBase


def authoring_dir(ws: Workspace) -> Path:
    """Where the authoring lock and staged batches live: the work tree's own ``.tht/``, never
    THT_STATE_DIR, as a staged file is moved into the tree by rename (same filesystem)."""
    return ws.root / STATE_DIR_NAME


def evidence_rel(ws: Workspace) -> str:
    """The evidence directory relative to the workspace root (``evidence``)."""
    return ws.config.evidence.root.strip("/")


def load_existing(ws: Workspace, cache: UnitCache | None = None,
                  ) -> tuple[dict[str, ExistingUnit], list[Problem]]:
    """Every current curated unit by id; problems for files that cannot be read as units."""
    ev = evidence_rel(ws)
    rels = corpus_files(ws.evidence_dir, ws.config.evidence.patterns)
    loaded, problems = load_units(ws.evidence_dir, rels, shown_prefix=f"{ev}/",
                                  sources=SourceReader(ws.evidence_dir), check=False,
                                  cache=cache or UnitCache.in_state_dir(ws.state_dir))
    out: dict[str, ExistingUnit] = {}
    unreadable: set[str] = set()
    for item in loaded:
        if item.unit is not None and item.doc is not None:
            out[item.unit.id] = ExistingUnit(item.rel_path, item.doc, item.unit)
        else:
            unreadable.add(f"{ev}/{item.rel_path}")
    # a file that cannot be read as a unit has an unknown id (a new id could clash); content
    # problems of readable units are left to validate
    return out, [p for p in problems if p.path in unreadable]


@dataclass
class AuthoringSession:
    """One authoring command holding the workspace lock; see the module docstring.

    Open it with :meth:`open`; after :meth:`load`, ``manifest`` (None when there is none yet),
    ``existing`` and ``unreadable`` describe the work tree the command starts from.
    """

    ws: Workspace
    what: str
    recovered: list[str] = field(default_factory=list)
    manifest: Manifest | None = None
    existing: dict[str, ExistingUnit] = field(default_factory=dict)
    unreadable: list[Problem] = field(default_factory=list)
    guarded: tuple[str, ...] = ()

    @classmethod
    @contextmanager
    def open(cls, ws: Workspace, *, what: str, recovering: bool = True
             ) -> Iterator[AuthoringSession]:
        """Hold the workspace lock for ``what`` and finish or discard an interrupted apply
        (``recovering=False``: a read-only preview, which never writes the tree)."""
        with workspace_lock(authoring_dir(ws), what=what):
            session = cls(ws, what)
            if recovering:
                session.recovered = recover(ws.root, authoring_dir(ws))
            yield session

    @property
    def ev(self) -> str:
        return evidence_rel(self.ws)

    @property
    def rolled_forward(self) -> bool:
        """Whether recovery completed an interrupted apply: that is this run's change."""
        return any(line.startswith("completed") for line in self.recovered)

    def shown(self, rel: str) -> str:
        """A path relative to evidence/ as the user sees it (relative to the workspace root)."""
        return f"{self.ev}/{rel}"

    def refuse_if_rolled_forward(self) -> None:
        """For a command whose change cannot simply follow a roll-forward: stop, say so
        (``interrupted_apply_recovered``: the command did not run its own change)."""
        if self.rolled_forward:
            raise EvidenceError(
                f"{self.what} did not run: an interrupted apply was completed first "
                f"({'; '.join(self.recovered)}); review it with git diff, commit it, then run "
                f"{self.what} again", code=ErrorCode.interrupted_apply_recovered,
                path=str(self.ws.root))

    def load(self, *, clean: Sequence[str] | None = CURATED_AND_MANIFEST,
             upgrade: bool = False) -> None:
        """Check the tree is clean, read the manifest (its version must be this pipeline's,
        unless ``upgrade``) and the current curated units.

        ``clean``: paths relative to evidence/ that must have no uncommitted change; None: the
        whole repository (``upgrade`` always checks the whole repository).
        """
        if upgrade or clean is None:
            self.guarded = ()
            require_clean(self.ws.root, (), what=f"{self.what} --upgrade" if upgrade
                          else self.what)
        else:
            self.guarded = tuple(self.shown(rel) for rel in clean)
            require_clean(self.ws.root, self.guarded, what=self.what)
        shown = self.shown(MANIFEST_NAME)
        cache = UnitCache.in_state_dir(self.ws.state_dir)  # the manifest too: by its blob id
        self.manifest = cache.manifest(self.ws.evidence_dir, shown=shown)
        if self.manifest is not None and not upgrade:
            require_compatible(self.manifest, shown=shown)
        self.existing, self.unreadable = load_existing(self.ws, cache)

    def manifest_or_empty(self) -> Manifest:
        """A copy of the manifest to change (an empty one when there is none yet)."""
        if self.manifest is None:
            return empty_manifest()
        return Manifest.model_validate(self.manifest.to_data())

    def taken_ids(self) -> set[str]:
        """Every id a new unit must not get: every id ever issued (units, manifest entries,
        orphans, retirement candidates, retired ids) and the curated file names."""
        manifest = self.manifest or empty_manifest()
        names = {f"{ID_PREFIX}{PurePosixPath(item.rel_path).stem}"
                 for item in self.existing.values()}
        return set(self.existing) | manifest.issued_ids() | names

    def apply(self, batch: Batch) -> None:
        """Apply ``batch`` (paths relative to the workspace root) all or nothing.

        Every file is first put through the rules ``validate`` applies to it
        (:func:`batch_problems`): :class:`BatchInvalidError` when one breaks them. The paths
        checked clean by :meth:`load` must still be clean: a file edited while the
        command ran (a model call can take minutes) refuses the batch, so the edit is kept.
        """
        if batch.is_empty():
            return
        invalid = batch_problems(batch.writes, evidence_root=self.ev, origins=batch.origins)
        if invalid:
            first = invalid[0]
            raise BatchInvalidError(
                f"{self.what} refused: {len(invalid)} file(s) it would write are not valid "
                f"({first.path}: {first.message})", invalid, path=str(self.ws.root))
        dirty = dirty_paths(self.ws.root, self.guarded)
        if dirty:
            listed = ", ".join(dirty[:10]) + (f" and {len(dirty) - 10} more"
                                              if len(dirty) > 10 else "")
            raise EvidenceError(f"{self.what} refused: {len(dirty)} file(s) changed while it "
                                f"ran: {listed}; nothing was written, run {self.what} again",
                                path=str(self.ws.root), code=ErrorCode.workspace_changed)
        apply_batch(self.ws.root, authoring_dir(self.ws), batch,
                    name=f"{self.what.split()[0]}-{time.time_ns()}")
