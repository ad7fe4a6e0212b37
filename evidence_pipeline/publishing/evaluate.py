"""``tht evidence evaluate`` (spec §14): the questions of evaluation.yaml against a generation.

Runs the fused search the runtime uses and the dense and BM25 branches alone, records for every
expected unit its rank in each, and decides the gate: every query finds an expected unit in the
fused top 10. Never changes the index.

Every expected unit missing from the fused top 10 gets a reason, found by asking the index about
that unit's points in the evaluated generation (issue 16): ``not_published`` (none),
``purpose_filtered`` (none with the query's purpose), ``constraint_filtered`` (none within the
query's explicit constraints), ``not_retrieved`` (reachable, but in neither branch's first
:data:`RANK_DEPTH`), else ``ranked_low`` (in a branch's list, but ranked below 10 once fused).
``tht evidence suggest`` turns each of them into the curator's fix (:mod:`.suggestions`).

The evaluation set is the one of the revision the generation was built from (its materialized
tree, written from Git when missing), never the work tree: a generation is judged by the
questions that were reviewed with it. ``model_dump(mode="json")`` of an
:class:`EvaluationReport` is the ``evaluate --json`` document of DESIGN.md.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from evidence_pipeline.formats.evalset import EvalQuery, EvaluationSet, Profile, read_evaluation
from evidence_pipeline.gitrepo import materialize_revision
from evidence_pipeline.publishing.evaluation_copies import evaluation_copy
from evidence_pipeline.validation.corpus import SourceReader, corpus_files
from evidence_pipeline.validation.unit_cache import UnitCache
from evidence_pipeline.validation.validator import load_units
from evidence_runtime.errors import ErrorCode, EvidenceError
from evidence_runtime.index import EdgeIndex, IndexConfig, Match
from evidence_runtime.index.edge import shard_exists
from evidence_runtime.query import EvidenceConstraints, EvidenceSearchContext
from evidence_runtime.search import (
    EvidenceSearcher,
    EvidenceSearchOutcome,
    build_match,
    generation_bm25,
)
from evidence_runtime.units import EvidencePurpose
from evidence_runtime.workspace import Workspace

RANK_DEPTH = 50
GATE_K = 10
MODES = ("dense", "bm25", "fused")


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Ranks(_Record):
    """1-based rank of one expected unit in each branch (``None``: not in the first
    :data:`RANK_DEPTH`)."""

    dense: int | None
    bm25: int | None
    fused: int | None


class NotPublished(_Record):
    """The generation holds no fragment of the unit."""

    reason: Literal["not_published"] = "not_published"

    def describe(self) -> str:
        return "no fragment in the generation"


class PurposeFiltered(_Record):
    """The unit is published, but not for the query's purpose."""

    reason: Literal["purpose_filtered"] = "purpose_filtered"
    purposes: tuple[EvidencePurpose, ...]  # the unit's
    purpose: EvidencePurpose  # the query's

    def describe(self) -> str:
        return (f"unit purposes {', '.join(p.value for p in self.purposes) or 'none'}; "
                f"query purpose {self.purpose.value}")


class ConstraintFiltered(_Record):
    """The unit has the purpose, but the query's explicit constraints exclude it."""

    reason: Literal["constraint_filtered"] = "constraint_filtered"
    constraint: dict[str, tuple[str, ...]]  # the query's constraints that exclude the unit
    unit: dict[str, tuple[str, ...]]  # the unit's values for those constraints

    def describe(self) -> str:
        return "; ".join(f"{name} {', '.join(values)} (unit: "
                         f"{', '.join(self.unit.get(name, ())) or 'none'})"
                         for name, values in self.constraint.items())


class RankedLow(_Record):
    """The search can reach the unit, but ranks it below the fused top 10."""

    reason: Literal["ranked_low"] = "ranked_low"
    dense: int | None
    bm25: int | None
    fused: int | None

    def describe(self) -> str:
        def r(v: int | None) -> str:
            return f">{RANK_DEPTH}" if v is None else str(v)

        return f"dense {r(self.dense)}, bm25 {r(self.bm25)}, fused {r(self.fused)}"


