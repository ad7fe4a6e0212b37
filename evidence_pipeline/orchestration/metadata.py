"""Metadata the Dagster UI shows: counts per kind, problems, review items, evaluation tables."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import dagster as dg

from evidence_pipeline.publishing.evaluate import EvaluationReport
from evidence_pipeline.validation.corpus import LoadedUnit
from evidence_pipeline.validation.problems import Problem, Severity, ValidationReport, sort_problems

MAX_ROWS = 100


def _cell(value: Any) -> str:
    text = "–" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (cells escaped, at most :data:`MAX_ROWS` rows)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = list(rows)
    for row in rows[:MAX_ROWS]:
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    if len(rows) > MAX_ROWS:
        lines.append(f"\n… and {len(rows) - MAX_ROWS} more")
    return "\n".join(lines)


def kind_counts(loaded: Iterable[LoadedUnit]) -> dict[str, int]:
    counts = Counter(item.unit.kind.value for item in loaded if item.unit is not None)
    return dict(sorted(counts.items()))


def problems_table(problems: Sequence[Problem]) -> str:
    return table(("severity", "code", "path", "unit", "field", "message"),
                 ((p.severity.value, p.code, p.path, p.evidence_id, p.field, p.message)
                  for p in sort_problems(problems)))


def corpus_metadata(report: ValidationReport, loaded: Sequence[LoadedUnit]
                    ) -> dict[str, Any]:
    """Status, units per kind, errors and review items of a validated corpus."""
    errors = sum(p.severity is Severity.error for p in report.problems)
    per_kind = kind_counts(loaded)
    out: dict[str, Any] = {
        "status": report.status.value,
        "units": dg.MetadataValue.int(report.units),
        "errors": dg.MetadataValue.int(errors),
        "review_items": dg.MetadataValue.int(len(report.problems) - errors),
        "units_per_kind": dg.MetadataValue.md(table(("kind", "units"), per_kind.items())),
    }
    for kind, n in per_kind.items():
        out[f"units/{kind}"] = dg.MetadataValue.int(n)
    if report.problems:
        out["problems"] = dg.MetadataValue.md(problems_table(report.problems))
    return out


def evaluation_table(report: EvaluationReport) -> str:
    """One row per expected unit: the query's hits, the unit's dense, BM25 and fused rank, and
    why it is not in the fused top 10."""
    rows = []
    for q in report.queries:
        for i, (eid, ranks) in enumerate(q.ranks.items()):
            first = i == 0
            miss = q.misses.get(eid)
            rows.append((q.id if first else "", q.profile.value if first else "",
                         q.purpose.value if first else "",
                         ("✓" if q.hit_at_5 else "✗") if first else "",
                         ("✓" if q.hit_at_10 else "✗") if first else "",
                         eid, ranks.dense, ranks.bm25, ranks.fused,
                         miss.reason if miss else ""))
    return table(("query", "profile", "purpose", "@5", "@10", "expected", "dense", "bm25",
                  "fused", "missed because"), rows)


def misses_table(report: EvaluationReport) -> str:
    """One row per expected unit outside the fused top 10: query, unit, reason and details."""
    return table(("query", "expected", "reason", "details"),
                 ((qid, eid, miss.reason, miss.describe())
                  for qid, eid, miss in report.misses()))


def misses_metadata(report: EvaluationReport) -> dict[str, Any]:
    """The misses of a report, as a table and as the JSON of ``preprocess evidence --json``."""
    doc = report.summary_with_misses()["misses"]
    return {"misses": dg.MetadataValue.md(misses_table(report)),
            "misses_json": dg.MetadataValue.json(doc)}


def regressions_text(report: EvaluationReport) -> str:
    """The queries that regressed against the saved baseline, ``none``, or that none is saved."""
    if report.regressions is None:
        return "no baseline saved"
    return ", ".join(report.regressions) or "none"


def evaluation_metadata(report: EvaluationReport) -> dict[str, Any]:
    """hit@5/hit@10, the gate, generation and revision, and the per-branch rank table."""
    s = report.summary
    return {
        "generation": dg.MetadataValue.int(report.generation),
        "revision": report.revision,
        "queries": dg.MetadataValue.int(s.queries),
        "hit@5": dg.MetadataValue.int(s.hit_at_5),
        "hit@10": dg.MetadataValue.int(s.hit_at_10),
        "gate_passed": dg.MetadataValue.bool(s.gate_passed),
        "missed_kinds": ", ".join(s.missed_kinds) or "none",
        "empty_queries": ", ".join(s.empty_queries) or "none",
        "evaluation": dg.MetadataValue.md(evaluation_table(report)),
        "report": dg.MetadataValue.json(report.model_dump(mode="json")),
        "regressions": regressions_text(report),
    }
