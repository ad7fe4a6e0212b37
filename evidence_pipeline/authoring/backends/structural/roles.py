"""The role of each block in its section, and the section cut into pieces (candidate units).

A role says what a block visibly holds: an SQL block, a table, lines of codes, an inline list
of codes, a glossary list, a list of links, or prose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from evidence_pipeline.authoring.backends.structural.blocks import Block, Section
from evidence_pipeline.authoring.backends.structural.cues import LABEL
from evidence_pipeline.authoring.backends.structural.refs import Refs
from evidence_pipeline.authoring.backends.structural.text import IDENT, URL, trim, unemph, unquote
from evidence_pipeline.markdown import SQL_LANGS

_ENUM_LINE = re.compile(
    r"^(?:- |\d{1,3}\. )?(?P<code>'[^']{1,20}'|\"[^\"]{1,20}\"|`[^`]{1,20}`|[A-Za-z0-9_]{1,12})"
    r"\s*(?:=|:|→|->|–|-)\s+(?P<meaning>\S.*)$")
_ENUM_LINE_BARE = re.compile(r"^(?P<code>[A-Z0-9]{1,3}) (?P<meaning>[a-zà-ÿ(].*)$")
_INLINE_ENUM = re.compile(rf"^(?P<col>{IDENT}\.{IDENT}\.{IDENT})\s*:\s*(?P<items>.+)$")
_INLINE_ITEM = re.compile(
    r"^\s*(?P<code>'[^']{1,20}'|\"[^\"]{1,20}\"|`[^`]{1,20}`|[A-Z0-9]{1,6})\s*(?:=\s*)?"
    r"(?P<meaning>\S.*?)\s*\.?$")
_GLOSS_ITEM = re.compile(r"^(?P<term>[^:=,;.]{1,60}?)\s*(?::|=)\s+(?P<definition>\S.*)$")


@dataclass
class Piece:
    """A candidate unit: the blocks it rests on and, for split blocks, the one item."""

    heading: str | None
    blocks: list[Block]
    anchor: Block | None = None
    role: str = "prose"  # prose | sql | table | enum_lines | inline_enum | gloss_item | ref_item
    item: str | None = None
    item_raw: tuple[str, ...] = ()
    intro: Block | None = None
    shared: bool = False  # the section yields several pieces

    @property
    def prose(self) -> list[Block]:
        return [b for b in self.blocks
                if b.type in {"para", "list"} and b is not self.anchor and not b.aside]


def split_section(section: Section, refs: Refs) -> list[Piece]:
    """One piece per structured anchor or list item; the remaining prose as one piece."""
    blocks = list(section.blocks)
    roles: list[str] = []
    for n, block in enumerate(blocks):
        before = blocks[n - 1] if n > 0 else None
        roles.append(_block_role(block, before, section.heading, refs))
    strong = [n for n, r in enumerate(roles) if r in {"sql", "table", "enum_lines"}]
    pieces: list[Piece] = []
    consumed: set[int] = set()
    # glossary and link lists give one piece per item; a one-line code list is its own piece
    for n, role in enumerate(roles):
        block = blocks[n]
        if role in {"gloss_list", "ref_list"}:
            intro = blocks[n - 1] if n > 0 and roles[n - 1] == "prose" and \
                blocks[n - 1].type == "para" and blocks[n - 1].flat.endswith(":") else None
            if intro is not None:
                consumed.add(n - 1)
            consumed.add(n)
            for text, raw in block.items():
                pieces.append(Piece(section.heading, [block], anchor=block,
                                    role="gloss_item" if role == "gloss_list" else "ref_item",
                                    item=text, item_raw=raw, intro=intro))
        elif role == "inline_enum":
            consumed.add(n)
            pieces.append(Piece(section.heading, [block], anchor=block, role="inline_enum"))
    if strong:
        # each anchor takes the prose since the previous anchor; the last one also the rest
        start = 0
        for k, n in enumerate(strong):
            stop = len(blocks) if k + 1 == len(strong) else n + 1
            own = [m for m in range(start, stop)
                   if m not in consumed and (m == n or roles[m] == "prose")]
            consumed.update(own)
            pieces.append(Piece(section.heading, [blocks[m] for m in own], anchor=blocks[n],
                                role=roles[n]))
            start = n + 1
    rest = [b for m, b in enumerate(blocks) if m not in consumed]
    if rest:
        pieces.append(Piece(section.heading, rest))
    order = {id(b): m for m, b in enumerate(blocks)}
    pieces.sort(key=lambda p: (order[id(p.anchor or p.blocks[0])],
                               p.anchor.lines.index(p.item_raw[0]) if p.item_raw and p.anchor
                               else 0))
    shared = len(pieces) > 1
    for p in pieces:
        p.shared = shared
    return pieces


def _block_role(block: Block, before: Block | None, heading: str | None, refs: Refs) -> str:
    if block.aside:
        return "prose"
    if block.type == "code":
        return "sql" if block.lang.lower() in SQL_LANGS else "prose"
    if block.type == "table":
        return "table" if len(table_rows(block)[1]) >= 1 else "prose"
    if block.type == "para" and len(block.lines) == 1 and inline_enum(block.lines[0]):
        return "inline_enum"
    if block.type in {"para", "list"} and enum_lines(block) is not None:
        near = " ".join(x for x in (heading or "", before.flat if before else ""))
        if refs.find(near)[1]:
            return "enum_lines"
    if block.type == "list":
        items = block.items()
        if items and all(len(URL.findall(text)) == 1 for text, _ in items):
            return "ref_list"
        label = LABEL.match(before.flat) if before is not None and before.type == "para" else None
        if len(items) >= 2 and label is None and all(gloss_item(text, refs) for text, _ in items):
            return "gloss_list"
    return "prose"


def table_rows(block: Block) -> tuple[list[str], list[list[str]]]:
    """(header cells, data rows) of a Markdown or HTML table."""
    if not block.cells:
        return [], []
    if not block.header:
        return [], [list(row) for row in block.cells]
    return list(block.cells[0]), [list(row) for row in block.cells[1:]]


def enum_lines(block: Block) -> dict[str, str] | None:
    """Codes and meanings when every line (or item) of the block is ``code = meaning``."""
    lines = [t for t, _ in block.items()] if block.type == "list" else [
        line.strip() for line in block.lines]
    if len(lines) < 2:
        return None
    values: dict[str, str] = {}
    bare = all(_ENUM_LINE_BARE.match(line) for line in lines)
    for line in lines:
        m = _ENUM_LINE_BARE.match(line) if bare else _ENUM_LINE.match(line)
        if m is None:
            return None
        values.setdefault(unquote(m.group("code")), trim(m.group("meaning")))
    return values


def inline_enum(line: str) -> tuple[str, dict[str, str]] | None:
    """(column, codes) of a line ``schema.table.column: A = one, B = two``."""
    m = _INLINE_ENUM.match(line.strip())
    if m is None:
        return None
    values: dict[str, str] = {}
    parts = m.group("items").split(",")
    if len(parts) < 2:
        return None
    for part in parts:
        item = _INLINE_ITEM.match(part)
        if item is None:
            return None
        values.setdefault(unquote(item.group("code")), trim(item.group("meaning")))
    return m.group("col"), values


def gloss_item(text: str, refs: Refs) -> tuple[str, str] | None:
    """(term, definition) of a list item ``term: definition`` that names no table."""
    m = _GLOSS_ITEM.match(text)
    if m is None:
        return None
    term, definition = m.group("term").strip(), m.group("definition").strip()
    if len(term.split()) > 5 or URL.search(text) or any(refs.find(definition)):
        return None
    return unemph(term), definition
