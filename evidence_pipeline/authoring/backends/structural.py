"""The ``structural`` backend: deterministic restructuring by the structure a note shows.

No model is called and no text is invented. A note is split along headings into sections, and
sections along their structured blocks (SQL code blocks, tables, code lists, glossary lists,
link lists). Each piece is classified by what it visibly holds, from the most structured kind to
the fallback (spec §4.2); every structured field is a verbatim slice of the note, every excerpt a
verbatim slice of the normalized text. Wherever the structure leaves doubt, the unit carries a
review item. It is for offline demos, CI and benchmarks; messy notes need a real model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp

from evidence_pipeline.authoring.backends.base import (
    ModelReply,
    ModelRequest,
    reply_from_data,
)
from evidence_pipeline.authoring.normalize import canonical, excerpt_in_source
from evidence_runtime.units import MAX_EXCERPT_CHARS, MAX_EXCERPTS, EvidenceKind, EvidencePurpose

K = EvidenceKind
P = EvidencePurpose

# Fixed purposes per kind, in the order of EvidencePurpose.
PURPOSES: dict[EvidenceKind, tuple[EvidencePurpose, ...]] = {
    K.formula: (P.schema_linking, P.sql_generation),
    K.enum: (P.schema_linking, P.sql_generation),
    K.mapping: (P.schema_linking,),
    K.normalization: (P.rewriting, P.sql_generation),
    K.glossary: (P.disambiguation, P.rewriting),
    K.domain: (P.rewriting, P.sql_generation),
    K.example: (P.rewriting, P.sql_generation),
    K.reference: (P.disambiguation,),
}

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
TOO_LARGE = "atomic_content_too_large"

SQL_LANGS = frozenset({"sql", "postgres", "postgresql", "pgsql", "psql"})

# ---------------------------------------------------------------------------------------------
# Recognizers (patterns of structure, never of meaning beyond a few fixed cue words)
# ---------------------------------------------------------------------------------------------

_HEADING = re.compile(r"^(#{1,6}) (.*)$")
_FENCE = re.compile(r"^\s*```([A-Za-z0-9_+-]*)\s*$")
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_TABLE_SEP = re.compile(r"^\s*\|(?:\s*:?-+:?\s*\|)+\s*$")
_ITEM = re.compile(r"^(\s*)(?:- |\d{1,3}\. )")
_URL = re.compile(r"https?://[^\s<>)\]\"']+")
_MD_LINK = re.compile(r"\[([^\]]+)\]\((https?://[^\s)]+)\)")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_REF = re.compile(rf"(?<![\w.$/@-])({_IDENT}(?:\.{_IDENT}){{1,2}})(?![\w$(]|\.[A-Za-z0-9_])")
_FILE_EXT = frozenset({"md", "txt", "sql", "yaml", "yml", "json", "csv", "html", "htm", "pdf",
                       "py", "xml", "png", "jpg", "jsp", "php", "it", "org", "com"})
_PLACEHOLDERS = frozenset({"schema", "tabella", "table", "colonna", "column", "tab", "col"})
_COLUMNISH = re.compile(r"_(?:id|ts|date|code|no|type|status|role|name|at|flag)$")
_ARROW = re.compile(r"\s*(?:->|→|=>)\s*")
_SENTENCE_END = re.compile(r"[.!?;:,]+$")

_ENUM_LINE = re.compile(
    r"^(?:- |\d{1,3}\. )?(?P<code>'[^']{1,20}'|\"[^\"]{1,20}\"|`[^`]{1,20}`|[A-Za-z0-9_]{1,12})"
    r"\s*(?:=|:|→|->|–|-)\s+(?P<meaning>\S.*)$")
_ENUM_LINE_BARE = re.compile(r"^(?P<code>[A-Z0-9]{1,3}) (?P<meaning>[a-zà-ÿ(].*)$")
_INLINE_ENUM = re.compile(rf"^(?P<col>{_IDENT}\.{_IDENT}\.{_IDENT})\s*:\s*(?P<items>.+)$")
_INLINE_ITEM = re.compile(
    r"^\s*(?P<code>'[^']{1,20}'|\"[^\"]{1,20}\"|`[^`]{1,20}`|[A-Z0-9]{1,6})\s*(?:=\s*)?"
    r"(?P<meaning>\S.*?)\s*\.?$")
_GLOSS_ITEM = re.compile(r"^(?P<term>[^:=,;.]{1,60}?)\s*(?::|=)\s+(?P<definition>\S.*)$")

_LABEL = re.compile(
    r"^(?:\*\*)?(?P<label>regol[ae]|condizion[ei]|eccezion[ei]|esclus[io]|esclusioni|"
    r"rule|conditions?|exceptions?)(?:\*\*)?\s*:\s*(?P<rest>.*)$", re.IGNORECASE)
_QUESTION_LABEL = re.compile(
    r"^(?:\*\*)?(?:domanda|question|q)\b[^:]{0,60}:(?:\*\*)?\s*(?P<q>\S.*)$", re.IGNORECASE)
_INTERP_LABEL = re.compile(
    r"^(?:\*\*)?(?:interpretazione|lettura(?: concordata)?|interpretation|significato)\b"
    r"[^:]{0,40}:(?:\*\*)?\s*(?P<i>\S.*)$", re.IGNORECASE)
_SYNONYMS = re.compile(r"\b(?:sinonimi|synonyms)\b(?P<rest>[^.\n]*(?:\.(?=\S)[^.\n]*)*)",
                       re.IGNORECASE)
_NORMALIZATION_CUE = re.compile(
    r"normaliz|uniform|standardiz|\bformat|\bvariant|ricondur|convertit", re.IGNORECASE)
_RAW_HEADER = re.compile(r"prima|grezz|origin|\braw\b|input|come lo scriv|scritt|storico",
                         re.IGNORECASE)
_RULE_CUE = re.compile(
    r"\b(?:deve|devono|va|vanno|bisogna|occorre|sempre|mai|solo|soltanto|non può|"
    r"non possono|esclus\w*|inclus\w*|si calcola|si calcolano|si usa|si usano|si conta|"
    r"si contano|non usar\w*|usare|must|always|never|only)\b", re.IGNORECASE)
_DEONTIC = re.compile(
    r"\b(?:deve|devono|va|vanno|bisogna|occorre|non può|non possono|esclus\w*|regola|"
    r"non usar\w*|must|never)\b", re.IGNORECASE)
_AMBIGUITY = re.compile(
    r"\b(?:forse|dipende|non (?:è|e') chiaro|non chiaro|da verificare|da chiarire|di solito|"
    r"di norma|probabilmente|non è detto|boh|TODO|TBD|maybe|unclear|it depends|"
    r"nota vecchia|obsolet[aoie]|superat[aoie]|deprecat\w*)\b|\?",
    re.IGNORECASE)
_ARTICLE = r"(?:(?:il|lo|la|i|gli|le|un|uno|una|the|an|a)\s+|l'|un')?"
_DEF_VERB = r"(?:è|sono|indica|indicano|significa|significano|=|is|means)"


@dataclass(frozen=True)
class Block:
    """One structural block of the normalized text (verbatim lines)."""

    type: str  # heading | para | list | table | code
    lines: tuple[str, ...]  # content lines (code: without fences)
    raw: tuple[str, ...]  # the lines as they stand in the text (code: with fences)
    lang: str = ""
    level: int = 0

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def flat(self) -> str:
        return " ".join(line.strip() for line in self.lines if line.strip())

    def items(self) -> list[tuple[str, tuple[str, ...]]]:
        """List items: (item text without its marker, joined with continuations; raw lines)."""
        out: list[tuple[str, tuple[str, ...]]] = []
        for line in self.lines:
            m = _ITEM.match(line)
            if m and len(m.group(1)) <= 1:
                out.append((line[m.end():].strip(), (line,)))
            elif out:
                text, raw = out[-1]
                out[-1] = (f"{text} {line.strip()}", (*raw, line))
        return out


@dataclass(frozen=True)
class Section:
    heading: str | None
    blocks: tuple[Block, ...]


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
        return [b for b in self.blocks if b.type in {"para", "list"} and b is not self.anchor]


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

    @property
    def key(self) -> str:
        return _key(self.kind, self.block)


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


class StructuralBackend:
    """Deterministic restructuring without a model; never invents text."""

    name = "structural"

    def restructure(self, request: ModelRequest) -> ModelReply:
        text = request.normalized_text
        refs = _Refs(text)
        drafts: list[Draft] = []
        for section in parse_sections(text):
            for piece in split_section(section, refs):
                drafts.append(classify(piece, refs, request))
        for d in drafts:
            _check_sizes(d, request.max_chunk_chars)
        units, retire = _match_previous(drafts, request)
        return reply_from_data({"units": units, "retirement_candidates": retire}, request)


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------


def parse_blocks(text: str) -> list[Block]:
    """Split normalized Markdown into headings, paragraphs, lists, tables and code blocks."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    blocks: list[Block] = []
    i = 0
    # a first line that is obviously a title (short, unpunctuated, more text follows)
    first = next((n for n, line in enumerate(lines) if line.strip()), None)
    if first is not None and _looks_like_title(lines[first]) and any(
            line.strip() for line in lines[first + 1:]):
        blocks.append(Block("heading", (lines[first].strip(),), (lines[first],), level=1))
        i = first + 1
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence:
            j = i + 1
            while j < len(lines) and not _FENCE.match(lines[j]):
                j += 1
            content = tuple(lines[i + 1:j])
            blocks.append(Block("code", content, tuple(lines[i:j + 1]), lang=fence.group(1)))
            i = j + 1
            continue
        heading = _HEADING.match(line)
        if heading:
            blocks.append(Block("heading", (heading.group(2).strip(),), (line,),
                                level=len(heading.group(1))))
            i += 1
            continue
        if _TABLE_ROW.match(line):
            j = i
            while j < len(lines) and _TABLE_ROW.match(lines[j]):
                j += 1
            blocks.append(Block("table", tuple(lines[i:j]), tuple(lines[i:j])))
            i = j
            continue
        if _ITEM.match(line):
            j = i + 1
            while j < len(lines) and lines[j].strip() and (
                    _ITEM.match(lines[j]) or lines[j].startswith((" ", "\t"))):
                j += 1
            blocks.append(Block("list", tuple(lines[i:j]), tuple(lines[i:j])))
            i = j
            continue
        j = i + 1
        while j < len(lines) and lines[j].strip() and not (
                _FENCE.match(lines[j]) or _HEADING.match(lines[j])
                or _TABLE_ROW.match(lines[j]) or _ITEM.match(lines[j])):
            j += 1
        blocks.append(Block("para", tuple(lines[i:j]), tuple(lines[i:j])))
        i = j
    return blocks


