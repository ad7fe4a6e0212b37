"""A note as the structural backend reads it: blocks of the shared Markdown grammar, grouped
into sections under their headings."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from evidence_pipeline import markdown
from evidence_pipeline.authoring.backends.structural.text import URL, unquote
from evidence_pipeline.markdown import SQL_LANGS, BlockKind

# how each block of the grammar is read here: indented code, quotes, HTML and reference
# definitions are text like a paragraph (notes indent examples for show), an HTML table is a
# table; a front matter, a thematic break and HTML without visible text (comments, wrappers)
# carry nothing
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
    cells: tuple[tuple[str, ...], ...] = ()  # a table's rows of cells
    header: bool = True  # the first row of cells is a header
    aside: bool = False  # too large for any unit: left out of fields and body (see set_aside)

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
    a level-1 heading, and the text after it as a note of its own; so is the ``title:`` of a
    front matter, which is otherwise left out.
    """
    found = markdown.parse_blocks(text)
    title: list[Block] = []
    if found and found[0].kind is BlockKind.front_matter:
        named = _front_matter_title(found.pop(0))
        if named is not None and (not found or found[0].kind is not BlockKind.heading):
            title = [named]
    first = found[0] if found else None
    if not title and first is not None and first.kind is BlockKind.paragraph:
        head = first.lines[0]
        if _looks_like_title(head) and (len(first.lines) > 1 or len(found) > 1):
            rest = "\n".join(markdown.split_lines(text)[first.start + 1:])
            title = [Block("heading", (head.strip(),), (head,), level=1)]
            return [*title, *_blocks(markdown.parse_blocks(rest))]
    return [*title, *_blocks(found)]


def _front_matter_title(block: markdown.Block) -> Block | None:
    for line in block.lines[1:]:
        m = _FM_TITLE.match(line)
        if m and unquote(m.group(1)):
            return Block("heading", (unquote(m.group(1)),), (line,), level=1)
    return None


_FM_TITLE = re.compile(r"^title:\s*(\S.*?)\s*$", re.IGNORECASE)


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
        elif kind == "table" or b.rows:
            out.append(Block("table", b.lines, b.lines, cells=b.rows, header=b.header))
        elif b.kind is not BlockKind.html or b.visible:
            out.append(Block(kind, b.lines, b.lines))
    return out


def set_aside(sections: list[Section], limit: int) -> list[Section]:
    """Mark the blocks no unit can hold: a code block (other than SQL, whose size the kind
    block reports) longer than ``limit``, a table with a row longer than it (a wide table), or
    text with an unbreakable run longer than it (base64, minified JSON). They stay in the note
    and are quoted, never carried."""
    out: list[Section] = []
    for section in sections:
        blocks = tuple(replace(b, aside=True) if _too_large(b, limit) else b
                       for b in section.blocks)
        out.append(Section(section.heading, blocks))
    return out


def _too_large(block: Block, limit: int) -> bool:
    text = block.text
    if len(text) <= limit:
        return False
    if block.type == "code":
        return block.lang not in SQL_LANGS
    if block.type == "table":  # a row is never cut: one longer than the limit cannot fit
        return any(len(line) > limit for line in block.raw)
    return max((len(w) for w in text.split()), default=0) > limit


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
