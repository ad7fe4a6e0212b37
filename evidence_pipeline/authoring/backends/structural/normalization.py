"""Normalization units: a rule with ``raw → normalized`` examples, from arrows or tables."""

from __future__ import annotations

import re

from evidence_pipeline.authoring.backends.structural.draft import (
    FIELD_UNCERTAIN,
    Draft,
    K,
    new_draft,
    piece_text,
    title_of,
)
from evidence_pipeline.authoring.backends.structural.refs import Refs
from evidence_pipeline.authoring.backends.structural.roles import Piece
from evidence_pipeline.authoring.backends.structural.text import (
    balanced,
    first_words,
    unemph,
    unquote,
    unquote_code,
)

_ARROW = re.compile(r"\s*(?:->|→|=>)\s*")


def normalization_draft(piece: Piece, refs: Refs, *, rows: list[list[str]] | None = None,
                        examples: list[dict[str, str]] | None = None) -> Draft:
    """A normalization unit: examples from arrows (or table rows), the rule from the prose."""
    if examples is None:
        examples = arrow_examples(piece)
    for row in rows or []:
        if len(row) >= 2 and unquote(row[0]) and unquote(row[-1]):
            ex = {"raw": unquote(row[0]), "normalized": unquote(row[-1])}
            if ex not in examples:
                examples.append(ex)
    example_lines = {line for b in piece.prose for line in b.lines if _line_examples(line)}
    rule_paras = [b for b in piece.prose
                  if not all(line in example_lines for line in b.lines)
                  and not re.fullmatch(r"(?i)(?:es\.|esempi|esempio|examples?)\s*:?", b.flat)]
    rule = " ".join(line.strip() for line in (rule_paras[0].lines if rule_paras else ())
                    if line not in example_lines and line.strip())
    subject = unemph(piece.heading) if piece.heading else None
    draft = new_draft(K.normalization, piece, "", {}, refs, concepts=[subject or ""])
    if rows and any(len(r) > 2 for r in rows):
        draft.flag(FIELD_UNCERTAIN, "The table has more than two columns; the first is taken "
                   "as the raw value and the last as the normalized one.",
                   "normalization.examples")
    if subject is None:
        subject = (draft.columns[:1] or [first_words(piece_text(piece))])[0]
        draft.flag(FIELD_UNCERTAIN, "The note has no heading naming what is normalized.",
                   "normalization.subject")
    rule = draft.or_uncertain(rule, subject, "The note gives examples but does not state the "
                              "rule.", "normalization.rule")
    draft.title = title_of(piece, subject)
    draft.block = {"subject": subject, "rule": rule, "examples": examples}
    return draft


def arrow_examples(piece: Piece) -> list[dict[str, str]]:
    """Every ``raw → normalized`` pair written in the piece's prose, in order."""
    out: list[dict[str, str]] = []
    for block in piece.prose:
        for line in block.lines:
            for ex in _line_examples(line):
                if ex not in out:
                    out.append(ex)
    return out


def _line_examples(line: str) -> list[dict[str, str]]:
    s = re.sub(r"^\s*(?:- |\d{1,3}\. )?", "", line).strip()
    s = re.sub(r"^(?:es\.|esempio:|esempi:|e\.g\.)\s*", "", s, flags=re.IGNORECASE)
    out: list[dict[str, str]] = []
    for part in re.split(r"\s+;\s+", s):
        arrows = _ARROW.findall(part)
        if len(arrows) != 1:
            continue
        raw, normalized = _ARROW.split(part)
        raw = raw.rsplit(": ", 1)[-1]
        raw, normalized = unquote_code(raw.strip()), unquote_code(normalized.strip())
        if raw and normalized and all(len(x) <= 120 and balanced(x) for x in (raw, normalized)):
            out.append({"raw": raw, "normalized": normalized})
    return out
