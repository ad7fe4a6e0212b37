"""The one Markdown grammar of the pipeline: top-level blocks with exact line ranges.

Authoring (the structural backend) and publishing (fragments) read notes and bodies through
this module, so a fence, a heading or a table is the same thing everywhere. The grammar is
CommonMark with GFM tables and a leading YAML front matter, as markdown-it-py parses it; every
block carries the line range it comes from, and its ``lines`` are those source lines verbatim,
so a slice of a block is always a slice of the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from html.parser import HTMLParser

from markdown_it import MarkdownIt
from markdown_it.token import Token
from mdit_py_plugins.front_matter import front_matter_plugin

# the line breaks markdown-it itself recognizes (its line maps count these)
_NEWLINE = re.compile(r"\r\n|\r|\n")
_ITEM_MARKER = re.compile(r"^\s*(?:[-*+]|\d{1,9}[.)])(?:[ \t]+|$)")

# fence languages that hold SQL (PostgreSQL dialect)
SQL_LANGS = frozenset({"sql", "postgres", "postgresql", "pgsql", "psql"})


class BlockKind(StrEnum):
    front_matter = "front_matter"
    heading = "heading"
    fence = "fence"  # ``` or ~~~ fenced code
    code = "code"  # indented code
    table = "table"
    list = "list"
    quote = "quote"
    html = "html"
    rule = "rule"  # thematic break
    paragraph = "paragraph"
    definition = "definition"  # link reference definitions (markdown-it emits no token)


# blocks whose lines are kept whole: never re-wrapped, never cut at a blank line
VERBATIM = frozenset({BlockKind.front_matter, BlockKind.fence, BlockKind.code, BlockKind.html})
# code blocks: never cut at all
CODE = frozenset({BlockKind.fence, BlockKind.code})

_KINDS = {
    "front_matter": BlockKind.front_matter,
    "heading_open": BlockKind.heading,
    "fence": BlockKind.fence,
    "code_block": BlockKind.code,
    "table_open": BlockKind.table,
    "bullet_list_open": BlockKind.list,
    "ordered_list_open": BlockKind.list,
    "blockquote_open": BlockKind.quote,
    "html_block": BlockKind.html,
    "hr": BlockKind.rule,
    "paragraph_open": BlockKind.paragraph,
}
_NESTED_VERBATIM = {"fence": BlockKind.fence, "code_block": BlockKind.code,
                    "html_block": BlockKind.html}


@dataclass(frozen=True)
class Span:
    """A range of source lines, ``start`` inclusive, ``end`` exclusive (0-based)."""

    start: int
    end: int


@dataclass(frozen=True)
class Block:
    """One top-level block: its kind, its line range and those lines verbatim.

    ``level`` and ``title`` are set for headings, ``info`` for fences (the info string as
    written, e.g. ``sql``), ``closed`` is False for a fence that runs to the end of the text.
    ``items`` are the line ranges of a list's items; ``verbatim`` the ranges of code and HTML
    blocks nested inside a list or quote (``verbatim_kinds`` says which). ``rows`` are a table's
    cells, the header row first, as GFM reads them (every row as wide as the header; an escaped
    pipe is a pipe); an HTML block holding a ``<table>`` has them too, and ``header`` says
    whether its first row is one. ``visible`` is an HTML block's text without tags and comments.
    Trailing blank lines belong to no block.
    """

    kind: BlockKind
    start: int
    end: int
    lines: tuple[str, ...]
    level: int = 0
    title: str = ""
    info: str = ""
    closed: bool = True
    items: tuple[Span, ...] = ()
    verbatim: tuple[Span, ...] = ()
    verbatim_kinds: tuple[BlockKind, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    header: bool = True
    visible: str = ""

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def lang(self) -> str:
        """A fence's language: the first word of its info string, lower case."""
        return self.info.split(maxsplit=1)[0].lower() if self.info.strip() else ""

    @property
    def content(self) -> tuple[str, ...]:
        """A fence's content lines (verbatim, without the fence lines); other blocks: lines."""
        if self.kind is not BlockKind.fence:
            return self.lines
        return self.lines[1:-1] if self.closed and len(self.lines) > 1 else self.lines[1:]

    def item_lines(self) -> list[tuple[str, ...]]:
        """The verbatim lines of each list item (empty for other blocks)."""
        return [self.lines[s.start - self.start:s.end - self.start] for s in self.items]

    def parts(self) -> list[Part]:
        """The block cut at its blank lines, except inside nested code or HTML blocks.

        A verbatim block (fence, indented code, HTML, front matter) is one part.
        """
        if self.kind in VERBATIM:
            return [Part(self.lines, code=self.kind in CODE)]
        keep = {n for s in self.verbatim for n in range(s.start, s.end)}
        code = {n for s, k in zip(self.verbatim, self.verbatim_kinds, strict=True) if k in CODE
                for n in range(s.start, s.end)}
        out: list[Part] = []
        current: list[int] = []
        for n in [*range(self.start, self.end), -1]:
            line = self.lines[n - self.start] if n >= 0 else ""
            if n >= 0 and (not is_blank(line) or n in keep):
                current.append(n)
            elif current:
                out.append(Part(tuple(self.lines[m - self.start] for m in current),
                                code=any(m in code for m in current)))
                current = []
        return out