def _looks_like_title(line: str) -> bool:
    s = line.strip()
    if not s or s.startswith(("#", "-", "|", "```", ">", "*", "+")) or re.match(r"\d+[.)]", s):
        return False
    if _URL.search(s) or s.endswith((".", ":", ";", ",", "?", "!")):
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


# ---------------------------------------------------------------------------------------------
# Table and column references
# ---------------------------------------------------------------------------------------------


class _Refs:
    """Recognizable ``schema.table`` and ``schema.table.column`` references of one note."""

    def __init__(self, text: str) -> None:
        found = [m for m in _raw_refs(text)]
        self.schemas = {r.split(".")[0] for r in found if r.count(".") == 2}
        self.table_names = {r.split(".")[1] for r in found if r.count(".") >= 1}

    def find(self, text: str) -> tuple[list[str], list[str]]:
        """(tables, columns) referenced in ``text``, in order of appearance, verbatim."""
        tables: list[str] = []
        columns: list[str] = []
        for ref in _raw_refs(text):
            parts = ref.split(".")
            if len(parts) == 3:
                _add(columns, ref)
                _add(tables, ".".join(parts[:2]))
            elif parts[0] in self.schemas or (
                    not _COLUMNISH.search(parts[1]) and parts[0] not in self.table_names):
                _add(tables, ref)
        return tables, columns


def _raw_refs(text: str) -> Iterable[str]:
    text = _URL.sub(" ", text)
    for m in _REF.finditer(text):
        ref = m.group(1)
        parts = ref.split(".")
        if parts[-1].lower() in _FILE_EXT or any(len(p) < 2 for p in parts) or \
                parts[0].lower() in _PLACEHOLDERS:
            continue
        yield ref


def _add(values: list[str], value: str) -> None:
    if value and value not in values:
        values.append(value)


# ---------------------------------------------------------------------------------------------
# Splitting a section into pieces
# ---------------------------------------------------------------------------------------------


def split_section(section: Section, refs: _Refs) -> list[Piece]:
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


