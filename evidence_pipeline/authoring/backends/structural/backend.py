"""The structural backend: a note cut into pieces, each classified into a draft unit."""

from __future__ import annotations

from evidence_pipeline.authoring.backends.base import ModelReply, ModelRequest, reply_from_data
from evidence_pipeline.authoring.backends.structural.anchors import (
    gloss_item_draft,
    inline_enum_draft,
    ref_item_draft,
    sql_draft,
    table_or_lines_draft,
)
from evidence_pipeline.authoring.backends.structural.blocks import parse_sections, set_aside
from evidence_pipeline.authoring.backends.structural.draft import LEFT_OUT, Draft
from evidence_pipeline.authoring.backends.structural.excerpts import block_texts, excerpts
from evidence_pipeline.authoring.backends.structural.previous import match_previous
from evidence_pipeline.authoring.backends.structural.prose import prose_draft
from evidence_pipeline.authoring.backends.structural.refs import Refs
from evidence_pipeline.authoring.backends.structural.review import check_sizes, flag_ambiguity
from evidence_pipeline.authoring.backends.structural.roles import Piece, split_section


class StructuralBackend:
    """Deterministic restructuring without a model; never invents text."""

    name = "structural"

    def restructure(self, request: ModelRequest) -> ModelReply:
        text = request.normalized_text
        refs = Refs(text)
        drafts: list[Draft] = []
        for section in set_aside(parse_sections(text), request.max_chunk_chars):
            for piece in split_section(section, refs):
                if block_texts(piece):  # blocks of blank lines or empty code say nothing
                    drafts.append(classify(piece, refs, request))
        for d in drafts:
            check_sizes(d, request.max_chunk_chars)
        units, retire = match_previous(drafts, request)
        return reply_from_data({"units": units, "retirement_candidates": retire}, request)


def classify(piece: Piece, refs: Refs, request: ModelRequest) -> Draft:
    """The kind and fields of one piece, with review items wherever it is not sure."""
    if piece.role == "gloss_item":
        draft = gloss_item_draft(piece, refs)
    elif piece.role == "ref_item":
        draft = ref_item_draft(piece, refs)
    elif piece.role == "inline_enum":
        draft = inline_enum_draft(piece, refs)
    elif piece.role == "sql":
        draft = sql_draft(piece, refs)
    elif piece.role in {"table", "enum_lines"}:
        draft = table_or_lines_draft(piece, refs)
    else:
        draft = prose_draft(piece, refs)
    flag_ambiguity(piece, draft)
    for block in piece.blocks:
        if block.aside:
            start = block.text.strip()[:60]
            draft.flag(LEFT_OUT, f"A block of {len(block.text)} characters (“{start}…”) is too "
                       f"large for any unit (max_chunk_chars {request.max_chunk_chars}) or cannot "
                       "be cut: it is left out of this unit and stays in the source.", "body")
    draft.excerpts = excerpts(piece, request.normalized_text)
    draft.texts = block_texts(piece)
    return draft