class NotRetrieved(_Record):
    """The search can reach the unit, but neither branch has it in its first
    :data:`RANK_DEPTH`: ranking alone cannot bring it back, its words must change."""

    reason: Literal["not_retrieved"] = "not_retrieved"

    def describe(self) -> str:
        return f"in neither dense nor bm25 top {RANK_DEPTH}"


Miss = Annotated[NotPublished | PurposeFiltered | ConstraintFiltered | NotRetrieved | RankedLow,
                 Field(discriminator="reason")]


class QueryResult(_Record):
    """One question of evaluation.yaml: its hits, the ranks of each expected unit and why each
    expected unit outside the fused top 10 is there."""

    id: str
    profile: Profile
    purpose: EvidencePurpose
    expected: tuple[str, ...]
    hit_at_5: bool
    hit_at_10: bool
    ranks: dict[str, Ranks]
    misses: dict[str, Miss] = Field(default_factory=dict)


class EvaluationSummary(_Record):
    queries: int
    hit_at_5: int
    hit_at_10: int
    gate_passed: bool
    missed_kinds: tuple[str, ...]
    empty_queries: tuple[str, ...]


class SearchConfig(_Record):
    """The search settings the report was measured with."""

    fusion: str = "rrf"  # rrf | convex | dbsf | adaptive (index.fusion)
    rrf_k: int
    rrf_weights: tuple[float, float] | None = None  # (dense, BM25); None: equal weights
    # convex / adaptive: the dense branch's share (adaptive: when BM25 matches strongly), its
    # share when BM25 matches weakly, and the BM25 strengths in between (docs/search.md)
    dense_weight: float | None = None
    weak_dense_weight: float | None = None
    bm25_strength: tuple[float, float] | None = None
    prefetch_limit: int
    embedder: str
    bm25_language: str
    bm25: dict[str, Any] | None = None  # the generation's BM25 settings (language, avg_len,
    # stopwords), as its fragments were tokenized and its queries are
    rank_depth: int
    gate: str


