"""What the Dagster catalog shows: owners, tags, the code version and data versions of the
assets, and their metadata (counts per kind, problems, review items, evaluation tables)."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from importlib import metadata, resources
from typing import Any

import dagster as dg
from dagster._core.definitions.data_version import (
    CODE_VERSION_TAG,
    DATA_VERSION_IS_USER_PROVIDED_TAG,
    DATA_VERSION_TAG,
    NULL_EVENT_POINTER,
    get_input_data_version_tag,
    get_input_event_pointer_tag,
)

from evidence_pipeline.formats.manifest import PIPELINE_VERSION
from evidence_pipeline.publishing.activation import GenerationsReport
from evidence_pipeline.publishing.evaluate import EvaluationReport
from evidence_pipeline.validation.corpus import LoadedUnit
from evidence_pipeline.validation.problems import Problem, Severity, ValidationReport, sort_problems

# The assets return their data versions on dg.Output (issue 17: unchanged sources stay green);
# Dagster marks that parameter beta and warns on every output, in every run's log: noise here.
warnings.filterwarnings("ignore", category=dg.BetaWarning,
                        message=r"Parameter `data_version` of initializer `Output\.__init__`")

MAX_ROWS = 100
CURATORS = "team:curators"
OPERATORS = "team:operators"


@cache
def code_version() -> str:
    """The code version of every asset: the package version, then a hash of what decides its
    output beyond the package (the manifest's pipeline_version and the model prompts).

    Without one, Dagster takes the run id, and every run marks everything downstream as
    "upstream code changed"."""
    digest = hashlib.sha256(f"pipeline_version={PIPELINE_VERSION}".encode())
    prompts = resources.files("evidence_pipeline.authoring") / "prompts"
    for name in sorted(p.name for p in prompts.iterdir() if p.name.endswith(".md")):
        digest.update(b"\0" + name.encode() + b"\0" + (prompts / name).read_bytes())
    return f"{metadata.version('thoth-evidence')}+{digest.hexdigest()[:12]}"


def catalog(stage: str, owner: str) -> dict[str, Any]:
    """Owners, tags and code version of an asset of ``stage`` (authoring, publishing,
    monitoring): ``@dg.asset(..., **catalog("authoring", CURATORS))``."""
    return {"owners": [owner], "tags": {"tht/stage": stage}, "code_version": code_version()}


def digest(value: Any) -> str:
    """A data version for ``value``: sha256 of its canonical JSON (str, lists, dicts, numbers)."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                      default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def version_tags(data_version: str, inputs: Mapping[str, str] | None = None, *,
                 pointers: Mapping[str, int] | None = None) -> dict[str, str]:
    """The tags that give a materialization logged with ``context.log_event`` its data version,
    code version and inputs' data versions, as ``dg.Output(data_version=...)`` records them for
    the step's own asset: the UI then shows the version and what is stale per partition.

    An input's event pointer is left unset unless ``pointers`` gives its storage id (its
    storage id is not known while the step runs): Dagster then compares the input's data
    versions only. A partitioned input needs its pointer: Dagster compares the partition's
    events after it (``evidence_source``, observed by a sensor, has one)."""
    tags = {DATA_VERSION_TAG: data_version, DATA_VERSION_IS_USER_PROVIDED_TAG: "true",
            CODE_VERSION_TAG: code_version()}
    for key, version in (inputs or {}).items():
        tags[get_input_data_version_tag(dg.AssetKey(key))] = version
        pointer = (pointers or {}).get(key)
        tags[get_input_event_pointer_tag(dg.AssetKey(key))] = (
            NULL_EVENT_POINTER if pointer is None else str(pointer))
    return tags


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


# --- links to the commit and files (THT_COMMIT_URL, THT_FILE_URL) --------------------------------

COMMIT_URL_ENV = "THT_COMMIT_URL"  # e.g. https://git.example.org/team/ws/-/commit/{commit}
FILE_URL_ENV = "THT_FILE_URL"  # e.g. https://git.example.org/team/ws/-/blob/{commit}/{path}


def _link(env: str, **values: str) -> dg.MetadataValue | None:
    template = os.environ.get(env, "").strip()
    if not template:
        return None
    try:
        return dg.MetadataValue.url(template.format(**values))
    except (KeyError, IndexError, ValueError):
        warnings.warn(f"{env} must use only {{{'}, {'.join(values)}}}: {template!r}",
                      stacklevel=2)
        return None


def commit_links(commit: str | None) -> dict[str, Any]:
    """``commit`` (the id) and, when ``THT_COMMIT_URL`` is a template, ``commit_url``."""
    if not commit:
        return {}
    out: dict[str, Any] = {"commit": commit}
    url = _link(COMMIT_URL_ENV, commit=commit)
    if url is not None:
        out["commit_url"] = url
    return out


def file_link(commit: str | None, path: str) -> dict[str, Any]:
    """``file_url`` for the repository path ``path`` at ``commit`` (``THT_FILE_URL``)."""
    url = _link(FILE_URL_ENV, commit=commit, path=path) if commit else None
    return {"file_url": url} if url is not None else {}


def source_links(ws: Any, commit: str | None, key: str) -> dict[str, Any]:
    """The commit and the note's file links of a source partition ``key``."""
    rel = (ws.evidence_dir.relative_to(ws.root) / key).as_posix()
    return {**commit_links(commit), "path": rel, **file_link(commit, rel)}


# --- generations: what serves, what one can roll back to -----------------------------------------


def generations_metadata(report: GenerationsReport) -> dict[str, Any]:
    """The generations of the workspace (newest first) as the UI shows them beside
    ``active_generation``: the rows ``tht workspace generations`` lists (``list_generations``),
    with whether the ``rollback`` job can make each active again; ``rollback_targets`` lists
    those."""
    rows = []
    for g in report.generations:
        state = "active (serving)" if g.state == "serving" else g.state
        hit = f"{g.hit_at_10}/{g.queries}" if g.hit_at_10 is not None and g.queries else None
        rows.append((g.number, g.revision[:12], state, g.created_at, g.activated_at, hit,
                     "yes" if g.rollback else "no"))
    out: dict[str, Any] = {
        "generations": dg.MetadataValue.md(table(
            ("generation", "revision", "status", "created", "activated", "hit@10",
             "rollback target"), rows)),
        "rollback_targets": ", ".join(str(g.number) for g in report.rollback_targets) or "none"}
    if report.active_generation is not None:
        out["active_generation"] = dg.MetadataValue.int(report.active_generation)
    return out
