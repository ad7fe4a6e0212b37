"""New unit ids: ``evidence:<slug>`` assigned once by code, with a deterministic collision suffix.

An id is never recomputed from title, path or hash after it was assigned, and never issued twice
(spec §4.2): the ids a new unit must not get are every id the workspace ever issued — the units,
the manifest's entries, orphans and retirement candidates, and its ``retired_ids`` — so a unit
retired today does not lend its id to a later unit with the same title. This module only mints
ids for units that have none yet.

The slug is the title's words, lowercase ASCII, joined by ``-``, with one rule for kind names:
**a kind name is never a word of a minted slug** (the id does not contain the kind, spec §4.2
and §17, and a reclassification keeps the id). Every word equal to a kind name (``formula``,
``enum``, ``mapping``, ``normalization``, ``glossary``, ``domain``, ``example``, ``reference``)
is left out wherever it stands, whether it names the unit's own kind or is part of the concept:
the title keeps the full wording, the id is only a handle. A connective that the dropped word
leaves dangling at the start or the end (``Formula di Friedewald`` → ``friedewald``, ``BMI
formula`` → ``bmi``) goes with it; a title of kind names only becomes ``unit``.
:func:`evidence_runtime.units.check_evidence_id` refuses a kind name anywhere in an id the same
way, for ids written by hand.
"""

from __future__ import annotations

import re
import unicodedata

from evidence_runtime.units import ID_PREFIX, EvidenceKind

MAX_SLUG = 60
FALLBACK_SLUG = "unit"  # a title with no word left (empty, or kind names only)
_NON_ALNUM = re.compile(r"[^a-z0-9]+")
_KINDS = frozenset(EvidenceKind.__members__)
# Italian and English connectives left dangling at an edge when a kind word next to them is
# dropped ("Formula di Friedewald", "Mapping of codes"); elsewhere they stay.
_CONNECTIVES = frozenset({
    "a", "ad", "al", "alla", "alle", "agli", "ai", "che", "con", "da", "dal", "dalla", "dei",
    "degli", "del", "della", "delle", "dello", "di", "e", "ed", "for", "il", "in", "la", "le",
    "lo", "gli", "nel", "nella", "of", "on", "per", "su", "sul", "sulla", "the", "to", "un",
    "una", "uno",
})


def slugify(title: str) -> str:
    """Lowercase ASCII words joined by '-', none of them a kind name; never empty."""
    ascii_text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    words = _without_kind_names([w for w in _NON_ALNUM.split(ascii_text.lower()) if w])
    slug = ""
    for w in words:
        candidate = f"{slug}-{w}" if slug else w
        if len(candidate) > MAX_SLUG:
            break
        slug = candidate
    return slug or (words[0][:MAX_SLUG] if words else FALLBACK_SLUG)


def _without_kind_names(words: list[str]) -> list[str]:
    """``words`` without kind names, and without the connectives that a kind name dropped at
    the start or the end leaves dangling there."""
    kept = [w for w in words if w not in _KINDS]
    if words and words[0] in _KINDS:
        while kept and kept[0] in _CONNECTIVES:
            kept.pop(0)
    if words and words[-1] in _KINDS:
        while kept and kept[-1] in _CONNECTIVES:
            kept.pop()
    return kept


def assign_id(title: str, taken: set[str]) -> str:
    """Mint an id for a new unit and reserve it in ``taken``: base, then base-2, base-3, …

    ``taken`` must hold every id ever issued in the workspace (retired ones included)."""
    base = slugify(title)
    candidate = f"{ID_PREFIX}{base}"
    n = 2
    while candidate in taken:
        candidate = f"{ID_PREFIX}{base}-{n}"
        n += 1
    taken.add(candidate)
    return candidate
