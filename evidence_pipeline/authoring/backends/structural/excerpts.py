"""Supporting excerpts: verbatim slices of the normalized text, one per block of the piece."""

from __future__ import annotations

from evidence_pipeline.authoring.backends.structural.roles import Piece
from evidence_pipeline.formats.normalize import excerpt_in_source
from evidence_runtime.units import MAX_EXCERPT_CHARS, MAX_EXCERPTS


def block_texts(piece: Piece) -> list[str]:
    """The text of every block (or the one item) of the piece."""
    if piece.item is not None:
        return [piece.item]
    return [t for t in _texts(piece) if t.strip()]


def _texts(piece: Piece) -> list[str]:
    texts: list[str] = []
    for block in piece.blocks:
        if block.type == "code":
            texts.append(block.text.strip("\n"))
        elif block.type == "table":
            texts.append(block.text)
        else:
            texts.append(block.flat)
    return texts


def excerpts(piece: Piece, source: str) -> list[str]:
    """Verbatim slices of the normalized text: the piece's blocks, cut at MAX_EXCERPT_CHARS
    (of a block set aside, only its beginning)."""
    texts = block_texts(piece)
    aside = {t for b, t in zip(piece.blocks, _texts(piece), strict=True) if b.aside}
    out: list[str] = []
    for text in texts:
        if len(texts) > 1 and text.endswith(":") and len(text.split()) <= 2:
            continue  # a bare label such as "Condizioni:" proves nothing
        for chunk in _chunks(text)[:1] if text in aside else _chunks(text):
            if excerpt_in_source(chunk, source) and chunk not in out:
                out.append(chunk)
    if not out:  # cannot happen for slices of the text; kept as a last resort
        out = [line.strip() for line in source.splitlines() if line.strip()][:1]
    return out[:MAX_EXCERPTS]


def _chunks(text: str) -> list[str]:
    text = text.strip()
    if len(text) <= MAX_EXCERPT_CHARS:
        return [text] if text else []
    out: list[str] = []
    while text:
        if len(text) <= MAX_EXCERPT_CHARS:
            out.append(text)
            break
        cut = text.rfind("\n", 0, MAX_EXCERPT_CHARS)
        if cut <= 0:
            cut = text.rfind(" ", 0, MAX_EXCERPT_CHARS)
        if cut <= 0:
            cut = MAX_EXCERPT_CHARS
        out.append(text[:cut].strip())
        text = text[cut:].strip()
    return [c for c in out if c]
