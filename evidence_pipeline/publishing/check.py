"""``tht workspace check [--repair]`` and the nightly ``index_integrity`` asset check (issue 28
item 3): like ``git fsck``, verify what the search relies on and, with ``repair``, rebuild it.

Checked: the registry reads back; the index opens (room on its filesystem included); every
generation that keeps its points (the active one, retained ones a rollback may activate) holds
the fragments the registry recorded, each with both named vectors and the payload fields a
result is built from; no batch an interrupted authoring run staged is waiting; no evaluation
copy of a dead process is left. The index is derived data: a damaged generation is rebuilt from
its revision in Git and the vector cache (:func:`rebuild_generation`), without embedding again.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from evidence_pipeline.publishing import evaluation_copies
from evidence_pipeline.publishing.candidate import rebuild_generation
from evidence_pipeline.publishing.guard import PublishError, open_registry, publish_lock
from evidence_pipeline.publishing.index_writer import IndexWriter, open_index_writer
from evidence_pipeline.publishing.registry_writer import RegistryWriter
from evidence_runtime.embeddings import Embedder
from evidence_runtime.errors import EvidenceError, IndexMissingError
from evidence_runtime.index import IndexConfig
from evidence_runtime.registry import Generation, GenerationStatus
from evidence_runtime.search import RECORD_KIND, RESULT_FIELDS, index_config
from evidence_runtime.workspace import Workspace


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Finding(_Record):
    """One thing found wrong; ``repaired`` says whether ``--repair`` fixed it."""

    code: str  # registry_corrupt, index_unavailable, index_missing, points_missing,
    # vector_missing, payload_missing, staged_batch, stale_evaluation_copy
    message: str
    generation: int | None = None
    path: str | None = None
    repairable: bool = False
    repaired: bool = False
    repair_error: str | None = None


class GenerationCheck(_Record):
    """What the index holds of one generation that keeps its points."""

    number: int
    status: str
    expected: int | None  # fragments the registry recorded
    points: int
    dense: int
    bm25: int
    payload: int  # points holding every field a result is built from


class CheckReport(_Record):
    """``tht workspace check --json``: ``ok`` (nothing wrong), ``damaged`` (findings left) or
    ``repaired`` (every finding repaired)."""

    status: Literal["ok", "damaged", "repaired"]
    findings: list[Finding] = Field(default_factory=list)
    generations: list[GenerationCheck] = Field(default_factory=list)
    embedded: int = 0  # fragments a repair embedded again (missing from the vector cache)
    timings: dict[str, float] = Field(default_factory=dict)


class StagedBatch(Protocol):
    """A batch an interrupted authoring run left staged (``tht evidence recover`` settles it),
    as authoring's ``apply.inspect`` lists them."""

    @property
    def name(self) -> str: ...

    @property
    def state(self) -> str: ...


def retained(generations: Sequence[Generation]) -> list[Generation]:
    """The generations whose points the index must hold: active, and retired ones kept."""
    return [g for g in generations
            if g.status is GenerationStatus.active
            or (g.status is GenerationStatus.retired and g.counts.get("points_retained", True))]


def check_generation(index: IndexWriter, wid: str, gen: Generation,
                     ) -> tuple[GenerationCheck, list[Finding]]:
    """The counts of ``gen`` in ``index`` and what is wrong with them."""
    counts = index.point_counts({"workspace_id": wid, "vector_generation": gen.number,
                                 "record_kind": RECORD_KIND}, payload_fields=RESULT_FIELDS)
    recorded = gen.counts.get("fragments")
    expected = recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else None
    row = GenerationCheck(number=gen.number, status=gen.status.value, expected=expected,
                          points=counts.points, dense=counts.dense, bm25=counts.bm25,
                          payload=counts.payload)
    want = counts.points  # those missing altogether are points_missing
    found: list[Finding] = []

    def add(code: str, message: str) -> None:
        found.append(Finding(code=code, message=f"generation {gen.number}: {message}",
                             generation=gen.number, repairable=True))

    if expected is not None and counts.points < expected:
        add("points_missing", f"{counts.points} of its {expected} points are in the index")
    for name, have in (("dense", counts.dense), ("bm25", counts.bm25)):
        if have < want:
            add("vector_missing", f"{have} of {want} points hold the {name} vector")
    if counts.payload < want:
        add("payload_missing", f"{counts.payload} of {want} points hold their payload fields "
                               f"({', '.join(RESULT_FIELDS)})")
    return row, found


@contextlib.contextmanager
def _open_index(config: IndexConfig, ws: Workspace, *, dense_dim: int | None = None,
                ) -> Iterator[IndexWriter]:
    """The index opened to check it (``dense_dim``: created, to rebuild a lost one)."""
    index = open_index_writer(config, language=ws.config.language,
                              create=dense_dim is not None, dense_dim=dense_dim)
    try:
        if dense_dim is not None:
            index.ensure_schema(dense_dim=dense_dim)
        yield index
    finally:
        index.close()