class EvaluationReport(_Record):
    """The report of one generation; ``regressions`` is ``None`` when no baseline is saved
    (then it is left out of the JSON document)."""

    revision: str
    generation: int
    search_config: SearchConfig
    summary: EvaluationSummary
    queries: tuple[QueryResult, ...]
    regressions: tuple[str, ...] | None = None

    @property
    def gate_passed(self) -> bool:
        return self.summary.gate_passed

    @property
    def missed_queries(self) -> list[str]:
        """Ids of the queries without an expected unit in the fused top 10."""
        return [q.id for q in self.queries if not q.hit_at_10]

    def misses(self) -> list[tuple[str, str, Miss]]:
        """(query id, evidence id, why) of every expected unit outside the fused top 10."""
        return [(q.id, eid, miss) for q in self.queries for eid, miss in q.misses.items()]

    def summary_with_misses(self) -> dict[str, Any]:
        """The summary and every miss: the ``evaluation`` of ``preprocess evidence --json``."""
        return {**self.summary.model_dump(mode="json"),
                "misses": [{"query": qid, "evidence_id": eid, **miss.model_dump(mode="json")}
                           for qid, eid, miss in self.misses()]}

    @model_serializer(mode="wrap")
    def _without_absent_baseline(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if out.get("regressions") is None:
            out.pop("regressions", None)
        return out


def _ranks(outcome: EvidenceSearchOutcome) -> dict[str, int]:
    return {eid: i + 1 for i, eid in enumerate(outcome.evidence_ids)}


def _unavailable(outcome: EvidenceSearchOutcome) -> EvidenceError:
    return EvidenceError(f"search unavailable ({outcome.code}): {outcome.message}",
                         code=f"{ErrorCode.evaluation_unavailable}_{outcome.code}")


# constraint name in evaluation.yaml → payload field of a fragment
_CONSTRAINT_FIELDS = {"kinds": "evidence_kind", "tables": "tables", "columns": "columns",
                      "concepts": "concepts"}


def explain_miss(searcher: EvidenceSearcher, q: EvalQuery, evidence_id: str, ranks: Ranks, *,
                 generation: int, revision: str) -> Miss:
    """Why ``evidence_id`` is not in the fused top 10 of ``q``, from the index itself: the
    unit's points in the generation counted without and with the purpose and constraints."""

    def match(*, purpose: bool, constraints: EvidenceConstraints | None = None) -> Match:
        context = EvidenceSearchContext(constraints=constraints or EvidenceConstraints())
        m = build_match(searcher.workspace_id, revision, generation, q.purpose, context)
        if not purpose:
            del m["purposes"]
        return {**m, "evidence_id": evidence_id}

    try:
        index = searcher.index()
        dim = searcher.embedder.dim
        probe = [1 / math.sqrt(dim)] * dim  # any vector: the filter alone decides what comes back
        found = index.dense_search(probe, match=match(purpose=False), limit=1)
        if not found:
            return NotPublished()
        payload = found[0].payload
        if not index.count(match(purpose=True)):
            return PurposeFiltered(purposes=tuple(payload.get("purposes", ())),
                                   purpose=q.purpose)
        given = q.context.constraints
        if not given.is_empty() and not index.count(match(purpose=True, constraints=given)):
            excluding: dict[str, tuple[str, ...]] = {}
            for name in _CONSTRAINT_FIELDS:  # which of them, each alone, leaves no point
                values = getattr(given, name)
                alone = EvidenceConstraints.model_validate({name: values})
                if values and not index.count(match(purpose=True, constraints=alone)):
                    excluding[name] = tuple(str(v) for v in values)
            unit = {name: tuple(str(v) for v in _as_list(payload.get(_CONSTRAINT_FIELDS[name])))
                    for name in excluding}
            return ConstraintFiltered(constraint=excluding, unit=unit)
    except EvidenceError as exc:  # a fault is never reported as a reason
        raise EvidenceError(f"cannot explain a miss of {q.id}: {exc}",
                            code=f"{ErrorCode.evaluation_unavailable}_{exc.code}") from exc
    if ranks.dense is None and ranks.bm25 is None:
        return NotRetrieved()
    return RankedLow(dense=ranks.dense, bm25=ranks.bm25, fused=ranks.fused)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _query(searcher: EvidenceSearcher, q: EvalQuery, generation: int | None,
           ) -> tuple[dict[str, dict[str, int]], EvidenceSearchOutcome]:
    """The ranks of every unit found by each branch, and the fused outcome."""
    ranks_by_mode: dict[str, dict[str, int]] = {}
    outcome: EvidenceSearchOutcome | None = None
    for mode in MODES:
        outcome = searcher.search(q.text, q.purpose, q.context, limit=RANK_DEPTH,
                                  generation=generation, mode=mode)
        if not outcome.available:
            raise _unavailable(outcome)
        ranks_by_mode[mode] = _ranks(outcome)
    assert outcome is not None
    return ranks_by_mode, outcome


def evaluate(searcher: EvidenceSearcher, evalset: EvaluationSet, *, unit_kinds: dict[str, str],
             generation: int | None = None,
             progress: Callable[[int, int], None] | None = None) -> EvaluationReport:
    """Evaluate ``generation`` (default: the active one); raises ``evaluation_unavailable_<reason>``
    when the search is unavailable (a fault is never scored as a miss). ``progress`` hears
    ``(queries done, queries)``."""
    rows: list[QueryResult] = []
    gen_number: int | None = None
    revision: str | None = None
    missed_kinds: set[str] = set()
    empty: list[str] = []
    for q in evalset.queries:
        if progress is not None:
            progress(len(rows), len(evalset.queries))
        ranks_by_mode, fused_outcome = _query(searcher, q, generation)
        gen_number, revision = fused_outcome.generation, fused_outcome.revision
        if not fused_outcome.results:
            empty.append(q.id)
        fused = ranks_by_mode["fused"]
        ranks = {eid: Ranks(**{m: ranks_by_mode[m].get(eid) for m in MODES})
                 for eid in q.expected}
        best = min((fused[e] for e in q.expected if e in fused), default=None)
        h10 = best is not None and best <= GATE_K
        if not h10:
            missed_kinds.update(unit_kinds.get(e, "unknown") for e in q.expected)
        assert gen_number is not None and revision is not None
        misses = {eid: explain_miss(searcher, q, eid, ranks[eid], generation=gen_number,
                                    revision=revision)
                  for eid in q.expected if fused.get(eid, GATE_K + 1) > GATE_K}
        rows.append(QueryResult(id=q.id, profile=q.profile, purpose=q.purpose,
                                expected=q.expected, hit_at_5=best is not None and best <= 5,
                                hit_at_10=h10, ranks=ranks, misses=misses))
    if progress is not None:
        progress(len(rows), len(evalset.queries))
    hit10 = sum(r.hit_at_10 for r in rows)
    summary = EvaluationSummary(
        queries=len(rows), hit_at_5=sum(r.hit_at_5 for r in rows), hit_at_10=hit10,
        gate_passed=hit10 == len(rows), missed_kinds=tuple(sorted(missed_kinds)),
        empty_queries=tuple(empty))
    assert gen_number is not None and revision is not None
    gen = searcher.registry.get_generation(searcher.workspace_id, gen_number)
    fusion = searcher.fusion
    blended = fusion.method in ("convex", "adaptive")
    adaptive = fusion.method == "adaptive"
    config = SearchConfig(fusion=fusion.method, rrf_k=searcher.rrf_k,
                          rrf_weights=searcher.rrf_weights,
                          dense_weight=fusion.dense_weight if blended else None,
                          weak_dense_weight=fusion.weak_dense_weight if adaptive else None,
                          bm25_strength=fusion.bm25_strength if adaptive else None,
                          prefetch_limit=searcher.prefetch_limit,
                          embedder=searcher.embedder.model_id, bm25_language=searcher.language,
                          bm25=generation_bm25(gen, searcher.language).as_dict()
                          if gen is not None else None,
                          rank_depth=RANK_DEPTH,
                          gate=f"every query: an expected unit in fused top {GATE_K}")
    return EvaluationReport(revision=revision, generation=gen_number, search_config=config,
                            queries=tuple(rows), summary=summary)


def revision_evidence_dir(ws: Workspace, revision: str) -> Path:
    """The evidence directory of ``revision`` as committed (materialized under the state
    directory from Git when it is not there yet)."""
    try:
        tree = materialize_revision(ws.root, revision, ws.state_dir / "revisions" / revision)
    except OSError as exc:  # e.g. a full disk; the partial copy was removed
        raise EvidenceError(f"cannot materialize revision {revision[:12]}: "
                            f"{exc.strerror or exc}", code=ErrorCode.materialize_failed,
                            path=str(ws.state_dir / "revisions")) from None
    return tree / ws.config.evidence.root


def unit_kinds(ws: Workspace, evidence_dir: Path) -> dict[str, str]:
    """evidence id → kind of the curated units under ``evidence_dir``; a file whose bytes the
    workspace's unit cache knows (publishing validated that revision) is not parsed again."""
    rels = corpus_files(evidence_dir, ws.config.evidence.patterns)
    loaded, _ = load_units(evidence_dir, rels, shown_prefix=f"{ws.config.evidence.root}/",
                           sources=SourceReader(evidence_dir), check=False,
                           cache=UnitCache.in_state_dir(ws.state_dir))
    return {item.unit.id: item.unit.kind.value for item in loaded if item.unit}


def evaluate_generation(ws: Workspace, searcher: EvidenceSearcher, *,
                        generation: int | None = None) -> EvaluationReport:
    """``tht evidence evaluate`` and the nightly asset: evaluate ``generation`` (default: the
    active one) with the evaluation.yaml of the revision it was built from, and compare it
    with the saved baseline.

    Raises ``evaluation_unavailable_<reason>`` when the generation cannot be searched (none active,
    unknown, or not serving the activated revision).
    """
    state = searcher.resolve_generation(generation)
    if isinstance(state, EvidenceSearchOutcome):
        raise _unavailable(state)
    gen, _ = state
    evidence_dir = revision_evidence_dir(ws, gen.revision)
    evalset = read_evaluation(evidence_dir, shown=f"{ws.config.evidence.root}/evaluation.yaml "
                                                  f"at revision {gen.revision[:12]}")
    report = evaluate(searcher, evalset, unit_kinds=unit_kinds(ws, evidence_dir),
                      generation=gen.number)
    return with_baseline(report, baseline_path(ws.state_dir))


@contextlib.contextmanager
def evaluation_index(ws: Workspace, config: IndexConfig) -> Iterator[IndexConfig]:
    """Where an evaluation of the active generation reads (``tht evidence evaluate`` and the
    nightly asset): give the result to the searcher as its ``index_config``.

    On the embedded engine, a private copy of the shard under the state directory, taken while
    the shard is held for a moment (the copy) and removed afterwards: the evaluation's many
    queries (seconds to minutes) never keep searches in other processes waiting on the shard
    (issue 17 item 8). The copy is removed even when the process is told to stop (SIGTERM,
    SIGINT), and swept by the next evaluation when its process was killed outright. A server
    (readers do not lock it), or no shard yet: ``config`` itself, and the searcher answers as
    it always does.
    """
    if config.engine != "edge" or not shard_exists(config.edge_path()):
        yield config
        return
    with evaluation_copy(ws.state_dir) as tmp:  # removed on SIGTERM too; stale ones swept
        copy = tmp / "index"
        with EdgeIndex.open(config.edge_path(), language=ws.config.language,
                            lock_wait_s=config.lock_wait_s) as shard:
            shard.copy_to(copy)
        yield config.model_copy(update={"path": str(copy)})


def baseline_path(state_dir: Path) -> Path:
    return state_dir / "evaluation-baseline.json"


class _BaselineQuery(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    hit_at_10: bool


class _Baseline(BaseModel):
    """What a saved report needs to hold to be compared with (older reports included)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    queries: tuple[_BaselineQuery, ...] = ()


def compare_with_baseline(report: EvaluationReport, baseline_file: Path) -> list[str] | None:
    """Ids of queries that were a top-10 hit in the saved baseline and are not now; ``None``
    when no baseline is saved."""
    if not baseline_file.is_file():
        return None
    try:
        base = _Baseline.model_validate_json(baseline_file.read_bytes())
    except (OSError, ValidationError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not an evaluation report"
        raise EvidenceError(f"cannot read the baseline: {why}", path=str(baseline_file),
                            code=ErrorCode.baseline_unreadable) from None
    before = {q.id for q in base.queries if q.hit_at_10}
    now = {q.id for q in report.queries if q.hit_at_10}
    return sorted(before - now)


def with_baseline(report: EvaluationReport, baseline_file: Path) -> EvaluationReport:
    """``report`` with its regressions against the saved baseline (``None`` when none)."""
    regressions = compare_with_baseline(report, baseline_file)
    return report.model_copy(update={
        "regressions": None if regressions is None else tuple(regressions)})


def save_baseline(report: EvaluationReport, baseline_file: Path) -> None:
    baseline_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = baseline_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(report.model_dump(mode="json"), ensure_ascii=False, indent=2),
                   encoding="utf-8")
    tmp.replace(baseline_file)