def _block_role(block: Block, before: Block | None, heading: str | None, refs: _Refs) -> str:
    if block.type == "code":
        return "sql" if block.lang.lower() in SQL_LANGS else "prose"
    if block.type == "table":
        return "table" if len(_table_rows(block)[1]) >= 1 else "prose"
    if block.type == "para" and len(block.lines) == 1 and _inline_enum(block.lines[0]):
        return "inline_enum"
    if block.type in {"para", "list"} and _enum_lines(block) is not None:
        near = " ".join(x for x in (heading or "", before.flat if before else ""))
        if refs.find(near)[1]:
            return "enum_lines"
    if block.type == "list":
        items = block.items()
        if items and all(len(_URL.findall(text)) == 1 for text, _ in items):
            return "ref_list"
        label = _LABEL.match(before.flat) if before is not None and before.type == "para" else None
        if len(items) >= 2 and label is None and all(_gloss_item(text, refs) for text, _ in items):
            return "gloss_list"
    return "prose"


def _table_rows(block: Block) -> tuple[list[str], list[list[str]]]:
    """(header cells, data rows) of a Markdown table."""
    rows = [line.strip()[1:-1].split("|") for line in block.lines if not _TABLE_SEP.match(line)]
    rows = [[c.strip() for c in row] for row in rows]
    has_header = len(block.lines) >= 2 and bool(_TABLE_SEP.match(block.lines[1]))
    if has_header:
        return rows[0], rows[1:]
    return [], rows


def _enum_lines(block: Block) -> dict[str, str] | None:
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
        values.setdefault(_unquote(m.group("code")), _trim(m.group("meaning")))
    return values


def _inline_enum(line: str) -> tuple[str, dict[str, str]] | None:
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
        values.setdefault(_unquote(item.group("code")), _trim(item.group("meaning")))
    return m.group("col"), values


def _gloss_item(text: str, refs: _Refs) -> tuple[str, str] | None:
    m = _GLOSS_ITEM.match(text)
    if m is None:
        return None
    term, definition = m.group("term").strip(), m.group("definition").strip()
    if len(term.split()) > 5 or _URL.search(text) or any(refs.find(definition)):
        return None
    return _unemph(term), definition


# ---------------------------------------------------------------------------------------------
# Classification
# ---------------------------------------------------------------------------------------------


def classify(piece: Piece, refs: _Refs, request: ModelRequest) -> Draft:
    """The kind and fields of one piece, with review items wherever it is not sure."""
    if piece.role == "gloss_item":
        draft = _gloss_item_draft(piece, refs)
    elif piece.role == "ref_item":
        draft = _ref_item_draft(piece, refs)
    elif piece.role == "inline_enum":
        draft = _inline_enum_draft(piece, refs)
    elif piece.role == "sql":
        draft = _sql_draft(piece, refs)
    elif piece.role in {"table", "enum_lines"}:
        draft = _table_or_lines_draft(piece, refs)
    else:
        draft = _prose_draft(piece, refs)
    _flag_ambiguity(piece, draft)
    draft.excerpts = _excerpts(piece, request.normalized_text)
    draft.texts = _block_texts(piece)
    return draft


def _new(kind: EvidenceKind, piece: Piece, title: str, block: dict[str, Any],
         refs: _Refs, *, concepts: Sequence[str] = (), extra_text: str = "") -> Draft:
    tables, columns = refs.find("\n".join([_piece_text(piece), extra_text]))
    return Draft(kind=kind, title=title, block=block, excerpts=[], body=_body(piece),
                 concepts=[c for c in concepts if c], tables=tables, columns=columns)


def _title(piece: Piece, key: str | None = None) -> str:
    """The heading, or the piece's own key when its section yields several pieces."""
    if piece.heading and not (piece.shared and key):
        return _unemph(piece.heading)
    if key:
        return key
    return _first_words(_piece_text(piece))


# --- anchors ----------------------------------------------------------------------------------


def _sql_draft(piece: Piece, refs: _Refs) -> Draft:
    assert piece.anchor is not None
    sql = piece.anchor.text.strip("\n")
    shape, tree = _sql_shape(sql)
    if shape == "expression":
        assert tree is not None
        columns = _formula_columns(tree, piece, refs)
        concept = _unemph(piece.heading) if piece.heading else None
        if columns:
            draft = _new(K.formula, piece, _title(piece, concept), {
                "concept": concept or _first_words(_prose_text(piece) or sql),
                "columns": columns, "sql": sql}, refs, concepts=[concept or ""])
            if concept is None:
                draft.flag(FIELD_UNCERTAIN, "The note has no heading naming the formula; the "
                           "concept is the first words of the text.", "formula.concept")
            return draft
        draft = _domain_fallback(piece, refs)
        draft.flag(UNCERTAIN, "The SQL block is one expression, but its input columns are not "
                   "written as schema.table.column in the note, so it cannot be a formula.",
                   "kind")
        return draft
    if shape == "query":
        question, from_heading = _question(piece)
        if question:
            interpretation = _interpretation(piece, question)
            draft = _new(K.example, piece, _title(piece, question), {
                "question": question,
                "interpretation": interpretation or question,
                "sql": sql}, refs, extra_text="\n".join(_sql_tables(tree)))
            for t in _sql_tables(tree):
                _add(draft.tables, t)
            if from_heading:
                draft.flag(FIELD_UNCERTAIN, "No question is written as such; the heading is "
                           "taken as the question.", "example.question")
            if not interpretation:
                draft.flag(FIELD_UNCERTAIN, "The note does not say how the question is to be "
                           "read; the interpretation repeats the question.",
                           "example.interpretation")
            return draft
        draft = _domain_fallback(piece, refs)
        draft.flag(UNCERTAIN, "A full SQL query without a documented question: neither an "
                   "example nor a formula.", "kind")
        return draft
    draft = _domain_fallback(piece, refs)
    draft.flag(UNCERTAIN, "The SQL block is neither one composable expression nor one query "
               "(a legacy formula?).", "kind")
    return draft


