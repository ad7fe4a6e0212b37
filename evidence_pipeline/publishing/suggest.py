"""``tht evidence suggest``: the fix of each miss of a generation's gate, as a patch to review.

Reads the evaluation the gate recorded with the generation in the registry (default: the newest
generation that has one, a candidate whose gate failed included: its points are gone, its report
is not), the questions and curated units of the revision it was built from, and writes the
suggestions (:mod:`.suggestions`) as ``<state>/suggestions/generation-<n>.patch``. The patch is
never applied here: the curator reviews it and runs ``git apply`` (then validate, commit,
publish).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from evidence_pipeline.formats.evalset import read_evaluation
from evidence_pipeline.publishing.content_words import ContentWords
from evidence_pipeline.publishing.evaluate import Miss, QueryResult, revision_evidence_dir
from evidence_pipeline.publishing.guard import open_registry
from evidence_pipeline.publishing.suggestions import (
    CuratedUnit,
    Suggestion,
    render_patch,
    suggest,
)
from evidence_pipeline.validation.corpus import SourceReader, corpus_files
from evidence_pipeline.validation.validator import load_units
from evidence_runtime.errors import ErrorCode, EvidenceError
from evidence_runtime.registry import Generation
from evidence_runtime.workspace import Workspace


class Unsuggested(BaseModel):
    """A miss without an edit of its unit to suggest, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query: str
    evidence_id: str
    reason: str
    why: str


class SuggestResult(BaseModel):
    """The ``suggest --json`` document."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: int
    revision: str
    patch: str | None  # the patch file written (None: nothing to suggest)
    misses: int
    suggestions: tuple[Suggestion, ...]
    unsuggested: tuple[Unsuggested, ...]


class RecordedEvaluation(BaseModel):
    """What suggest reads of the evaluation recorded with a generation: its questions' misses
    and the BM25 settings (the rest of the report, e.g. the fusion settings, may differ between
    versions without making it unreadable)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    revision: str
    generation: int
    search_config: dict[str, Any]
    queries: tuple[QueryResult, ...]

    def misses(self) -> list[tuple[str, str, Miss]]:
        return [(q.id, eid, miss) for q in self.queries for eid, miss in q.misses.items()]


def suggestions_path(ws: Workspace, generation: int) -> Path:
    return ws.state_dir / "suggestions" / f"generation-{generation}.patch"


def evaluated_generation(ws: Workspace, generation: int | None
                         ) -> tuple[Generation, RecordedEvaluation]:
    """``generation`` (default: the newest one with a recorded evaluation) and its report."""
    registry = open_registry(ws)
    try:
        gens = registry.generations(ws.config.workspace_id)
    finally:
        registry.close()
    if generation is None:
        gen = next((g for g in gens if g.evaluation is not None), None)
        if gen is None:
            raise EvidenceError("no generation has an evaluation yet: publish one first "
                                "(tht workspace preprocess evidence)",
                                code=ErrorCode.generation_missing)
    else:
        gen = next((g for g in gens if g.number == generation), None)
        if gen is None or gen.evaluation is None:
            raise EvidenceError(f"generation {generation} "
                                f"{'does not exist' if gen is None else 'has no evaluation'}",
                                code=ErrorCode.generation_missing)
    try:
        return gen, RecordedEvaluation.model_validate(gen.evaluation)
    except ValidationError:
        raise EvidenceError(f"the evaluation recorded with generation {gen.number} is not an "
                            f"evaluation report this version reads; publish again (tht "
                            f"workspace preprocess evidence) to record a new one",
                            code=ErrorCode.evaluation_malformed) from None


def revision_units(ws: Workspace, evidence_dir: Path) -> dict[str, CuratedUnit]:
    """evidence id → curated unit of the revision materialized in ``evidence_dir``."""
    root = ws.config.evidence.root
    rels = corpus_files(evidence_dir, ws.config.evidence.patterns)
    loaded, _ = load_units(evidence_dir, rels, shown_prefix=f"{root}/",
                           sources=SourceReader(evidence_dir), check=False)
    return {item.unit.id: CuratedUnit(path=f"{root}/{item.rel_path}",
                                      text=(evidence_dir / item.rel_path).read_text("utf-8"),
                                      doc=item.doc, unit=item.unit)
            for item in loaded if item.unit is not None and item.doc is not None}


def suggest_generation(ws: Workspace, *, generation: int | None = None) -> SuggestResult:
    """Suggest a fix for every miss of ``generation``'s evaluation (default: the newest
    evaluated generation) and write them as a patch; nothing is applied."""
    gen, report = evaluated_generation(ws, generation)
    evidence_dir = revision_evidence_dir(ws, gen.revision)
    evalset = read_evaluation(evidence_dir, shown=f"{ws.config.evidence.root}/evaluation.yaml "
                                                  f"at revision {gen.revision[:12]}")
    units = revision_units(ws, evidence_dir)
    bm25: dict[str, Any] = report.search_config.get("bm25") or {}
    words = ContentWords(str(bm25.get("language") or ws.config.language),
                         tuple(str(w) for w in bm25.get("stopwords") or ()))
    found = suggest(report.misses(), evalset, units, words)
    done = {(s.query, s.evidence_id) for s in found}
    unsuggested = tuple(
        Unsuggested(query=qid, evidence_id=eid, reason=miss.reason, why=_why(miss.reason,
                                                                            eid in units))
        for qid, eid, miss in report.misses() if (qid, eid) not in done)
    patch = render_patch(found, units)
    target = suggestions_path(ws, report.generation)
    written: Path | None = None
    if patch:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(patch, encoding="utf-8")
        tmp.replace(target)
        written = target
    else:
        target.unlink(missing_ok=True)  # an earlier run's patch would be stale
    return SuggestResult(generation=report.generation, revision=report.revision,
                         patch=None if written is None else str(written),
                         misses=len(report.misses()), suggestions=tuple(found),
                         unsuggested=unsuggested)


def _why(reason: str, known: bool) -> str:
    if not known:
        return "no curated unit has this id at the evaluated revision"
    return {
        "not_published": "the unit has no fragment in the generation",
        "constraint_filtered": "the question's explicit constraints exclude the unit",
        "ranked_low": "the unit already uses every content word of the question: a ranking "
                      "matter, no edit of the unit to suggest",
        "not_retrieved": "the unit already uses every content word of the question",
    }.get(reason, "no edit of the unit to suggest")
