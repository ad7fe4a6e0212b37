"""New unit ids: ``evidence:<slug>`` assigned once by code, with a deterministic collision suffix.

An id is never recomputed from title, path or hash after it was assigned (spec §4.2); this module
only mints ids for units that have none yet.
"""

from __future__ import annotations

import re
import unicodedata

from evidence_runtime.units import ID_PREFIX, EvidenceKind

MAX_SLUG = 60
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def slugify(title: str) -> str:
    """Lowercase ASCII words joined by '-', without a leading kind name; never empty."""
    ascii_text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    words = [w for w in _NON_ALNUM.split(ascii_text.lower()) if w]
    while len(words) > 1 and words[0] in EvidenceKind.__members__:
        words = words[1:]
    if words and words[0] in EvidenceKind.__members__:
        words = ["unit", *words]  # a title that is only a kind name: the kind must not lead
    slug = ""
    for w in words:
        candidate = f"{slug}-{w}" if slug else w
        if len(candidate) > MAX_SLUG:
            break
        slug = candidate
    return slug or (words[0][:MAX_SLUG] if words else "unit")


def assign_id(title: str, taken: set[str]) -> str:
    """Mint an id for a new unit and reserve it in ``taken``: base, then base-2, base-3, …"""
    base = slugify(title)
    candidate = f"{ID_PREFIX}{base}"
    n = 2
    while candidate in taken:
        candidate = f"{ID_PREFIX}{base}-{n}"
        n += 1
    taken.add(candidate)
    return candidate
