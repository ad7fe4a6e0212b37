"""What a reviewer of the pending change looks at, gathered from the workspace.

The pending change is the work tree's ``evidence/`` against a base revision (default ``HEAD``):
what ``prepare``, ``resolve`` or a curator's edit left uncommitted (or, with ``--base``, what
a branch changed since). Nothing here writes the tree, the registry or the index: the scratch
evaluation publishes both corpora into a temporary registry and embedded shard that are removed
afterwards. Only the vector cache is shared with publishing (its vectors are keyed by model and
text, so the next publication of the change embeds nothing again).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evidence_pipeline.formats.evalset import EvaluationSet, read_evaluation
from evidence_pipeline.formats.filediff import unified_diff
from evidence_pipeline.formats.normalize import excerpt_span
from evidence_pipeline.gitrepo import ignored_paths, resolve_revision
from evidence_pipeline.publishing.candidate import build_candidate
from evidence_pipeline.publishing.evaluate import (
    EvaluationReport,
    evaluate,
    revision_evidence_dir,
)
from evidence_pipeline.publishing.gate import CachedQueries
from evidence_pipeline.publishing.guard import open_registry
from evidence_pipeline.publishing.intake import cut_fragments, embed_fragments, open_target_index
from evidence_pipeline.validation.corpus import LoadedUnit, SourceReader, corpus_files
from evidence_pipeline.validation.problems import ValidationReport
from evidence_pipeline.validation.validator import validate_corpus
from evidence_runtime.embeddings import Embedder
from evidence_runtime.errors import EvidenceError
from evidence_runtime.search import EvidenceSearcher
from evidence_runtime.workspace import Workspace, load_workspace

PENDING = "work tree"  # the label of the pending side in the scratch registry


@dataclass
class ReviewItemView:
    code: str
    message: str
    field: str | None


@dataclass
class FieldView:
    """One front-matter field (dotted for a kind block's keys) and the review items naming it."""

    name: str
    value: str
    items: list[ReviewItemView] = field(default_factory=list)


@dataclass
class Segment:
    """A run of the source note: plain, or the ``excerpt``-th supporting excerpt."""

    text: str
    excerpt: int | None = None


@dataclass
class ExcerptView:
    text: str
    found: bool


@dataclass
class UnitView:
    """A proposed or changed (or removed) unit beside its source note."""

    evidence_id: str
    status: str  # new | changed | removed
    curated_path: str  # relative to the workspace root
    kind: str
    title: str
    fields: list[FieldView]
    loose_items: list[ReviewItemView]  # review items naming no shown field
    body: str
    source_file: str | None
    source: list[Segment]
    excerpts: list[ExcerptView]
    diff: str
    problems: list[str]


@dataclass
class RankMove:
    """An evaluation question whose fused rank of an expected unit the change moves."""

    query: str
    text: str
    purpose: str
    evidence_id: str
    before: int | None
    after: int | None

    @property
    def better(self) -> bool:
        return (self.after or 10**6) < (self.before or 10**6)


@dataclass
class ScratchEvaluation:
    queries: int
    hit_at_10_before: int
    hit_at_10_after: int
    moves: list[RankMove]
    embedded: int  # fragments embedded anew (not in the vector cache)


@dataclass
class Review:
    root: str
    base: str
    units: list[UnitView]
    other_files: list[tuple[str, str]]  # (path, diff) of changed files that are not units
    status: str  # the pending corpus: publishable | blocked | invalid
    problems: list[str]
    evaluation: ScratchEvaluation | None
    evaluation_error: str | None

    @property
    def diff(self) -> str:
        return "".join(u.diff for u in self.units) + "".join(d for _, d in self.other_files)


# --- the files of the change -----------------------------------------------------------------


def _files(evidence_dir: Path, skip: set[str]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    if not evidence_dir.is_dir():
        return out
    for path in sorted(evidence_dir.rglob("*")):
        rel = path.relative_to(evidence_dir).as_posix()
        if path.is_file() and not path.is_symlink() and rel not in skip:
            out[rel] = path.read_bytes()
    return out


# --- units -----------------------------------------------------------------------------------


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ", ".join(value) if value else "—"
    if isinstance(value, list):
        rows = []
        for v in value:
            if isinstance(v, dict):
                rows.append(" · ".join(f"{k}: {_shown(x)}" for k, x in v.items()))
            else:
                rows.append(_shown(v))
        return "\n".join(rows) if rows else "—"
    if isinstance(value, dict):
        return "\n".join(f"{k}: {_shown(v)}" for k, v in value.items()) or "—"
    return "—" if value is None else str(value)


HIDDEN = ("review_items", "provenance")  # shown apart: beside their fields, beside the source


def fields_of(data: Mapping[str, Any], items: list[ReviewItemView],
              ) -> tuple[list[FieldView], list[ReviewItemView]]:
    """The unit's fields (a kind block by its keys: ``enum.values``) with the review items
    whose ``field`` names them (or a part of them: ``enum.values[2]``), and the items that
    name no shown field."""
    fields: list[FieldView] = []
    for key, value in data.items():
        if key in HIDDEN:
            continue
        if isinstance(value, dict) and value:
            fields.extend(FieldView(f"{key}.{k}", _shown(v)) for k, v in value.items())
        else:
            fields.append(FieldView(str(key), _shown(value)))
    loose: list[ReviewItemView] = []
    for item in items:
        target = None
        if item.field:
            best = [f for f in fields if item.field == f.name
                    or item.field.startswith((f"{f.name}.", f"{f.name}["))]
            target = max(best, key=lambda f: len(f.name), default=None)
            if target is None:  # a block named whole: its first key
                target = next((f for f in fields if f.name.startswith(f"{item.field}.")), None)
        if target is None:
            loose.append(item)
        else:
            target.items.append(item)
    return fields, loose


def source_segments(text: str, excerpts: list[str]) -> tuple[list[Segment], list[ExcerptView]]:
    """The normalized source cut where each supporting excerpt stands (the excerpts the
    validator finds); an overlapping later excerpt is listed but not marked twice."""
    spans: list[tuple[int, int, int]] = []
    views: list[ExcerptView] = []
    for i, excerpt in enumerate(excerpts):
        span = excerpt_span(excerpt, text)
        views.append(ExcerptView(excerpt, span is not None))
        if span is not None:
            spans.append((span[0], span[1], i))
    segments: list[Segment] = []
    at = 0
    for start, end, i in sorted(spans):
        if start < at:
            continue
        if start > at:
            segments.append(Segment(text[at:start]))
        segments.append(Segment(text[start:end], i))
        at = end
    if at < len(text):
        segments.append(Segment(text[at:]))
    return segments, views


def _unit_view(ws: Workspace, evidence_dir: Path, rel: str, item: LoadedUnit | None,
               status: str, diff: str, problems: list[str]) -> UnitView:
    root = ws.config.evidence.root
    doc = item.doc if item else None
    data: dict[str, Any] = doc.data() if doc is not None else {}
    raw_items = data.get("review_items") or []
    items = [ReviewItemView(str(i.get("code", "")), str(i.get("message", "")),
                            str(i["field"]) if i.get("field") else None)
             for i in raw_items if isinstance(i, dict)]
    fields, loose = fields_of(data, items)
    prov = data.get("provenance") if isinstance(data.get("provenance"), dict) else {}
    assert isinstance(prov, dict)
    source_file = prov.get("source_file")
    excerpts = [str(e) for e in prov.get("supporting_excerpts") or []]
    segments: list[Segment] = []
    views = [ExcerptView(e, False) for e in excerpts]
    if isinstance(source_file, str):
        # the note as the validator reads it (normalized): the excerpts are found in that text
        read = SourceReader(evidence_dir).get(source_file)
        if isinstance(read, str):  # why it cannot be read
            segments = [Segment(f"({read})")]
        else:
            segments, views = source_segments(read[1], excerpts)
    return UnitView(
        evidence_id=str(data.get("id") or (doc.evidence_id if doc else None) or rel),
        status=status, curated_path=f"{root}/{rel}", kind=str(data.get("kind", "")),
        title=str(data.get("title", "")), fields=fields, loose_items=loose,
        body=doc.body if doc is not None else "",
        source_file=f"{root}/{source_file}" if isinstance(source_file, str) else None,
        source=segments, excerpts=views, diff=diff, problems=problems)


# --- the scratch evaluation ------------------------------------------------------------------


@dataclass(frozen=True)
class _ScratchWorkspace(Workspace):
    """The workspace with its state (registry, embedded shard) in a temporary directory."""

    scratch: Path = Path()

    @property
    def state_dir(self) -> Path:
        return self.scratch

    @property
    def registry_url(self) -> str:
        return str(self.scratch / "registry.sqlite3")

    def index_url(self) -> str | None:
        return None


@contextlib.contextmanager
def scratch_workspace(ws: Workspace) -> Iterator[Workspace]:
    """``ws`` with an empty registry and embedded shard of its own, removed on exit: whatever
    thoth.yaml and the environment name (a server, Postgres), nothing is published there."""
    index = ws.config.index.model_copy(update={"engine": "edge", "path": None, "url": None})
    config = ws.config.model_copy(update={"index": index})
    with tempfile.TemporaryDirectory(prefix="tht-review-") as tmp:
        yield _ScratchWorkspace(root=ws.root, config=config, scratch=Path(tmp))


def _fused(report: EvaluationReport) -> dict[tuple[str, str], int | None]:
    return {(q.id, eid): r.fused for q in report.queries for eid, r in q.ranks.items()}


def scratch_evaluation(ws: Workspace, sides: list[tuple[str, list[LoadedUnit]]],
                       evalset: EvaluationSet, *, embedder: Embedder | None = None,
                       ) -> tuple[list[EvaluationReport], int]:
    """Publish each (revision label, units) into a scratch registry and shard and evaluate
    it with ``evalset``: one report per side, and how many fragments were embedded anew."""
    embedded = 0
    reports: list[EvaluationReport] = []
    with scratch_workspace(ws) as sws:
        wid = sws.config.workspace_id
        registry = open_registry(sws)
        emb = embedder
        index = None
        try:
            for revision, loaded in sides:
                frags = cut_fragments(ws, loaded)
                # the workspace's own vector cache: a change embeds only its new fragments
                emb, vectors, computed = embed_fragments(ws, frags, emb)
                embedded += computed
                if index is None:
                    index = open_target_index(sws, emb.dim)
                registry.activate_revision(wid, revision)
                cand = build_candidate(sws, registry, index, emb, revision, loaded, frags,
                                       vectors, computed=computed, say=lambda _m: None)
                kinds = {i.unit.id: i.unit.kind.value for i in loaded if i.unit}
                with CachedQueries.open(emb, ws) as queries:
                    searcher = EvidenceSearcher.for_workspace(sws, index=index,
                                                              registry=registry,
                                                              embedder=queries)
                    reports.append(evaluate(searcher, evalset, unit_kinds=kinds,
                                            generation=cand.generation))
        finally:
            if index is not None:
                index.close()
            registry.close()
    return reports, embedded


def rank_moves(before: EvaluationReport, after: EvaluationReport,
               evalset: EvaluationSet) -> list[RankMove]:
    """Every (question, expected unit) whose fused rank differs, biggest moves first."""
    old, new = _fused(before), _fused(after)
    texts = {q.id: q for q in evalset.queries}
    moves = [RankMove(qid, texts[qid].text, texts[qid].purpose.value, eid, old.get((qid, eid)),
                      rank)
             for (qid, eid), rank in new.items() if old.get((qid, eid)) != rank]

    def size(m: RankMove) -> int:
        return abs((m.before or 51) - (m.after or 51))

    return sorted(moves, key=lambda m: (-size(m), m.query, m.evidence_id))


# --- the review ------------------------------------------------------------------------------


def _problem_lines(report: ValidationReport) -> dict[str, list[str]]:
    by_path: dict[str, list[str]] = {}
    for p in report.problems:
        if p.code == "review_item":  # shown beside the field it names
            continue
        by_path.setdefault(p.path or "", []).append(
            f"{p.severity.value}: {p.code}: {p.message}")
    return by_path


def build_review(root: Path | str, *, base: str = "HEAD", scratch_eval: bool = True,
                 embedder: Embedder | None = None,
                 progress: Callable[[str], None] | None = None) -> Review:
    """The review of the work tree's ``evidence/`` against ``base``."""
    say = progress or (lambda _m: None)
    ws = load_workspace(root)
    sha = resolve_revision(ws.root, base)
    evroot = ws.config.evidence.root
    base_dir = revision_evidence_dir(ws, sha)
    ignored = {p.removeprefix(f"{evroot}/") for p in ignored_paths(ws.root, [evroot])}
    old_files, new_files = _files(base_dir, set()), _files(ws.evidence_dir, ignored)
    changed = sorted(p for p in old_files.keys() | new_files.keys()
                     if old_files.get(p) != new_files.get(p))
    say(f"{len(changed)} changed file(s) under {evroot}/ against {sha[:12]}")

    patterns = ws.config.evidence.patterns
    curated_new = set(corpus_files(ws.evidence_dir, patterns))
    curated_old = set(corpus_files(base_dir, patterns))
    report, loaded_new = validate_corpus(ws)
    by_path = {item.rel_path: item for item in loaded_new}
    problems = _problem_lines(report)
    units: list[UnitView] = []
    others: list[tuple[str, str]] = []
    loaded_old: list[LoadedUnit] | None = None
    for rel in changed:
        diff = unified_diff(f"{evroot}/{rel}", old_files.get(rel), new_files.get(rel))
        shown = f"{evroot}/{rel}"
        if rel in curated_new:
            status = "changed" if rel in curated_old else "new"
            units.append(_unit_view(ws, ws.evidence_dir, rel, by_path.get(rel), status, diff,
                                    problems.get(shown, [])))
        elif rel in curated_old:
            if loaded_old is None:
                _, loaded_old = validate_corpus(ws, base_dir)
            old = next((i for i in loaded_old if i.rel_path == rel), None)
            units.append(_unit_view(ws, base_dir, rel, old, "removed", diff, []))
        else:
            others.append((shown, diff))
    unit_paths = {u.curated_path for u in units}
    general = [line for path, lines in problems.items() if path not in unit_paths
               for line in lines]

    evaluation: ScratchEvaluation | None = None
    error: str | None = None
    if scratch_eval and changed:
        say("scratch evaluation: base and work tree published into a temporary registry")
        try:
            evalset = read_evaluation(ws.evidence_dir)
            if loaded_old is None:
                _, loaded_old = validate_corpus(ws, base_dir)
            usable_new = [i for i in loaded_new if i.unit is not None]
            (before, after), embedded = scratch_evaluation(
                ws, [(sha, [i for i in loaded_old if i.unit is not None]),
                     (PENDING, usable_new)], evalset, embedder=embedder)
            evaluation = ScratchEvaluation(
                queries=before.summary.queries, hit_at_10_before=before.summary.hit_at_10,
                hit_at_10_after=after.summary.hit_at_10,
                moves=rank_moves(before, after, evalset), embedded=embedded)
        except EvidenceError as exc:
            error = str(exc)
    return Review(root=str(ws.root), base=sha, units=units, other_files=others,
                  status=report.status.value, problems=general, evaluation=evaluation,
                  evaluation_error=error)


def review_path(ws: Workspace) -> Path:
    """Where ``tht evidence review`` writes the page (the Dagster preview links to it)."""
    return ws.state_dir / "review" / "index.html"