def _table_or_lines_draft(piece: Piece, refs: _Refs) -> Draft:
    assert piece.anchor is not None
    anchor = piece.anchor
    header: list[str] = []
    rows: list[list[str]] = []
    if piece.role == "table":
        header, rows = _table_rows(anchor)
    else:
        values = _enum_lines(anchor) or {}
        rows = [[code, meaning] for code, meaning in values.items()]
    heading_text = piece.heading or ""
    context = "\n".join([heading_text, *(b.text for b in piece.prose)])
    raw_header = bool(header) and bool(_RAW_HEADER.search(header[0]))
    if raw_header and len(header) >= 2:
        return _normalization_draft(piece, refs, rows=rows)
    column = _enum_column(piece, refs, header)
    code_like = rows and all(r and _is_code(_unquote(r[0])) for r in rows)
    if column and code_like and all(len(r) >= 2 for r in rows):
        return _enum_draft(piece, refs, column, header, rows)
    if _NORMALIZATION_CUE.search(heading_text) or (
            _NORMALIZATION_CUE.search(context) and piece.role == "table"):
        return _normalization_draft(piece, refs, rows=rows)
    if refs.find(anchor.text)[0]:
        return _mapping_draft(piece, refs)
    draft = _domain_fallback(piece, refs)
    draft.flag(UNCERTAIN, "A table that is neither codes of a recognizable column, nor "
               "normalization examples, nor a mapping to schema.table references.", "kind")
    return draft


def _enum_column(piece: Piece, refs: _Refs, header: list[str]) -> str | None:
    """The column the codes belong to: in the heading, else in the text just before."""
    assert piece.anchor is not None
    candidates: list[str] = []
    for text in (piece.heading or "", _before_anchor(piece)):
        for col in refs.find(text)[1]:
            _add(candidates, col)
        if candidates:
            break
    if not candidates:
        return None
    if header:
        named = [c for c in candidates if c.split(".")[-1] == _unquote(header[0])]
        if named:
            return named[0]
    return candidates[0]


def _before_anchor(piece: Piece) -> str:
    out = ""
    for b in piece.blocks:
        if b is piece.anchor:
            return out
        if b.type in {"para", "list"}:
            out = b.text
    return out


def _enum_draft(piece: Piece, refs: _Refs, column: str, header: list[str],
                rows: list[list[str]]) -> Draft:
    values: dict[str, str] = {}
    duplicates: list[str] = []
    empty: list[str] = []
    for row in rows:
        code, meaning = _unquote(row[0]), _trim(row[1])
        if not meaning:
            empty.append(code)
            continue
        if code in values:
            duplicates.append(code)
            continue
        values[code] = meaning
    draft = _new(K.enum, piece, _title(piece, column), {"column": column, "values": values},
                 refs)
    _add(draft.columns, column)
    _add(draft.tables, column.rsplit(".", 1)[0])
    candidates = refs.find("\n".join([piece.heading or "", _before_anchor(piece)]))[1]
    if len(candidates) > 1:
        draft.flag(FIELD_UNCERTAIN, f"Several columns are named near the codes "
                   f"({', '.join(candidates)}); {column} was chosen.", "enum.column")
    if len(header) > 2:
        draft.flag(FIELD_UNCERTAIN, "The table has more than two columns; only the first is "
                   f"kept as the meaning (not carried: {', '.join(header[2:])}).", "enum.values")
    if duplicates:
        draft.flag(FIELD_UNCERTAIN, f"Codes listed twice: {', '.join(duplicates)}; the first "
                   "meaning was kept.", "enum.values")
    if empty:
        draft.flag(FIELD_UNCERTAIN, f"Codes without a meaning: {', '.join(empty)}.",
                   "enum.values")
    return draft


def _inline_enum_draft(piece: Piece, refs: _Refs) -> Draft:
    assert piece.anchor is not None
    found = _inline_enum(piece.anchor.lines[0])
    assert found is not None
    column, values = found
    rows = [[code, meaning] for code, meaning in values.items()]
    return _enum_draft(piece, refs, column, [], rows)


def _gloss_item_draft(piece: Piece, refs: _Refs) -> Draft:
    assert piece.item is not None
    found = _gloss_item(piece.item, refs)
    assert found is not None
    term, definition = found
    return _new(K.glossary, piece, term, {"term": term, "definition": definition,
                                          "synonyms": []}, refs, concepts=[term])


def _ref_item_draft(piece: Piece, refs: _Refs) -> Draft:
    assert piece.item is not None
    text = piece.item
    link = _MD_LINK.search(text)
    if link:
        label, url = link.group(1).strip(), link.group(2)
        before, after = text[:link.start()], text[link.end():]
    else:
        m = _URL.search(text)
        assert m is not None
        url = _trim(m.group(0))
        before, after = text[:m.start()], text[m.end():]
        label = _strip_joiners(before)
    description = _strip_joiners(after)
    draft = _new(K.reference, piece, "", {}, refs)
    if not label:
        label = _unemph(piece.heading) if piece.heading else url
        draft.flag(FIELD_UNCERTAIN, "The link has no label of its own.", "reference.label")
    if not description:
        description = _strip_joiners(before) or label
        draft.flag(FIELD_UNCERTAIN, "The note does not describe the link; the description "
                   "repeats its label.", "reference.description")
    draft.title = label
    draft.block = {"url": url, "label": label, "description": description}
    return draft


# --- prose ------------------------------------------------------------------------------------


def _prose_draft(piece: Piece, refs: _Refs) -> Draft:
    text = _prose_text(piece)
    examples = _arrow_examples(piece)
    heading = piece.heading or ""
    first = piece.prose[0] if piece.prose else None
    first_text = first.flat if first is not None else ""
    if examples and (_NORMALIZATION_CUE.search(heading) or _NORMALIZATION_CUE.search(text) or (
            len(examples) >= 2 and "mapping" not in heading.lower()
            and not any(refs.find(e["normalized"])[0] for e in examples))):
        return _normalization_draft(piece, refs, examples=examples)
    question = _question(piece, strict=True)[0]
    labelled = _labelled_interpretation(piece)
    if question and labelled:  # a documented question without SQL
        return _new(K.example, piece, _title(piece, question), {
            "question": question, "interpretation": labelled}, refs)
    if any(_LABEL.match(line.strip()) for b in piece.prose for line in b.lines):
        return _domain_draft(piece, refs)
    glossary = _glossary(piece, refs)
    if glossary is not None:
        return glossary
    reference = _reference(piece, refs)
    if reference is not None:
        return reference
    if first is not None and any(refs.find(first.text)) and not _DEONTIC.search(first_text):
        return _mapping_draft(piece, refs)
    if _NORMALIZATION_CUE.search(heading):
        return _normalization_draft(piece, refs, examples=examples)
    if _RULE_CUE.search(text):
        return _domain_draft(piece, refs)
    draft = _domain_fallback(piece, refs)
    draft.flag(UNCERTAIN, "No structure of a more specific kind was recognized; classified "
               "as domain by fallback.", "kind")
    return draft


