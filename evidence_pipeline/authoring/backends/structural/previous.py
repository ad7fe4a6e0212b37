"""Ids of previous units, minimal change and retirement; the reply's unit objects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evidence_pipeline.authoring.backends.base import ModelRequest
from evidence_pipeline.authoring.backends.structural.draft import Draft, K, key
from evidence_pipeline.authoring.backends.structural.purposes import (
    lists_values,
    names_schema,
    policy_purposes,
)
from evidence_pipeline.authoring.backends.structural.text import add
from evidence_pipeline.formats.normalize import canonical, excerpt_in_source


def match_previous(drafts: list[Draft], request: ModelRequest
                   ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Ids and minimal change against the previous units of the source.

    A previous unit whose excerpts are all still in the note is kept exactly as it is (a
    curator's corrections included); a piece whose excerpts all lie inside kept units adds
    nothing and is dropped. A piece overlapping one previous unit replaces it under its id (the
    unit's text changed or grew, possibly with another kind). Other pieces take the id of a
    vanished unit with the same key or title, or are new. What is left vanished is proposed
    for retirement.
    """
    text = request.normalized_text
    haystack = canonical(text)
    previous = list(request.previous_units)
    excerpts = {u.id: _prev_excerpts(u) for u in previous}
    supported = {u.id for u in previous if excerpts[u.id] and all(
        excerpt_in_source(e, text) for e in _prev_excerpts(u, raw=True))}
    old = canonical(request.previous_text) if request.previous_text is not None else None
    claimed: dict[int, str] = {}
    dropped: set[int] = set()
    overlaps: dict[int, list[str]] = {}
    for n, draft in enumerate(drafts):
        mine = [canonical(e) for e in draft.excerpts]
        over = [u.id for u in previous
                if any(_overlap(a, b) for a in excerpts[u.id] for b in mine)]
        kept = [uid for uid in over if uid in supported]
        if old is not None and previous and len(kept) == len(over) and all(
                canonical(t) in old for t in draft.texts):
            dropped.add(n)  # unchanged text: the previous units stand for it as they are
        elif kept and all(any(b in a for uid in kept for a in excerpts[uid]) for b in mine):
            dropped.add(n)
        elif len(over) == 1 and over[0] not in claimed.values():
            claimed[n] = over[0]
        elif over:
            overlaps[n] = over
    # pieces overlapping several previous units keep the id of the most similar one
    for n, over in overlaps.items():
        free = [uid for uid in over if uid not in claimed.values()]
        best = _most_similar(drafts[n], [u for u in previous if u.id in free])
        if best is not None:
            claimed[n] = best
        rest = [uid for uid in over
                if uid != best and uid in supported and uid not in claimed.values()]
        if rest:
            drafts[n].flag("structural_overlaps_previous_unit", "This part of the note is also "
                           f"quoted by {', '.join(rest)}, kept from before: check that the units "
                           "do not repeat each other.", None)
    # the others: a vanished unit with the same key, first excerpt or title
    vanished = [u for u in previous if u.id not in supported]
    for same in (_same_key, _same_first_excerpt, _same_title):
        for n, draft in enumerate(drafts):
            if n in claimed or n in dropped:
                continue
            for unit in vanished:
                if unit.id not in claimed.values() and same(draft, unit):
                    claimed[n] = unit.id
                    break
    placed: list[tuple[int, int, dict[str, Any]]] = []
    for n, draft in enumerate(drafts):
        if n not in dropped:
            placed.append((_position(haystack, draft.excerpts), n, unit_dict(draft,
                                                                            claimed.get(n))))
    taken = set(claimed.values())
    for k, unit in enumerate(previous):
        if unit.id in supported and unit.id not in taken:
            first = _prev_excerpts(unit, raw=True)
            placed.append((_position(haystack, first), len(drafts) + k, _kept(unit)))
            taken.add(unit.id)
    retire = [
        {"id": u.id, "message": "The source no longer supports this unit: its excerpts are no "
         "longer in the note and no part of the note has its key or its title."}
        for u in previous if u.id not in taken]
    return [unit for _, _, unit in sorted(placed, key=lambda x: (x[0], x[1]))], retire


