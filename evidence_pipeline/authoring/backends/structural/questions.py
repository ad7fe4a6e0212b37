"""The question an example answers and how the note says to read it."""

from __future__ import annotations

import re

from evidence_pipeline.authoring.backends.structural.cues import INTERP_LABEL, QUESTION_LABEL
from evidence_pipeline.authoring.backends.structural.roles import Piece
from evidence_pipeline.authoring.backends.structural.text import URL, unemph, unquote


def question(piece: Piece, *, strict: bool = False) -> tuple[str | None, bool]:
    """(question, taken from the heading without a label or '?')."""
    lines = [piece.heading or ""] + [ln.strip() for b in piece.prose for ln in b.lines]
    for line in lines:
        m = QUESTION_LABEL.match(unemph(line))
        if m:
            return unquote(m.group("q").strip()), False
    for line in lines:
        if line.endswith("?") and not URL.search(line):
            return unquote(re.sub(r"^\d{1,3}\.\s+", "", unemph(line))), False
    if strict or not piece.heading:
        return None, False
    return re.sub(r"^\d{1,3}\.\s+", "", unemph(piece.heading)), True


def labelled_interpretation(piece: Piece) -> str | None:
    """The text after an "Interpretazione:" label, with the rest of its paragraph."""
    for block in piece.prose:
        m = INTERP_LABEL.match(block.lines[0].strip())
        if m:
            rest = [m.group("i"), *(ln.strip() for ln in block.lines[1:])]
            return " ".join(x for x in rest if x)
    return None


def interpretation(piece: Piece, asked: str) -> str | None:
    """The labelled interpretation, else the first paragraph that is not the question."""
    labelled = labelled_interpretation(piece)
    if labelled:
        return labelled
    for block in piece.prose:
        text = block.flat
        if text and asked not in text and not QUESTION_LABEL.match(text):
            return text
    return None