def _domain_draft(piece: Piece, refs: _Refs) -> Draft:
    paragraphs: list[str] = []
    conditions: list[str] = []
    exceptions: list[str] = []
    explicit_rule: str | None = None
    blocks = piece.prose
    n = 0
    while n < len(blocks):
        block = blocks[n]
        nxt = blocks[n + 1] if n + 1 < len(blocks) else None
        if block.type == "list":
            paragraphs.append(block.flat)
            n += 1
            continue
        plain: list[str] = []
        pending: str | None = None  # a label ("Condizioni:") whose items follow as a list
        for line in block.lines:
            m = _LABEL.match(line.strip())
            if m is None:
                if line.strip():
                    plain.append(line.strip())
                continue
            target, rest = _label_target(m.group("label")), _trim(m.group("rest"))
            if not rest:
                pending = target
            elif target == "rule":
                explicit_rule = explicit_rule or rest
            else:
                (conditions if target == "conditions" else exceptions).append(rest)
        if plain and not _is_aside(" ".join(plain)):
            paragraphs.append(" ".join(plain))
        if pending and nxt is not None and nxt.type == "list":
            items = [_trim(t) for t, _ in nxt.items()]
            if pending == "rule":
                explicit_rule = explicit_rule or nxt.flat
            else:
                (conditions if pending == "conditions" else exceptions).extend(items)
            n += 2
            continue
        n += 1
    rule = explicit_rule or (paragraphs[0] if paragraphs else "") or _piece_text(piece).strip()
    return _new(K.domain, piece, _title(piece), {
        "rule": rule, "conditions": conditions, "exceptions": exceptions}, refs)


def _is_aside(text: str) -> bool:
    """A paragraph that is only a parenthetical remark, e.g. "(nota vecchia …)"."""
    return text.startswith("(") and text.endswith(")") and _balanced(text[1:-1])


def _label_target(label: str) -> str:
    label = label.lower()
    if label.startswith(("regol", "rule")):
        return "rule"
    if label.startswith(("condizion", "condition")):
        return "conditions"
    return "exceptions"


def _domain_fallback(piece: Piece, refs: _Refs) -> Draft:
    draft = _domain_draft(piece, refs)
    draft.title = _title(piece)
    return draft


def _glossary(piece: Piece, refs: _Refs) -> Draft | None:
    first = next((b for b in piece.prose if b.type == "para"), None)
    if first is None:
        return None
    paragraph = first.flat
    term = _defined_term(paragraph[:300], piece.heading)
    if term is None:
        return None
    synonyms, synonyms_span = _synonyms(piece, term)
    definition = paragraph
    if synonyms_span is not None and synonyms_span[0] in paragraph:
        cut = paragraph.index(synonyms_span[0])
        # only a trailing "Sinonimi: …" sentence is cut off the definition
        if cut > 0 and paragraph[:cut].rstrip().endswith((".", ";")) and \
                paragraph[cut:].strip() == synonyms_span[0].strip():
            definition = paragraph[:cut].strip()
    draft = _new(K.glossary, piece, _title(piece, term), {
        "term": term, "definition": definition, "synonyms": synonyms}, refs, concepts=[term])
    return draft


def _defined_term(sentence: str, heading: str | None) -> str | None:
    """The term a definitional sentence defines, as written in it (or None)."""
    variants = _heading_variants(heading)
    term_alt = r"\*\*[^*]{1,60}\*\*"
    if variants:
        term_alt += "|" + "|".join(variants)
    patterns = [
        r"^(?:per|con)\s+(?P<span>.{1,120}?)\s+si\s+intend",
        rf"(?:^|[.;:]\s+|\b(?:nel dwh|in generale|in questo contesto),?\s+){_ARTICLE}"
        rf"(?P<term>{term_alt})\s+{_DEF_VERB}\s",
        rf"\bsi\s+parla\s+di\s+(?P<term>{term_alt})",
        rf"^(?P<term>{term_alt})\s*(?:=|:)\s",
    ]
    for pattern in patterns:
        m = re.search(pattern, sentence, re.IGNORECASE)
        if m is None:
            continue
        if "span" in m.groupdict() and m.group("span") is not None:
            span = m.group("span")
            bold = re.search(r"\*\*([^*]{1,60})\*\*", span)
            if bold:
                return bold.group(1).strip()
            for v in variants:
                found = re.search(v, span, re.IGNORECASE)
                if found:
                    return found.group(0)
            if len(span.split()) <= 6:
                return _unemph(span.strip())
            continue
        return _unemph(m.group("term")).strip()
    return None


def _heading_variants(heading: str | None) -> list[str]:
    """Regexes for the term(s) a heading names (split on / - — and parentheses)."""
    if not heading:
        return []
    out: list[str] = []
    for part in re.split(r"\s+[-—–]\s+|\s*/\s*|[()]|,", _unemph(heading)):
        words = part.strip().split()
        if not words or len(words) > 6:
            continue
        pats = []
        for w in words:
            w_esc = re.escape(w)
            if len(w) > 4 and w[-1].lower() in "aeio":
                w_esc = re.escape(w[:-1]) + "[aeio]"
            pats.append(w_esc)
        out.append(r"\b" + r"\s+".join(pats) + r"\b")
    return out


def _synonyms(piece: Piece, term: str) -> tuple[list[str], tuple[str, ...] | None]:
    """Synonyms only where the note literally lists them ("Sinonimi: a, b")."""
    for block in piece.prose:
        m = _SYNONYMS.search(block.flat)
        if m is None:
            continue
        rest = m.group("rest")
        quoted = re.findall(r"\"([^\"]{1,60})\"|“([^”]{1,60})”", rest)
        if quoted and not rest.lstrip().startswith(":"):
            items = [a or b for a, b in quoted]
        elif ":" in rest:
            items = re.split(r"\s*[,;]\s*", rest.split(":", 1)[1])
        else:
            continue
        out: list[str] = []
        for item in items:
            item = re.sub(r"\s*\([^)]*\)\s*$", "", item.strip())
            item = _unquote(_trim(item))
            if item and item.lower() != term.lower() and len(item.split()) <= 6:
                _add(out, item)
        sentence = block.flat[m.start():]
        return out, (sentence,)
    return [], None


