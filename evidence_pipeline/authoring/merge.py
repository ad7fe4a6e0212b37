"""A changed source's new units merged into the curated ones: three ways, field by field (spec §6).

The previous curated unit is an input and the change proposed is minimal: what a curator changed
in a unit (title, concepts, purposes, enum meanings, body, …) stays, unless the source change
touched the same thing. For each unit the backend proposes under a previous id:

- *base*: what the backend derived from the source as it was — for ``structural`` the derivation
  of the old source text (recomputed from its Git blob, the backend is deterministic), for a
  model backend the proposal recorded when the unit was last written
  (``.tht/last-proposals.json``);
- *ours*: the curated unit as it is in the work tree;
- *theirs*: what the backend derives from the source now.

A field the source change did not touch (theirs = base) keeps the curated value; one the curator
did not touch (ours = base) takes the new one; maps (enum values, …) merge key by key, lists
(concepts, purposes, tables, …) as sets, the body line by line (``git merge-file``). Where both
changed the same thing differently the curated value stays and the unit gets a
``merge_conflict`` review item naming the field and what the source change proposes (blocked
until a curator decides). No base known: the backend's unit is taken as it is (as before).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evidence_pipeline.authoring.backends.base import (
    ModelBackendError,
    ModelRequest,
    ProposedUnit,
)
from evidence_pipeline.formats.normalize import canonical, excerpt_in_source
from evidence_pipeline.gitrepo import GitError, merge_text
from evidence_pipeline.markdown import BlockKind, parse_blocks, split_lines
from evidence_runtime.curated import CuratedDocument
from evidence_runtime.units import MAX_EXCERPTS

MERGE_CONFLICT = "merge_conflict"
LAST_PROPOSALS = "last-proposals.json"
_SHOWN = 160  # characters of a value shown in a conflict's message
_PARTS = 6  # changes listed in a body conflict's message

_MISSING: Any = object()


@dataclass(frozen=True)
class Side:
    """One side of the merge in the reply's form: title, kind, purposes, applies_to, the kind
    block, supporting_excerpts, review_items; the body without its title heading."""

    data: dict[str, Any]
    body: str


@dataclass
class MergeResult:
    data: dict[str, Any]
    body: str
    conflicts: list[dict[str, str]] = field(default_factory=list)  # review items added


def curated_side(doc: CuratedDocument) -> Side:
    """A curated unit as one side of the merge."""
    data = doc.data()
    kind = str(data.get("kind", ""))
    out = {k: data[k] for k in ("title", "kind", "purposes", "applies_to", kind, "review_items")
           if k in data}
    prov = data.get("provenance")
    out["supporting_excerpts"] = list(prov.get("supporting_excerpts") or []) \
        if isinstance(prov, dict) else []
    out.setdefault("review_items", [])
    return Side(out, strip_title(doc.body, str(data.get("title", ""))))


def proposed_side(unit: ProposedUnit | Mapping[str, Any], body: str | None = None) -> Side:
    """A proposed unit (or its recorded data and body) as one side of the merge."""
    if isinstance(unit, ProposedUnit):
        data, text = dict(unit.data), unit.body
    else:
        data, text = dict(unit), body or ""
    data.setdefault("review_items", [])
    return Side(data, strip_title(text, str(data.get("title", ""))))


def strip_title(body: str, title: str) -> str:
    """The body without a first heading equal to the title (what render_body adds)."""
    content = body.strip()
    blocks = parse_blocks(content)
    if blocks and blocks[0].kind is BlockKind.heading \
            and blocks[0].title.strip().casefold() == title.strip().casefold():
        content = "\n".join(split_lines(content)[blocks[0].end:]).strip()
    return content


def merge_unit(base: Side, ours: Side, theirs: Side, *, normalized_text: str) -> MergeResult:
    """Merge one unit; excerpts are kept only where they are still in ``normalized_text``."""
    conflicts: list[tuple[str, str]] = []  # (field, what the source change did to it)
    data: dict[str, Any] = {}
    for name in ("title", "purposes", "applies_to"):
        value = _merge(base.data.get(name, _MISSING), ours.data.get(name, _MISSING),
                       theirs.data.get(name, _MISSING), name, conflicts)
        if value is not _MISSING:
            data[name] = value
    kinds = (str(base.data.get("kind")), str(ours.data.get("kind")),
             str(theirs.data.get("kind")))
    b_block, o_block, t_block = (side.data.get(k) for side, k in zip(
        (base, ours, theirs), kinds, strict=True))
    if kinds[0] == kinds[1] == kinds[2]:
        data["kind"] = kinds[1]
        data[kinds[1]] = _merge(b_block, o_block, t_block, kinds[1], conflicts)
    elif kinds[1] == kinds[0] and o_block == b_block:  # the source change reclassified it
        data["kind"], data[kinds[2]] = kinds[2], t_block
    elif kinds[2] == kinds[0] and t_block == b_block:  # the curator reclassified it
        data["kind"], data[kinds[1]] = kinds[1], o_block
    else:
        data["kind"], data[kinds[1]] = kinds[1], o_block
        if (kinds[2], t_block) != (kinds[1], o_block):
            conflicts.append(("kind", _kind_change(kinds, b_block, t_block)))
    data["supporting_excerpts"] = _merge_excerpts(
        base.data.get("supporting_excerpts") or [], ours.data.get("supporting_excerpts") or [],
        theirs.data.get("supporting_excerpts") or [], normalized_text)
    data["review_items"] = _merge_list(base.data.get("review_items") or [],
                                       ours.data.get("review_items") or [],
                                       theirs.data.get("review_items") or [])
    body, body_conflict = _merge_body(base.body, ours.body, theirs.body)
    items: list[dict[str, str]] = [_conflict_item(*c) for c in conflicts]
    if body_conflict is not None:
        items.append(body_conflict)
    for item in items:
        if item not in data["review_items"]:
            data["review_items"].append(item)
    return MergeResult(data, body, items)


def _merge(base: Any, ours: Any, theirs: Any, path: str,
           conflicts: list[tuple[str, str]]) -> Any:
    if ours == theirs or theirs == base:
        return ours
    if ours == base:
        return theirs
    if isinstance(ours, dict) and isinstance(theirs, dict):
        b = base if isinstance(base, dict) else {}
        out: dict[str, Any] = {}
        for key in [*ours, *(k for k in theirs if k not in ours),
                    *(k for k in b if k not in ours and k not in theirs)]:
            value = _merge(b.get(key, _MISSING), ours.get(key, _MISSING),
                           theirs.get(key, _MISSING), f"{path}.{key}", conflicts)
            if value is not _MISSING:
                out[key] = value
        return out
    if isinstance(ours, list) and isinstance(theirs, list):
        return _merge_list(base if isinstance(base, list) else [], ours, theirs)
    conflicts.append((path, _change(base, theirs)))
    return ours


def _merge_list(base: Sequence[Any], ours: Sequence[Any], theirs: Sequence[Any]) -> list[Any]:
    """A list merged as a set in the curated order: what the source change removed goes, what
    it added comes after the curated items."""
    removed = [x for x in base if x not in theirs]
    out = [x for x in ours if x not in removed]
    out.extend(x for x in theirs if x not in base and x not in out)
    return out


def _merge_excerpts(base: Sequence[str], ours: Sequence[str], theirs: Sequence[str],
                    text: str) -> list[str]:
    """The curated excerpts still in the source less those the source change removed, with
    those it added (a curated excerpt a new one contains gives way to it); at most
    MAX_EXCERPTS, new ones first kept. Curated excerpts as derived: the new ones."""
    if list(ours) == list(base):
        return list(theirs)
    removed = [e for e in base if e not in theirs]
    added = [e for e in theirs if e not in base]
    covered = [canonical(e) for e in added]
    kept = [e for e in ours if excerpt_in_source(e, text) and e not in added
            and e not in removed and not any(canonical(e) in c for c in covered)]
    out = kept[:max(0, MAX_EXCERPTS - len(added))] + added[:MAX_EXCERPTS]
    return out or list(theirs)


def _merge_body(base: str, ours: str, theirs: str) -> tuple[str, dict[str, str] | None]:
    if ours == theirs or theirs == base:
        return ours, None
    if ours == base:
        return theirs, None
    try:
        merged, conflicts = merge_text(_lines(base), _lines(ours), _lines(theirs))
    except GitError:
        conflicts, merged = 1, ours
    if conflicts == 0:
        return merged.strip(), None
    return ours, {"code": MERGE_CONFLICT, "field": "body", "message":
                  "the curated body is kept, but the source change touches the same lines: "
                  f"apply it by hand, then remove this item. {_text_change(base, theirs)}"}


def _lines(text: str) -> str:
    return text.strip() + "\n" if text.strip() else ""


def _text_change(before: str, after: str) -> str:
    """What changed from ``before`` to ``after``, word by word within changed lines, with a
    few words of context (bounded)."""
    old, new = before.splitlines(), after.splitlines()
    parts: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new,
                                                       autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace" and i2 - i1 == j2 - j1:
            for a, b in zip(old[i1:i2], new[j1:j2], strict=True):
                parts.extend(_word_change(a, b))
            continue
        parts.extend(f"removed line {_quote(line)}" for line in old[i1:i2] if line.strip())
        parts.extend(f"added line {_quote(line)}" for line in new[j1:j2] if line.strip())
    if not parts:
        return "The change is in the line breaks."
    shown = parts[:_PARTS]
    more = f" (and {len(parts) - _PARTS} more)" if len(parts) > _PARTS else ""
    return "Source change: " + "; ".join(shown) + more + "."


def _word_change(a: str, b: str) -> list[str]:
    wa, wb = a.split(), b.split()
    out: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, wa, wb,
                                                       autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        context = " ".join(wa[max(0, i1 - 4):i1])
        at = f" after {_quote(context)}" if context else " at the start of a line"
        if tag == "insert":
            out.append(f"added {_quote(' '.join(wb[j1:j2]))}{at}")
        elif tag == "delete":
            out.append(f"removed {_quote(' '.join(wa[i1:i2]))}{at}")
        else:
            out.append(f"{_quote(' '.join(wa[i1:i2]))} became {_quote(' '.join(wb[j1:j2]))}"
                       f"{at}")
    return out


def _quote(text: str) -> str:
    return f"“{_short(text)}”"


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= _SHOWN else text[:_SHOWN - 1] + "…"


def _change(base: Any, theirs: Any) -> str:
    """What the source change did to a value: word by word for texts, else from → to."""
    if isinstance(base, str) and isinstance(theirs, str):
        return _text_change(base, theirs).removeprefix("Source change: ").rstrip(".")

    def shown(v: Any) -> str:
        return "(none)" if v is _MISSING else _quote(v) if isinstance(v, str) else _short(v)

    return f"from {shown(base)} to {shown(theirs)}"


def _kind_change(kinds: tuple[str, str, str], base: Any, theirs: Any) -> str:
    """What the source change did where the curator chose another kind."""
    if kinds[2] != kinds[0]:
        return f"it now makes the unit a {kinds[2]} (was {kinds[0]}): {_short(theirs)}"
    b = base if isinstance(base, dict) else {}
    t = theirs if isinstance(theirs, dict) else {}
    changed = [f"{kinds[0]}.{k}: {_change(b.get(k, _MISSING), t.get(k, _MISSING))}"
               for k in [*t, *(k for k in b if k not in t)]
               if b.get(k, _MISSING) != t.get(k, _MISSING)]
    return f"it changed the {kinds[0]} derived from the note, which the curator made a " \
           f"{kinds[1]} ({'; '.join(changed)})"


def _conflict_item(path: str, change: str) -> dict[str, str]:
    return {"code": MERGE_CONFLICT, "field": path, "message":
            f"the curated value is kept, but the source change also changed {path}: {change}; "
            "decide, then remove this item"}


# --- the base: what the backend derived from the source as it was --------------------------


def structural_bases(request: ModelRequest) -> list[Side]:
    """The structural derivation of the source's previous text, unit by unit (no ids)."""
    from evidence_pipeline.authoring.backends.structural import StructuralBackend

    if request.previous_text is None:
        return []
    old = ModelRequest(source_file=request.source_file, source_sha256=request.source_sha256,
                       normalized_text=request.previous_text, language=request.language,
                       max_chunk_chars=request.max_chunk_chars)
    try:
        reply = StructuralBackend().restructure(old)
    except ModelBackendError:  # no base: the unit as proposed (never a failed prepare)
        return []
    return [proposed_side(u) for u in reply.units]