def check_workspace(ws: Workspace, *, repair: bool = False,
                    staged: Sequence[StagedBatch] = (), config: IndexConfig | None = None,
                    embedder: Embedder | None = None) -> CheckReport:
    """Check the workspace's registry, index, generations and leftovers; with ``repair``,
    rebuild each damaged generation from its revision and remove stale evaluation copies.
    ``staged``: the batches interrupted authoring runs left (the caller reads them: authoring
    is not publishing's to import); they are reported, never settled here. ``config``: the
    index to check (default: the workspace's)."""
    t0 = time.perf_counter()
    findings: list[Finding] = [
        Finding(code="staged_batch", path=b.name,
                message=f"authoring batch {b.name} is left {b.state} by an interrupted run: "
                        "settle it with `tht evidence recover`")
        for b in staged]
    stale = evaluation_copies.stale_copies(ws.state_dir) if ws.state_dir.is_dir() else []
    findings += [Finding(code="stale_evaluation_copy", path=str(p), repairable=True,
                         message=f"{p.name}: a shard copy an evaluation that no longer runs "
                                 "left behind")
                 for p in stale]
    rows: list[GenerationCheck] = []
    damaged: dict[int, Generation] = {}
    wid = ws.config.workspace_id
    with contextlib.ExitStack() as stack:
        try:
            registry: RegistryWriter = stack.enter_context(open_registry(ws))
            generations = registry.generations(wid)
        except EvidenceError as exc:
            findings.append(Finding(code=exc.code if exc.code == "registry_corrupt"
                                    else "registry_unavailable", message=str(exc)))
            return _report(findings, rows, t0)
        keep = retained(generations)
        try:
            target = config or index_config(ws)
            index = stack.enter_context(_open_index(target, ws))
        except IndexMissingError as exc:
            if not keep:
                return _report(findings, rows, t0)
            # lost as a whole: with repair, a new one holds every retained generation again
            findings.append(Finding(code="index_missing", message=str(exc), path=exc.path,
                                    repairable=True))
            dim = keep[0].config.get("dim")
            if not repair or not isinstance(dim, int):
                return _report(findings, rows, t0)
            try:
                index = stack.enter_context(_open_index(target, ws, dense_dim=dim))
            except EvidenceError as again:
                findings[-1] = findings[-1].model_copy(update={"repair_error": str(again)})
                return _report(findings, rows, t0)
        except EvidenceError as exc:  # locked, no room (disk_full), unreadable, unreachable
            findings.append(Finding(code=exc.code, message=str(exc), path=exc.path))
            return _report(findings, rows, t0)
        for gen in keep:
            try:
                row, found = check_generation(index, wid, gen)
            except EvidenceError as exc:
                findings.append(Finding(code=exc.code, message=f"generation {gen.number}: "
                                        f"{exc}", generation=gen.number, repairable=True))
                damaged[gen.number] = gen
                continue
            rows.append(row)
            findings += found
            if found:
                damaged[gen.number] = gen
        timings = {"check_s": time.perf_counter() - t0}
        embedded = 0
        if repair and (damaged or stale):
            t = time.perf_counter()
            with publish_lock(ws):
                embedded = _repair(ws, registry, index, damaged, stale, findings, embedder)
                rows = [check_generation(index, wid, g)[0] for g in keep]
            timings["repair_s"] = time.perf_counter() - t
    return _report(findings, rows, t0, timings, embedded=embedded)


def _repair(ws: Workspace, registry: RegistryWriter, index: IndexWriter,
            damaged: dict[int, Generation], stale: list[Path],
            findings: list[Finding], embedder: Embedder | None) -> int:
    """Rebuild the damaged generations and remove the stale copies, marking the findings
    repaired (or why not); the fragments embedded again."""
    outcome: dict[int, str | None] = {}
    embedded = 0
    for number, gen in damaged.items():
        try:
            embedded += int(rebuild_generation(ws, registry, index, gen,
                                               embedder=embedder)["embedded"])
            outcome[number] = None
        except (PublishError, EvidenceError) as exc:
            outcome[number] = str(exc)
    for copy in stale:
        shutil.rmtree(copy, ignore_errors=True)
    for i, f in enumerate(findings):
        if not f.repairable:
            continue
        if f.generation is not None and f.generation in outcome:
            error = outcome[f.generation]
            findings[i] = f.model_copy(update={"repaired": error is None, "repair_error": error})
        elif f.code == "index_missing":
            errors = [e for e in outcome.values() if e is not None]
            findings[i] = f.model_copy(update={"repaired": bool(outcome) and not errors,
                                               "repair_error": errors[0] if errors else None})
        elif f.code == "stale_evaluation_copy" and f.path is not None:
            findings[i] = f.model_copy(update={"repaired": not Path(f.path).exists()})
    return embedded


def _report(findings: list[Finding], rows: list[GenerationCheck], t0: float,
            timings: dict[str, float] | None = None, *, embedded: int = 0) -> CheckReport:
    times = dict(timings or {"check_s": time.perf_counter() - t0})
    if not findings:
        status: Literal["ok", "damaged", "repaired"] = "ok"
    elif all(f.repaired for f in findings):
        status = "repaired"
    else:
        status = "damaged"
    return CheckReport(status=status, findings=findings, generations=rows, embedded=embedded,
                       timings={k: round(v, 4) for k, v in times.items()})