def _reference(piece: Piece, refs: _Refs) -> Draft | None:
    text = _prose_text(piece)
    urls = _URL.findall(text)
    if len(urls) != 1:
        return None
    alone = None
    for block in piece.prose:
        for line in block.lines:
            s = line.strip().removeprefix("- ").strip("<>")
            link = _MD_LINK.fullmatch(s)
            if _URL.fullmatch(s) or link:
                alone = (line, link)
    if alone is None:
        return None
    line, link = alone
    url = link.group(2) if link else _trim(alone[0].strip().removeprefix("- ").strip("<>"))
    label = link.group(1) if link else (_unemph(piece.heading) if piece.heading else "")
    description = " ".join(
        ln.strip() for b in piece.prose for ln in b.lines if ln is not line and ln.strip())
    draft = _new(K.reference, piece, "", {}, refs)
    if not label:
        label = url
        draft.flag(FIELD_UNCERTAIN, "The link has no label of its own.", "reference.label")
    if not description:
        description = label
        draft.flag(FIELD_UNCERTAIN, "The note does not describe the link.",
                   "reference.description")
    draft.title = _title(piece, label)
    draft.block = {"url": url, "label": label, "description": description}
    return draft


def _mapping_draft(piece: Piece, refs: _Refs) -> Draft:
    concept = _mapping_concept(piece.heading)
    draft = _new(K.mapping, piece, "", {}, refs, concepts=[concept or ""])
    if concept is None:
        concept = _first_words(_prose_text(piece) or _piece_text(piece))
        draft.flag(FIELD_UNCERTAIN, "The note has no heading naming the concept; the concept "
                   "is the first words of the text.", "mapping.concept")
    draft.title = _title(piece, concept)
    draft.block = {"concept": concept, "tables": list(draft.tables),
                   "columns": list(draft.columns)}
    return draft


def _mapping_concept(heading: str | None) -> str | None:
    if not heading:
        return None
    concept = re.sub(r"^mapping\s*:?\s*", "", _unemph(heading), flags=re.IGNORECASE).strip()
    return concept or _unemph(heading)


def _normalization_draft(piece: Piece, refs: _Refs, *, rows: list[list[str]] | None = None,
                         examples: list[dict[str, str]] | None = None) -> Draft:
    if examples is None:
        examples = _arrow_examples(piece)
    for row in rows or []:
        if len(row) >= 2 and _unquote(row[0]) and _unquote(row[-1]):
            ex = {"raw": _unquote(row[0]), "normalized": _unquote(row[-1])}
            if ex not in examples:
                examples.append(ex)
    example_lines = {line for b in piece.prose for line in b.lines if _line_examples(line)}
    rule_paras = [b for b in piece.prose
                  if not all(line in example_lines for line in b.lines)
                  and not re.fullmatch(r"(?i)(?:es\.|esempi|esempio|examples?)\s*:?", b.flat)]
    rule = " ".join(line.strip() for line in (rule_paras[0].lines if rule_paras else ())
                    if line not in example_lines and line.strip())
    subject = _unemph(piece.heading) if piece.heading else None
    draft = _new(K.normalization, piece, "", {}, refs, concepts=[subject or ""])
    if rows and any(len(r) > 2 for r in rows):
        draft.flag(FIELD_UNCERTAIN, "The table has more than two columns; the first is taken "
                   "as the raw value and the last as the normalized one.",
                   "normalization.examples")
    if subject is None:
        subject = (draft.columns[:1] or [_first_words(_piece_text(piece))])[0]
        draft.flag(FIELD_UNCERTAIN, "The note has no heading naming what is normalized.",
                   "normalization.subject")
    if not rule:
        rule = subject
        draft.flag(FIELD_UNCERTAIN, "The note gives examples but does not state the rule.",
                   "normalization.rule")
    draft.title = _title(piece, subject)
    draft.block = {"subject": subject, "rule": rule, "examples": examples}
    return draft


def _arrow_examples(piece: Piece) -> list[dict[str, str]]:
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
        raw, normalized = _unquote_code(raw.strip()), _unquote_code(normalized.strip())
        if raw and normalized and all(len(x) <= 120 and _balanced(x) for x in (raw, normalized)):
            out.append({"raw": raw, "normalized": normalized})
    return out


# --- questions ---------------------------------------------------------------------------------


def _question(piece: Piece, *, strict: bool = False) -> tuple[str | None, bool]:
    """(question, taken from the heading without a label or '?')."""
    lines = [piece.heading or ""] + [ln.strip() for b in piece.prose for ln in b.lines]
    for line in lines:
        m = _QUESTION_LABEL.match(_unemph(line))
        if m:
            return _unquote(m.group("q").strip()), False
    for line in lines:
        if line.endswith("?") and not _URL.search(line):
            return _unquote(re.sub(r"^\d{1,3}\.\s+", "", _unemph(line))), False
    if strict or not piece.heading:
        return None, False
    return re.sub(r"^\d{1,3}\.\s+", "", _unemph(piece.heading)), True


def _labelled_interpretation(piece: Piece) -> str | None:
    """The text after an "Interpretazione:" label, with the rest of its paragraph."""
    for block in piece.prose:
        m = _INTERP_LABEL.match(block.lines[0].strip())
        if m:
            rest = [m.group("i"), *(ln.strip() for ln in block.lines[1:])]
            return " ".join(x for x in rest if x)
    return None


def _interpretation(piece: Piece, question: str) -> str | None:
    labelled = _labelled_interpretation(piece)
    if labelled:
        return labelled
    for block in piece.prose:
        text = block.flat
        if text and question not in text and not _QUESTION_LABEL.match(text):
            return text
    return None


# --- SQL ---------------------------------------------------------------------------------------

_STATEMENTS = tuple(t for t in (getattr(exp, n, None) for n in (
    "Query", "DML", "DDL", "Command", "Drop", "Alter", "TruncateTable", "Create", "Insert",
    "Update", "Delete", "Merge", "Set", "Use", "Transaction", "Commit", "Rollback", "Copy",
    "Grant", "Revoke", "Describe", "Pragma", "Analyze", "Show", "Cache", "Uncache", "Refresh",
    "Comment", "LoadData", "Kill", "Declare")) if isinstance(t, type))


def _sql_shape(sql: str) -> tuple[str, exp.Expression | None]:
    """("expression" | "query" | "other", parsed tree) under the PostgreSQL dialect."""
    try:
        trees = [t for t in sqlglot.parse(sql, dialect="postgres") if t is not None]
    except sqlglot.errors.SqlglotError:
        return "other", None
    if len(trees) != 1:
        return "other", None
    tree = trees[0]
    if isinstance(tree, exp.Query):
        return "query", tree
    if isinstance(tree, _STATEMENTS) or tree.find(exp.Query) is not None:
        return "other", tree
    try:
        sqlglot.parse_one(f"SELECT {sql.strip().rstrip(';')} AS v", dialect="postgres")
    except sqlglot.errors.SqlglotError:
        return "other", tree
    return "expression", tree