def match_base(theirs: Side, bases: Sequence[Side]) -> Side | None:
    """The unit of the old derivation the new one comes from: same kind and key, same title,
    else the one sharing most excerpt text."""
    best: tuple[float, int] | None = None
    for n, base in enumerate(bases):
        score = 0.0
        same_kind = base.data.get("kind") == theirs.data.get("kind")
        if same_kind and _key(base) and _key(base) == _key(theirs):
            score += 4
        if same_kind and canonical(str(base.data.get("title", ""))).casefold() == \
                canonical(str(theirs.data.get("title", ""))).casefold():
            score += 2
        score += _shared(base, theirs)
        if score > 0 and (best is None or score > best[0]):
            best = (score, n)
    return bases[best[1]] if best is not None else None


_KEY_FIELD = {"formula": "concept", "enum": "column", "mapping": "concept",
              "normalization": "subject", "glossary": "term", "domain": "rule",
              "example": "question", "reference": "url"}


def _key(side: Side) -> str:
    kind = str(side.data.get("kind", ""))
    block = side.data.get(kind)
    value = block.get(_KEY_FIELD.get(kind, "")) if isinstance(block, dict) else None
    return canonical(value).casefold() if isinstance(value, str) else ""


def _shared(a: Side, b: Side) -> float:
    """The share of b's excerpt text that overlaps a's (0..1)."""
    mine = [canonical(e) for e in a.data.get("supporting_excerpts") or []]
    theirs = [canonical(e) for e in b.data.get("supporting_excerpts") or []]
    if not mine or not theirs:
        return 0.0
    hits = sum(1 for t in theirs if any(len(min(t, m, key=len)) >= 12 and (t in m or m in t)
                                        for m in mine))
    return hits / len(theirs)


# --- the recorded proposals of the model backends --------------------------------------------


class LastProposals:
    """``.tht/last-proposals.json``: for each unit a model backend last proposed, the source
    hash it was proposed for and the proposal (data and body): the base of the next merge."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                self.entries = {k: v for k, v in data.items() if isinstance(v, dict)}
        except (OSError, ValueError):
            pass

    def base(self, evidence_id: str, source_sha256: str) -> Side | None:
        entry = self.entries.get(evidence_id)
        if entry is None or entry.get("source_sha256") != source_sha256 \
                or not isinstance(entry.get("data"), dict):
            return None
        return proposed_side(entry["data"], str(entry.get("body", "")))

    def record(self, evidence_id: str, source_sha256: str, unit: ProposedUnit) -> None:
        self.entries[evidence_id] = {"source_sha256": source_sha256, "data": unit.data,
                                     "body": unit.body}

    def save(self, *, keep: Collection[str] | None = None) -> None:
        """Write the file (atomically); with ``keep``, only the entries of those ids."""
        if keep is not None:
            self.entries = {k: v for k, v in self.entries.items() if k in keep}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.entries, ensure_ascii=False, sort_keys=True),
                       encoding="utf-8")
        os.replace(tmp, self.path)
