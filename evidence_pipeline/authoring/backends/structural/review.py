"""Review items a draft earns from its text: statements that are not definite, atomic
elements too large for one fragment."""

from __future__ import annotations

from typing import Any

from evidence_pipeline.authoring.backends.structural.cues import AMBIGUITY
from evidence_pipeline.authoring.backends.structural.draft import AMBIGUOUS, Draft, K
from evidence_pipeline.authoring.backends.structural.roles import Piece
from evidence_pipeline.authoring.backends.structural.text import URL
from evidence_pipeline.formats.fragments import ATOMIC_TOO_LARGE
from evidence_pipeline.formats.normalize import canonical


def flag_ambiguity(piece: Piece, draft: Draft) -> None:
    """Flag every line of the piece that says it is not sure (naming the field holding it)."""
    asked = draft.block.get("question") if draft.kind is K.example else None
    lines: list[str] = []
    if piece.item is not None:
        lines.append(piece.item)
    else:
        lines.extend(ln.strip() for b in piece.prose for ln in b.lines if ln.strip())
    for line in lines:
        bare = URL.sub(" ", line)
        if asked and asked in line:
            continue
        m = AMBIGUITY.search(bare)
        if m is None:
            continue
        shown = line if len(line) <= 300 else line[:297] + "…"
        draft.flag(AMBIGUOUS, f"The note is not definite here ({m.group(0)!r}): “{shown}”",
                   _field_holding(draft, line))


def _field_holding(draft: Draft, line: str) -> str | None:
    probe = canonical(line)[:60]
    for name, value in draft.block.items():
        values = value if isinstance(value, list) else (
            list(value.values()) if isinstance(value, dict) else [value])
        for v in values:
            if isinstance(v, str) and probe and probe in canonical(v):
                return f"{draft.kind.value}.{name}"
    return None


def check_sizes(draft: Draft, limit: int) -> None:
    """Flag a kind-block element longer than ``limit`` characters; it is kept whole."""
    for name, value in draft.block.items():
        values: list[Any]
        if isinstance(value, dict):
            values = [f"{k} {v}" for k, v in value.items()]
        elif isinstance(value, list):
            values = [" ".join(v.values()) if isinstance(v, dict) else v for v in value]
        else:
            values = [value]
        if any(isinstance(v, str) and len(v) > limit for v in values):
            draft.flag(ATOMIC_TOO_LARGE, f"An atomic element is longer than max_chunk_chars "
                       f"({limit}); it is kept whole.", f"{draft.kind.value}.{name}")