def _formula_columns(tree: exp.Expression, piece: Piece, refs: _Refs) -> list[str]:
    """Columns of the expression written as schema.table.column in the note (verbatim)."""
    written = refs.find(_piece_text(piece))[1]
    used = [(c.table, c.name) for c in tree.find_all(exp.Column)]
    out: list[str] = []
    for c in tree.find_all(exp.Column):
        if c.db and c.table:
            _add(out, f"{c.db}.{c.table}.{c.name}")
    for ref in written:
        _schema, table, name = ref.split(".")
        for used_table, used_name in used:
            if used_name == name and (not used_table or used_table == table
                                      or used_table not in refs.table_names):
                _add(out, ref)
    return [c for c in out if c in written or c in _piece_text(piece)]


def _sql_tables(tree: exp.Expression | None) -> list[str]:
    if tree is None:
        return []
    out: list[str] = []
    for t in tree.find_all(exp.Table):
        if t.db and t.name:
            _add(out, f"{t.db}.{t.name}")
    return out


# ---------------------------------------------------------------------------------------------
# Review items, excerpts, body
# ---------------------------------------------------------------------------------------------


def _flag_ambiguity(piece: Piece, draft: Draft) -> None:
    question = draft.block.get("question") if draft.kind is K.example else None
    lines: list[str] = []
    if piece.item is not None:
        lines.append(piece.item)
    else:
        lines.extend(ln.strip() for b in piece.prose for ln in b.lines if ln.strip())
    for line in lines:
        bare = _URL.sub(" ", line)
        if question and question in line:
            continue
        m = _AMBIGUITY.search(bare)
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


def _check_sizes(draft: Draft, limit: int) -> None:
    for name, value in draft.block.items():
        values: list[Any]
        if isinstance(value, dict):
            values = [f"{k} {v}" for k, v in value.items()]
        elif isinstance(value, list):
            values = [" ".join(v.values()) if isinstance(v, dict) else v for v in value]
        else:
            values = [value]
        if any(isinstance(v, str) and len(v) > limit for v in values):
            draft.flag(TOO_LARGE, f"An atomic element is longer than max_chunk_chars "
                       f"({limit}); it is kept whole.", f"{draft.kind.value}.{name}")


def _block_texts(piece: Piece) -> list[str]:
    if piece.item is not None:
        return [piece.item]
    texts: list[str] = []
    for block in piece.blocks:
        if block.type == "code":
            texts.append(block.text.strip("\n"))
        elif block.type == "table":
            texts.append(block.text)
        else:
            texts.append(block.flat)
    return [t for t in texts if t.strip()]


def _excerpts(piece: Piece, source: str) -> list[str]:
    """Verbatim slices of the normalized text: the piece's blocks, cut at 1000 characters."""
    texts = _block_texts(piece)
    out: list[str] = []
    for text in texts:
        if len(texts) > 1 and text.endswith(":") and len(text.split()) <= 2:
            continue  # a bare label such as "Condizioni:" proves nothing
        for chunk in _chunks(text):
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


def _body(piece: Piece) -> str:
    parts: list[str] = []
    if piece.intro is not None:
        parts.append("\n".join(piece.intro.raw))
    if piece.item_raw:
        parts.append("\n".join(piece.item_raw))
    else:
        parts.extend("\n".join(b.raw) for b in piece.blocks)
    return "\n\n".join(parts)


def _piece_text(piece: Piece) -> str:
    if piece.item is not None:
        return piece.item
    return "\n".join(b.text for b in piece.blocks)


def _prose_text(piece: Piece) -> str:
    return "\n".join(b.text for b in piece.prose)


# ---------------------------------------------------------------------------------------------
# Ids of previous units, retirement
# ---------------------------------------------------------------------------------------------


def _key(kind: EvidenceKind | str, block: Any) -> str:
    try:
        kind = EvidenceKind(kind)
    except ValueError:
        return ""
    value = block.get(KEY_FIELD[kind]) if isinstance(block, dict) else None
    return canonical(value).casefold() if isinstance(value, str) else ""


