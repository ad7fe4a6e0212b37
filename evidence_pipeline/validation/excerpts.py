"""How short a supporting excerpt may be (spec §4 and §5.4: short quotes that the validator
finds again in the source, and that a reviewer can check).

A quote supports a unit only if it locates a statement: a word such as "anni" or a single
character is found in almost any note and proves nothing. So an excerpt holds at least
:data:`MIN_EXCERPT_CHARS` non-space characters — the demo's shortest quotes are code/meaning
pairs such as "U = urgente" (9) — or, when shorter, is a whole line of the source with at least
two letters or digits (a short table row such as "| M | F |", a code on its own line).
"""

from __future__ import annotations

from evidence_pipeline.formats.normalize import canonical

MIN_EXCERPT_CHARS = 8


def excerpt_too_short(excerpt: str, normalized_source: str) -> bool:
    """Is this excerpt (found in the source) too short to locate anything?"""
    core = "".join(excerpt.split())
    if len(core) >= MIN_EXCERPT_CHARS:
        return False
    if sum(c.isalnum() for c in core) < 2:
        return True
    wanted = canonical(excerpt)
    return not any(canonical(line) == wanted for line in normalized_source.splitlines())


def too_short_message(excerpt: str) -> str:
    n = len("".join(excerpt.split()))
    return (f"excerpt {excerpt!r} is too short to check ({n} non-space character(s); at least "
            f"{MIN_EXCERPT_CHARS}, or a whole line of the source)")