@dataclass(frozen=True)
class Part:
    """Consecutive lines of a block; ``code`` when they hold (part of) a code block."""

    lines: tuple[str, ...]
    code: bool = False

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def split_lines(text: str) -> list[str]:
    """The text's lines as the grammar counts them (``\\r\\n``, ``\\r`` and ``\\n`` end a line)."""
    return _NEWLINE.split(text)


def heading_text(content: str) -> str:
    """A heading's text as written, without what exporters append to it: inline HTML tags (a
    permalink ``<a class="headerlink">¶</a>``), the pilcrow they leave, an attribute list
    ``{#anchor .class}``."""
    text = _INLINE_TAG.sub("", content) if "<" in content else content
    return _HEADING_TAIL.sub("", text).strip()


_INLINE_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9-]*(?:\s[^<>]*)?/?>")
_HEADING_TAIL = re.compile(r"(?:\s*(?:¶|\{[#.][^{}]*\}))+\s*$")


def is_blank(line: str) -> bool:
    """A blank line as Markdown sees it: nothing but spaces and tabs."""
    return not line.strip(" \t")


def item_text(line: str) -> str:
    """A list item's first line without its marker (``- ``, ``* ``, ``1. ``, ``1) ``)."""
    return _ITEM_MARKER.sub("", line, count=1)


def front_matter_lines(text: str) -> int:
    """How many lines the text's leading front matter spans (0 when it has none)."""
    if not text.startswith("---"):
        return 0
    lines = split_lines(text)
    opener = len(lines[0]) - len(lines[0].lstrip("-"))
    closer = re.compile(rf"(?:\.\.\.| {{0,3}}-{{{opener},}})[ \t]*")
    end = next((n for n in range(1, len(lines)) if closer.fullmatch(lines[n])), None)
    if end is None:
        return 0
    # the parser decides (cheaply: on the lines up to the candidate closer only)
    head = parse_blocks("\n".join(lines[:end + 1]))
    return head[0].end if head and head[0].kind is BlockKind.front_matter else 0


def parse_blocks(text: str) -> list[Block]:
    """The top-level blocks of a Markdown text, in order, with exact line ranges."""
    lines = split_lines(text)
    tokens = _parser().parse(text)
    blocks: list[Block] = []
    covered = 0
    for n, tok in enumerate(tokens):
        if tok.level != 0 or tok.nesting == -1 or tok.map is None:
            continue
        kind = _KINDS.get(tok.type)
        if kind is None:  # pragma: no cover - every block rule of the preset is listed
            continue
        start, end = tok.map
        if start > covered:
            blocks.extend(_definitions(lines, covered, start))
        blocks.append(_block(kind, tok, tokens, n, lines))
        covered = max(covered, end)
    if covered < len(lines):
        blocks.extend(_definitions(lines, covered, len(lines)))
    return blocks


@cache
def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table").use(front_matter_plugin)