def _match_previous(drafts: list[Draft], request: ModelRequest
                    ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Ids and minimal change against the previous units of the source.

    A previous unit whose excerpts are all still in the note is kept exactly as it is (a
    curator's corrections included); a piece whose excerpts all lie inside kept units adds
    nothing and is dropped. A piece overlapping one previous unit replaces it under its id (the
    unit's text changed or grew, possibly with another kind). Other pieces take the id of a
    vanished unit with the same key or title, or are new. What is left vanished is proposed
    for retirement.
    """
    text = request.normalized_text
    haystack = canonical(text)
    previous = list(request.previous_units)
    excerpts = {u.id: _prev_excerpts(u) for u in previous}
    supported = {u.id for u in previous if excerpts[u.id] and all(
        excerpt_in_source(e, text) for e in _prev_excerpts(u, raw=True))}
    old = canonical(request.previous_text) if request.previous_text is not None else None
    claimed: dict[int, str] = {}
    dropped: set[int] = set()
    overlaps: dict[int, list[str]] = {}
    for n, draft in enumerate(drafts):
        mine = [canonical(e) for e in draft.excerpts]
        over = [u.id for u in previous
                if any(_overlap(a, b) for a in excerpts[u.id] for b in mine)]
        kept = [uid for uid in over if uid in supported]
        if old is not None and previous and len(kept) == len(over) and all(
                canonical(t) in old for t in draft.texts):
            dropped.add(n)  # unchanged text: the previous units stand for it as they are
        elif kept and all(any(b in a for uid in kept for a in excerpts[uid]) for b in mine):
            dropped.add(n)
        elif len(over) == 1 and over[0] not in claimed.values():
            claimed[n] = over[0]
        elif over:
            overlaps[n] = over
    # pieces overlapping several previous units keep the id of the most similar one
    for n, over in overlaps.items():
        free = [uid for uid in over if uid not in claimed.values()]
        best = _most_similar(drafts[n], [u for u in previous if u.id in free])
        if best is not None:
            claimed[n] = best
        rest = [uid for uid in over
                if uid != best and uid in supported and uid not in claimed.values()]
        if rest:
            drafts[n].flag("structural_overlaps_previous_unit", "This part of the note is also "
                           f"quoted by {', '.join(rest)}, kept from before: check that the units "
                           "do not repeat each other.", None)
    # the others: a vanished unit with the same key, first excerpt or title
    vanished = [u for u in previous if u.id not in supported]
    for same in (_same_key, _same_first_excerpt, _same_title):
        for n, draft in enumerate(drafts):
            if n in claimed or n in dropped:
                continue
            for unit in vanished:
                if unit.id not in claimed.values() and same(draft, unit):
                    claimed[n] = unit.id
                    break
    placed: list[tuple[int, int, dict[str, Any]]] = []
    for n, draft in enumerate(drafts):
        if n not in dropped:
            placed.append((_position(haystack, draft.excerpts), n, _unit_dict(draft,
                                                                             claimed.get(n))))
    taken = set(claimed.values())
    for k, unit in enumerate(previous):
        if unit.id in supported and unit.id not in taken:
            first = _prev_excerpts(unit, raw=True)
            placed.append((_position(haystack, first), len(drafts) + k, _kept(unit)))
            taken.add(unit.id)
    retire = [
        {"id": u.id, "message": "The source no longer supports this unit: its excerpts are no "
         "longer in the note and no part of the note has its key or its title."}
        for u in previous if u.id not in taken]
    return [unit for _, _, unit in sorted(placed, key=lambda x: (x[0], x[1]))], retire


def _prev_excerpts(unit: Any, *, raw: bool = False) -> list[str]:
    prov = unit.data.get("provenance")
    ex = prov.get("supporting_excerpts") if isinstance(prov, dict) else None
    values = [e for e in ex if isinstance(e, str)] if isinstance(ex, list) else []
    return values if raw else [canonical(e) for e in values]


def _overlap(a: str, b: str) -> bool:
    return min(len(a), len(b)) >= 12 and (a in b or b in a)


def _position(haystack: str, excerpts: Sequence[str]) -> int:
    at = haystack.find(canonical(excerpts[0])) if excerpts else -1
    return at if at >= 0 else len(haystack)


def _prev_kind(unit: Any) -> str:
    return str(unit.data.get("kind", ""))


def _same_key(draft: Draft, unit: Any) -> bool:
    kind = _prev_kind(unit)
    return kind == draft.kind.value and draft.key != "" and \
        _key(kind, unit.data.get(kind)) == draft.key


def _same_first_excerpt(draft: Draft, unit: Any) -> bool:
    prev = _prev_excerpts(unit)
    return bool(prev) and bool(draft.excerpts) and prev[0] == canonical(draft.excerpts[0])


def _same_title(draft: Draft, unit: Any) -> bool:
    return _prev_kind(unit) == draft.kind.value and \
        canonical(str(unit.data.get("title", ""))).casefold() == canonical(draft.title).casefold()


def _most_similar(draft: Draft, units: list[Any]) -> str | None:
    for same in (_same_key, _same_first_excerpt, _same_title):
        for unit in units:
            if same(draft, unit):
                return unit.id
    same_kind = [u for u in units if _prev_kind(u) == draft.kind.value]
    return same_kind[0].id if same_kind else None


def _kept(unit: Any) -> dict[str, Any]:
    """A previous unit exactly as it is: its source text is still there."""
    data = unit.data
    kind = str(data.get("kind"))
    out: dict[str, Any] = {"id": unit.id}
    for key in ("title", "kind", "purposes", "applies_to", kind):
        if key in data:
            out[key] = data[key]
    out["supporting_excerpts"] = _prev_excerpts(unit, raw=True)
    out["review_items"] = data.get("review_items") or []
    out["body"] = _strip_title(unit.body, str(data.get("title", "")))
    return out


def _strip_title(body: str, title: str) -> str:
    lines = body.strip("\n").split("\n")
    if lines and lines[0].strip() == f"# {title}".strip():
        lines = lines[1:]
    return "\n".join(lines).strip("\n")


def _unit_dict(draft: Draft, uid: str | None) -> dict[str, Any]:
    block = dict(draft.block)
    if draft.kind is K.domain:
        block = {k: v for k, v in block.items() if v or k == "rule"}
    if draft.kind is K.glossary and not block.get("synonyms"):
        block.pop("synonyms", None)
    concepts: list[str] = []
    for c in draft.concepts:
        _add(concepts, c)
    out: dict[str, Any] = {
        "title": draft.title,
        "kind": draft.kind.value,
        "purposes": [p.value for p in PURPOSES[draft.kind]],
        "applies_to": {"concepts": concepts, "tables": list(draft.tables),
                       "columns": list(draft.columns)},
        draft.kind.value: block,
        "supporting_excerpts": list(draft.excerpts),
        "review_items": list(draft.review),
        "body": draft.body,
    }
    if uid is not None:
        out = {"id": uid, **out}
    return out


# ---------------------------------------------------------------------------------------------
# Small verbatim text helpers (they only cut, never add)
# ---------------------------------------------------------------------------------------------


_EMPHASIS = re.compile(r"(?<![\w*])(\*\*|\*)(?=\S)(.+?)(?<=\S)\1(?![\w*])"
                       r"|(?<!\w)(__|_)(?=\S)(.+?)(?<=\S)\3(?!\w)")


def _unemph(text: str) -> str:
    return _EMPHASIS.sub(lambda m: m.group(2) or m.group(4), text).strip()


def _unquote(text: str) -> str:
    s = text.strip()
    for a, b in (("'", "'"), ('"', '"'), ("`", "`"), ("“", "”"), ("«", "»")):
        if len(s) >= 2 and s.startswith(a) and s.endswith(b) and a not in s[1:-1]:
            return s[1:-1]
    return s


def _unquote_code(text: str) -> str:
    s = text.strip()
    if len(s) >= 2 and s.startswith("`") and s.endswith("`") and "`" not in s[1:-1]:
        return s[1:-1]
    return s


def _trim(text: str) -> str:
    return _SENTENCE_END.sub("", text.strip()).strip()


def _strip_joiners(text: str) -> str:
    return re.sub(r"^[\s:—–\-,;]+|[\s:—–\-,;]+$", "", text)


def _first_words(text: str, n: int = 8) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = re.sub(r"^(?:- |\d{1,3}\. |#+ )", "", line)
    words = _unemph(line).split()
    return _trim(" ".join(words[:n])) or " ".join(words[:n])


def _balanced(text: str) -> bool:
    return text.count("(") == text.count(")") and text.count('"') % 2 == 0


def _is_code(value: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9_.*%+-]{1,16}", value))
