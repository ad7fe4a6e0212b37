"""A note as the structural backend reads it: blocks of the shared Markdown grammar, grouped
into sections under their headings."""

from __future__ import annotations

import re
from dataclasses import dataclass

from evidence_pipeline import markdown
from evidence_pipeline.authoring.backends.structural.text import URL
from evidence_pipeline.markdown import BlockKind

# how each block of the grammar is read here: indented code, quotes, HTML and reference
# definitions are text like a paragraph (notes indent examples for show); a thematic break
# carries nothing
_TYPES = {
    BlockKind.heading: "heading",
    BlockKind.fence: "code",
    BlockKind.table: "table",
    BlockKind.list: "list",
    BlockKind.paragraph: "para",
    BlockKind.code: "para",
    BlockKind.quote: "para",
    BlockKind.html: "para",
    BlockKind.definition: "para",
}


@dataclass(frozen=True)
class Block:
    """One structural block of the normalized text (verbatim lines)."""

    type: str  # heading | para | list | table | code
    lines: tuple[str, ...]  # content lines (code: without fences; heading: its text)
    raw: tuple[str, ...]  # the lines as they stand in the text (code: with fences)
    lang: str = ""
    level: int = 0
    item_raw: tuple[tuple[str, ...], ...] = ()  # a list's items, verbatim
    cells: tuple[tuple[str, ...], ...] = ()  # a table's rows of cells, the header first

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def flat(self) -> str:
        return " ".join(line.strip() for line in self.lines if line.strip())

    def items(self) -> list[tuple[str, tuple[str, ...]]]:
        """List items: (item text without its marker, joined with continuations; raw lines)."""
        out: list[tuple[str, tuple[str, ...]]] = []
        for raw in self.item_raw:
            words = [markdown.item_text(raw[0]).strip()]
            words.extend(line.strip() for line in raw[1:] if line.strip())
            out.append((" ".join(words), raw))
        return out


@dataclass(frozen=True)
class Section:
    heading: str | None
    blocks: tuple[Block, ...]


def parse_blocks(text: str) -> list[Block]:
    """Headings, paragraphs, lists, tables and code blocks of normalized Markdown.

    A first line that is obviously a title (short, unpunctuated, more text follows) is read as
    a level-1 heading, and the text after it as a note of its own.
    """
    found = markdown.parse_blocks(text)
    first = found[0] if found else None
    if first is not None and first.kind is BlockKind.paragraph:
        head = first.lines[0]
        if _looks_like_title(head) and (len(first.lines) > 1 or len(found) > 1):
            rest = "\n".join(markdown.split_lines(text)[first.start + 1:])
            title = Block("heading", (head.strip(),), (head,), level=1)
            return [title, *_blocks(markdown.parse_blocks(rest))]
    return _blocks(found)


def _blocks(found: list[markdown.Block]) -> list[Block]:
    out: list[Block] = []
    for b in found:
        kind = _TYPES.get(b.kind)
        if kind is None:
            continue
        if kind == "heading":
            out.append(Block(kind, (b.title,), b.lines, level=b.level))
        elif kind == "code":
            if any(line.strip() for line in b.content):  # an empty code block holds nothing
                out.append(Block(kind, b.content, b.lines, lang=b.lang))
        elif kind == "list":
            out.append(Block(kind, b.lines, b.lines, item_raw=tuple(b.item_lines())))
        elif kind == "table":
            out.append(Block(kind, b.lines, b.lines, cells=b.rows))
        else:
            out.append(Block(kind, b.lines, b.lines))
    return out


def _looks_like_title(line: str) -> bool:
    s = line.strip()
    if not s or s.startswith(("#", "-", "|", "```", ">", "*", "+")) or re.match(r"\d+[.)]", s):
        return False
    if URL.search(s) or s.endswith((".", ":", ";", ",", "?", "!")):
        return False
    return len(s.split()) <= 10


def parse_sections(text: str) -> list[Section]:
    """Blocks grouped under their heading (the text before the first heading has none)."""
    sections: list[Section] = []
    heading: str | None = None
    current: list[Block] = []
    for block in parse_blocks(text):
        if block.type == "heading":
            if current or heading is not None:
                sections.append(Section(heading, tuple(current)))
            heading, current = block.lines[0], []
        else:
            current.append(block)
    if current or heading is not None:
        sections.append(Section(heading, tuple(current)))
    return [s for s in sections if s.blocks]