def _block(kind: BlockKind, tok: Token, tokens: list[Token], n: int,
           lines: list[str]) -> Block:
    assert tok.map is not None
    start, end = tok.map
    end = _trim(lines, start, end)
    body = tuple(lines[start:end])
    if kind is BlockKind.heading:
        inline = tokens[n + 1]
        return Block(kind, start, end, body, level=int(tok.tag[1]),
                     title=heading_text(inline.content))
    if kind is BlockKind.fence:
        return Block(kind, start, end, body, info=tok.info.strip(),
                     closed=_fence_closed(tok, end - start))
    if kind in {BlockKind.list, BlockKind.quote}:
        close = _closing(tokens, n)
        items: list[Span] = []
        nested: list[Span] = []
        nested_kinds: list[BlockKind] = []
        for inner in tokens[n + 1:close]:
            if inner.map is None:
                continue
            if inner.type == "list_item_open" and inner.level == 1:
                items.append(Span(inner.map[0], _trim(lines, *inner.map)))
            elif inner.type in _NESTED_VERBATIM:
                nested.append(Span(inner.map[0], _trim(lines, *inner.map)))
                nested_kinds.append(_NESTED_VERBATIM[inner.type])
        return Block(kind, start, end, body, items=tuple(items), verbatim=tuple(nested),
                     verbatim_kinds=tuple(nested_kinds))
    if kind is BlockKind.html:
        reader = _HtmlReader(body)
        return Block(kind, start, end, body, rows=tuple(reader.rows), header=reader.header,
                     visible=reader.visible)
    if kind is BlockKind.table:
        rows: list[tuple[str, ...]] = []
        for inner in tokens[n + 1:_closing(tokens, n)]:
            if inner.type == "tr_open":
                rows.append(())
            elif inner.type == "inline" and rows:
                rows[-1] = (*rows[-1], inner.content.strip())
        return Block(kind, start, end, body, rows=tuple(rows))
    return Block(kind, start, end, body)


class _HtmlReader(HTMLParser):
    """The visible text of an HTML block and the cells of the first table in it."""

    def __init__(self, lines: tuple[str, ...]) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.rows: list[tuple[str, ...]] = []
        self.header = False
        self._cell: list[str] | None = None
        self._tables = 0  # depth; only the outermost table's cells are read
        self._done = False
        self.feed("\n".join(lines))
        self.close()

    @property
    def visible(self) -> str:
        return " ".join("".join(self.text).split())

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._tables += 1
        elif self._tables == 1 and not self._done:
            if tag == "tr":
                self.rows.append(())
            elif tag in {"td", "th"} and self.rows:
                self._cell = []
                self.header = self.header or (tag == "th" and len(self.rows) == 1)
        if tag in {"br", "p", "div", "li", "tr", "td", "th"}:
            self._space()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "br":
            self._space()

    def _space(self) -> None:
        self.text.append(" ")
        if self._cell is not None:
            self._cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in {"td", "th"} and self._cell is not None and self.rows:
            self.rows[-1] = (*self.rows[-1], " ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "table" and self._tables:
            self._tables -= 1
            self._done = self._done or (self._tables == 0 and bool(self.rows))
        if tag in {"p", "div", "li", "td", "th"}:
            self._space()

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def _fence_closed(tok: Token, n_lines: int) -> bool:
    # content lines + the opening line; one line more is the closing fence
    return n_lines >= tok.content.count("\n") + 2


def _closing(tokens: list[Token], n: int) -> int:
    depth = 0
    for m in range(n, len(tokens)):
        depth += tokens[m].nesting
        if depth == 0:
            return m
    return len(tokens)  # pragma: no cover - markdown-it always closes what it opens


def _trim(lines: list[str], start: int, end: int) -> int:
    """``end`` moved back over trailing blank lines (never before ``start + 1``)."""
    end = min(end, len(lines))
    while end > start + 1 and is_blank(lines[end - 1]):
        end -= 1
    return end


def _definitions(lines: list[str], start: int, end: int) -> list[Block]:
    """Non-blank lines no token covers (link reference definitions), one block per run."""
    out: list[Block] = []
    n = start
    while n < end:
        if is_blank(lines[n]):
            n += 1
            continue
        m = n
        while m < end and not is_blank(lines[m]):
            m += 1
        out.append(Block(BlockKind.definition, n, m, tuple(lines[n:m])))
        n = m
    return out
