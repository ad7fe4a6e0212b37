"""``tht evidence evaluate`` (spec §14): the questions of evaluation.yaml against a generation.

Runs the fused search the runtime uses and the dense and BM25 branches alone, records for every
expected unit its rank in each, and decides the gate: every query finds an expected unit in the
fused top 10. Never changes the index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evidence_pipeline.publishing.evalset import EvaluationSet, read_evaluation
from evidence_runtime.errors import EvidenceError
from evidence_runtime.search import EvidenceSearcher, EvidenceSearchOutcome

RANK_DEPTH = 50
GATE_K = 10
MODES = ("dense", "bm25", "fused")


class EvaluationUnavailable(EvidenceError):
    code = "evaluation_unavailable"


@dataclass
class EvaluationReport:
    revision: str
    generation: int
    search_config: dict[str, Any]
    queries: list[dict[str, Any]]
    summary: dict[str, Any]
    regressions: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"revision": self.revision, "generation": self.generation,
               "search_config": self.search_config, "summary": self.summary,
               "queries": self.queries}
        if self.regressions is not None:
            out["regressions"] = self.regressions
        return out

    @property
    def gate_passed(self) -> bool:
        return bool(self.summary["gate_passed"])


def _ranks(outcome: EvidenceSearchOutcome) -> dict[str, int]:
    return {eid: i + 1 for i, eid in enumerate(outcome.evidence_ids)}


def evaluate(searcher: EvidenceSearcher, evalset: EvaluationSet, *, unit_kinds: dict[str, str],
             generation: int | None = None) -> EvaluationReport:
    """Evaluate ``generation`` (default: the active one); raises :class:`EvaluationUnavailable`
    when the search is unavailable (a fault is never scored as a miss)."""
    rows: list[dict[str, Any]] = []
    gen_number: int | None = None
    revision: str | None = None
    missed_kinds: set[str] = set()
    empty: list[str] = []
    hit5 = hit10 = 0
    for q in evalset.queries:
        ranks_by_mode: dict[str, dict[str, int]] = {}
        for mode in MODES:
            outcome = searcher.search(q.text, q.purpose, q.context, limit=RANK_DEPTH,
                                      generation=generation, mode=mode)
            if not outcome.available:
                raise EvaluationUnavailable(
                    f"search unavailable ({outcome.code}): {outcome.message}",
                    code=f"evaluation_unavailable_{outcome.code}")
            gen_number, revision = outcome.generation, outcome.revision
            ranks_by_mode[mode] = _ranks(outcome)
            if mode == "fused" and not outcome.results:
                empty.append(q.id)
        fused = ranks_by_mode["fused"]
        ranks = {eid: {m: ranks_by_mode[m].get(eid) for m in MODES} for eid in q.expected}
        best = min((fused[e] for e in q.expected if e in fused), default=None)
        h5 = best is not None and best <= 5
        h10 = best is not None and best <= GATE_K
        hit5 += h5
        hit10 += h10
        if not h10:
            missed_kinds.update(unit_kinds.get(e, "unknown") for e in q.expected)
        rows.append({"id": q.id, "profile": q.profile.value, "purpose": q.purpose.value,
                     "expected": list(q.expected), "hit_at_5": h5, "hit_at_10": h10,
                     "ranks": ranks})
    summary = {
        "queries": len(rows),
        "hit_at_5": hit5,
        "hit_at_10": hit10,
        "gate_passed": hit10 == len(rows),
        "missed_kinds": sorted(missed_kinds),
        "empty_queries": empty,
    }
    config = {"rrf_k": searcher.rrf_k, "prefetch_limit": searcher.prefetch_limit,
              "embedder": searcher.embedder.model_id, "bm25_language": searcher.language,
              "rank_depth": RANK_DEPTH, "gate": f"every query: an expected unit in fused top "
                                                f"{GATE_K}"}
    assert gen_number is not None and revision is not None
    return EvaluationReport(revision=revision, generation=gen_number, search_config=config,
                            queries=rows, summary=summary)


def load_evalset(evidence_dir: Path) -> EvaluationSet:
    return read_evaluation(evidence_dir)


def baseline_path(state_dir: Path) -> Path:
    return state_dir / "evaluation-baseline.json"


def compare_with_baseline(report: EvaluationReport, baseline_file: Path) -> list[str] | None:
    """Ids of queries that were a top-10 hit in the saved baseline and are not now."""
    if not baseline_file.is_file():
        return None
    try:
        base = json.loads(baseline_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EvidenceError(f"cannot read the baseline: {exc}", path=str(baseline_file),
                            code="baseline_unreadable") from None
    before = {q["id"] for q in base.get("queries", []) if q.get("hit_at_10")}
    now = {q["id"] for q in report.queries if q["hit_at_10"]}
    return sorted(before - now)


def save_baseline(report: EvaluationReport, baseline_file: Path) -> None:
    baseline_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = baseline_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(report.to_json(), ensure_ascii=False, indent=2), encoding="utf-8")
    tmp.replace(baseline_file)
