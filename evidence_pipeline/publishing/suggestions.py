"""A fix for each miss of an evaluation, as the curator would write it (issue 26 item 5).

- ``purpose_filtered``: add the query's purpose to the unit's ``purposes``;
- ``ranked_low`` / ``not_retrieved``: the question's content words that the unit never uses
  (compared by BM25 stem, :mod:`.content_words`) become concepts of the unit
  (``applies_to.concepts``: they enter every fragment's header, so both branches see them); a
  glossary unit naming them as synonyms is the other way, said in the text;
- no suggestion where the unit already uses every content word of the question (a ranking
  matter, no curator edit) or the reason is ``not_published`` / ``constraint_filtered`` (the
  question, not the unit, is to be looked at).

:func:`suggest` computes them from the misses of an evaluation report and the units of the
evaluated revision; :func:`render_patch` writes them as one unified diff of the curated files, to be
reviewed and applied with ``git apply`` (never applied here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from evidence_pipeline.formats.curated_writer import dump_curated
from evidence_pipeline.formats.evalset import EvaluationSet
from evidence_pipeline.formats.filediff import unified_diff
from evidence_pipeline.formats.fragments import build_fragments
from evidence_pipeline.publishing.content_words import ContentWords
from evidence_pipeline.publishing.evaluate import Miss
from evidence_runtime.curated import CuratedDocument, parse_curated
from evidence_runtime.units import UnitBase

Field = Literal["purposes", "applies_to.concepts"]
_WHOLE_UNIT = 10**9  # one fragment per piece run: the words the search sees, never too large


class Suggestion(BaseModel):
    """One fix: add ``values`` to ``field`` of the unit in ``path`` (relative to the workspace
    root); ``text`` says it in words."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query: str
    evidence_id: str
    reason: str
    field: Field
    values: tuple[str, ...]
    path: str
    text: str


@dataclass(frozen=True)
class CuratedUnit:
    """A curated unit of the evaluated revision: its file (relative to the workspace root),
    its document as read and the unit."""

    path: str
    text: str  # the file as read
    doc: CuratedDocument
    unit: UnitBase


def suggest_one(question: str, miss: Miss, unit: CuratedUnit, words: ContentWords, *,
                query: str) -> Suggestion | None:
    """The fix of one miss of ``unit`` for ``question``, or None when there is no edit of the
    unit to suggest."""
    eid = unit.unit.id
    if miss.reason == "purpose_filtered":
        purpose = miss.purpose.value  # type: ignore[union-attr]
        return Suggestion(query=query, evidence_id=eid, reason=miss.reason, field="purposes",
                          values=(purpose,), path=unit.path,
                          text=f"add purpose {purpose} to {eid}")
    if miss.reason not in ("ranked_low", "not_retrieved"):
        return None
    seen = "\n".join(f.text for f in build_fragments(unit.unit, unit.doc.body, _WHOLE_UNIT))
    absent = words.absent(question, seen)
    if not absent:
        return None
    quoted = ", ".join(f'"{w}"' for w in absent)
    return Suggestion(query=query, evidence_id=eid, reason=miss.reason,
                      field="applies_to.concepts", values=tuple(absent), path=unit.path,
                      text=f"add {quoted} as concepts of {eid} (or a glossary unit naming "
                           f"them as synonyms of its terms): the question uses them, the "
                           f"unit never does")


def suggest(misses: Iterable[tuple[str, str, Miss]], evalset: EvaluationSet,
            units: Mapping[str, CuratedUnit], words: ContentWords) -> list[Suggestion]:
    """A suggestion for each miss (query id, evidence id, why: ``EvaluationReport.misses()``)
    that an edit of its unit can fix, in the misses' order."""
    texts = {q.id: q.text for q in evalset.queries}
    out: list[Suggestion] = []
    for qid, eid, miss in misses:
        unit = units.get(eid)
        if unit is None or qid not in texts:
            continue
        found = suggest_one(texts[qid], miss, unit, words, query=qid)
        if found is not None:
            out.append(found)
    return out


def apply_to_document(doc: CuratedDocument, suggestions: Sequence[Suggestion]
                      ) -> CuratedDocument:
    """``doc`` with every suggestion's values added (each once, after the existing ones; the
    rest of the file byte for byte)."""
    front = parse_curated(dump_curated(doc), path=doc.path).front  # a private copy
    for s in suggestions:
        if s.field == "purposes":
            target = _seq(front, "purposes")
        else:
            applies = front.get("applies_to")
            if applies is None:
                applies = front["applies_to"] = CommentedMap()
            target = _seq(applies, "concepts")
        have = {str(v).casefold() for v in target}
        for value in s.values:
            if value.casefold() not in have:
                target.append(value)
                have.add(value.casefold())
    return CuratedDocument(front=front, body=doc.body, path=doc.path)


def _seq(mapping: Any, key: str) -> Any:
    value = mapping.get(key)
    if value is None:
        value = mapping[key] = CommentedSeq()
    return value


def render_patch(suggestions: Sequence[Suggestion], units: Mapping[str, CuratedUnit]) -> str:
    """One unified diff (``git apply`` format) of every curated file the suggestions change;
    empty when none does."""
    by_unit: dict[str, list[Suggestion]] = {}
    for s in suggestions:
        by_unit.setdefault(s.evidence_id, []).append(s)
    chunks: list[str] = []
    for eid in sorted(by_unit, key=lambda e: units[e].path):
        unit = units[eid]
        before = unit.text
        after = dump_curated(apply_to_document(unit.doc, by_unit[eid]))
        if after == before:
            continue
        chunks.append(unified_diff(unit.path, before.encode("utf-8"), after.encode("utf-8")))
    return "".join(chunks)