def _prev_excerpts(unit: Any, *, raw: bool = False) -> list[str]:
    prov = unit.data.get("provenance")
    ex = prov.get("supporting_excerpts") if isinstance(prov, dict) else None
    values = [e for e in ex if isinstance(e, str)] if isinstance(ex, list) else []
    return values if raw else [canonical(e) for e in values]


def _overlap(a: str, b: str) -> bool:
    return min(len(a), len(b)) >= 12 and (a in b or b in a)


def _position(haystack: str, excerpts: Sequence[str]) -> int:
    at = haystack.find(canonical(excerpts[0])) if excerpts else -1
    return at if at >= 0 else len(haystack)


def _prev_kind(unit: Any) -> str:
    return str(unit.data.get("kind", ""))


def _same_key(draft: Draft, unit: Any) -> bool:
    kind = _prev_kind(unit)
    return kind == draft.kind.value and draft.key != "" and \
        key(kind, unit.data.get(kind)) == draft.key


def _same_first_excerpt(draft: Draft, unit: Any) -> bool:
    prev = _prev_excerpts(unit)
    return bool(prev) and bool(draft.excerpts) and prev[0] == canonical(draft.excerpts[0])


def _same_title(draft: Draft, unit: Any) -> bool:
    return _prev_kind(unit) == draft.kind.value and \
        canonical(str(unit.data.get("title", ""))).casefold() == canonical(draft.title).casefold()


def _most_similar(draft: Draft, units: list[Any]) -> str | None:
    for same in (_same_key, _same_first_excerpt, _same_title):
        for unit in units:
            if same(draft, unit):
                return unit.id
    same_kind = [u for u in units if _prev_kind(u) == draft.kind.value]
    return same_kind[0].id if same_kind else None


def _kept(unit: Any) -> dict[str, Any]:
    """A previous unit exactly as it is: its source text is still there."""
    data = unit.data
    kind = str(data.get("kind"))
    out: dict[str, Any] = {"id": unit.id}
    for name in ("title", "kind", "purposes", "applies_to", kind):
        if name in data:
            out[name] = data[name]
    out["supporting_excerpts"] = _prev_excerpts(unit, raw=True)
    out["review_items"] = data.get("review_items") or []
    out["body"] = _strip_title(unit.body, str(data.get("title", "")))
    return out


def _strip_title(body: str, title: str) -> str:
    lines = body.strip("\n").split("\n")
    if lines and lines[0].strip() == f"# {title}".strip():
        lines = lines[1:]
    return "\n".join(lines).strip("\n")


def unit_dict(draft: Draft, uid: str | None) -> dict[str, Any]:
    """The reply object of one draft (with its previous id, if it has one)."""
    block = dict(draft.block)
    if draft.kind is K.domain:
        block = {k: v for k, v in block.items() if v or k == "rule"}
    if draft.kind is K.glossary and not block.get("synonyms"):
        block.pop("synonyms", None)
    concepts: list[str] = []
    for c in draft.concepts:
        add(concepts, c)
    out: dict[str, Any] = {
        "title": draft.title,
        "kind": draft.kind.value,
        "purposes": [p.value for p in policy_purposes(
            draft.kind, names_schema=names_schema(draft.tables, draft.columns, block)
            or lists_values(draft.body))],
        "applies_to": {"concepts": concepts, "tables": list(draft.tables),
                       "columns": list(draft.columns)},
        draft.kind.value: block,
        "supporting_excerpts": list(draft.excerpts),
        "review_items": list(draft.review),
        "body": draft.body,
    }
    if uid is not None:
        out = {"id": uid, **out}
    return out
