"""A classified piece before ids are matched, and what every kind's builder shares."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from evidence_pipeline.authoring.backends.structural.refs import Refs
from evidence_pipeline.authoring.backends.structural.roles import Piece
from evidence_pipeline.authoring.backends.structural.text import first_words, unemph
from evidence_pipeline.formats.normalize import canonical
from evidence_runtime.units import EvidenceKind

K = EvidenceKind

# The block field that identifies "the same unit" of a kind.
KEY_FIELD: dict[EvidenceKind, str] = {
    K.formula: "concept",
    K.enum: "column",
    K.mapping: "concept",
    K.normalization: "subject",
    K.glossary: "term",
    K.domain: "rule",
    K.example: "question",
    K.reference: "url",
}

UNCERTAIN = "structural_classification_uncertain"
AMBIGUOUS = "ambiguous_source_statement"
FIELD_UNCERTAIN = "structural_field_uncertain"
LEFT_OUT = "structural_block_left_out"
NO_LABEL = "The link has no label of its own."


@dataclass
class Draft:
    """A classified piece, before ids are matched."""

    kind: EvidenceKind
    title: str
    block: dict[str, Any]
    excerpts: list[str]
    body: str
    concepts: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    review: list[dict[str, str]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # every block (or item) of the piece

    def flag(self, code: str, message: str, field_name: str | None = None) -> None:
        item = {"code": code, "message": message}
        if field_name:
            item["field"] = field_name
        if item not in self.review:
            self.review.append(item)

    def or_uncertain(self, value: str, fallback: str, message: str, field_name: str) -> str:
        """``value`` when the note gives one, else ``fallback``, flagged as uncertain."""
        if value:
            return value
        self.flag(FIELD_UNCERTAIN, message, field_name)
        return fallback

    @property
    def key(self) -> str:
        return key(self.kind, self.block)


def key(kind: EvidenceKind | str, block: Any) -> str:
    """The comparison form of a kind block's identifying field ("" when there is none)."""
    try:
        kind = EvidenceKind(kind)
    except ValueError:
        return ""
    value = block.get(KEY_FIELD[kind]) if isinstance(block, dict) else None
    return canonical(value).casefold() if isinstance(value, str) else ""


def new_draft(kind: EvidenceKind, piece: Piece, title: str, block: dict[str, Any],
              refs: Refs, *, concepts: Sequence[str] = (), extra_text: str = "") -> Draft:
    """A draft of ``kind`` whose tables and columns are those the piece references."""
    tables, columns = refs.find("\n".join([piece_text(piece), extra_text]))
    return Draft(kind=kind, title=title, block=block, excerpts=[], body=body(piece),
                 concepts=[c for c in concepts if c], tables=tables, columns=columns)


def title_of(piece: Piece, key: str | None = None) -> str:
    """The heading, or the piece's own key when its section yields several pieces."""
    if piece.heading and not (piece.shared and key):
        return unemph(piece.heading)
    if key:
        return key
    return first_words(piece_text(piece)) or _preview(piece)


def _preview(piece: Piece, size: int = 80) -> str:
    """The first characters of a block set aside (a piece with nothing else to show)."""
    text = next((b.text.strip() for b in piece.blocks if b.aside and b.text.strip()), "")
    if len(text) <= size:
        return text
    cut = text.rfind(" ", 0, size)
    return text[:cut if cut > size // 2 else size].rstrip()


def body(piece: Piece) -> str:
    """The piece's Markdown as it stands in the note (an item with its introduction)."""
    parts: list[str] = []
    if piece.intro is not None:
        parts.append("\n".join(piece.intro.raw))
    if piece.item_raw:
        parts.append("\n".join(piece.item_raw))
    else:
        parts.extend("\n".join(b.raw) for b in piece.blocks if not b.aside)
    return "\n\n".join(parts)


def piece_text(piece: Piece) -> str:
    if piece.item is not None:
        return piece.item
    return "\n".join(b.text for b in piece.blocks if not b.aside)


def prose_text(piece: Piece) -> str:
    return "\n".join(b.text for b in piece.prose)
