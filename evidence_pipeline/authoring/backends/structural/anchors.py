"""Units from structured anchors: SQL blocks (formula, example), tables and code lines (enum,
normalization, mapping), glossary items and link items."""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from evidence_pipeline.authoring.backends.structural.cues import NORMALIZATION_CUE, RAW_HEADER
from evidence_pipeline.authoring.backends.structural.draft import (
    FIELD_UNCERTAIN,
    NO_LABEL,
    UNCERTAIN,
    Draft,
    K,
    new_draft,
    piece_text,
    prose_text,
    title_of,
)
from evidence_pipeline.authoring.backends.structural.normalization import normalization_draft
from evidence_pipeline.authoring.backends.structural.prose import domain_fallback, mapping_draft
from evidence_pipeline.authoring.backends.structural.questions import interpretation, question
from evidence_pipeline.authoring.backends.structural.refs import Refs
from evidence_pipeline.authoring.backends.structural.roles import (
    Piece,
    enum_lines,
    gloss_item,
    inline_enum,
    table_rows,
)
from evidence_pipeline.authoring.backends.structural.text import (
    MD_LINK,
    URL,
    add,
    first_words,
    is_code,
    strip_joiners,
    trim,
    unemph,
    unquote,
)

# --- SQL ---------------------------------------------------------------------------------------


def sql_draft(piece: Piece, refs: Refs) -> Draft:
    """A formula (one expression over written columns) or an example (a documented query)."""
    assert piece.anchor is not None
    sql = piece.anchor.text.strip("\n")
    shape, tree = _sql_shape(sql)
    if shape == "expression":
        assert tree is not None
        columns = _formula_columns(tree, piece, refs)
        concept = unemph(piece.heading) if piece.heading else None
        if columns:
            draft = new_draft(K.formula, piece, title_of(piece, concept), {
                "concept": concept or first_words(prose_text(piece) or sql),
                "columns": columns, "sql": sql}, refs, concepts=[concept or ""])
            if concept is None:
                draft.flag(FIELD_UNCERTAIN, "The note has no heading naming the formula; the "
                           "concept is the first words of the text.", "formula.concept")
            return draft
        draft = domain_fallback(piece, refs)
        draft.flag(UNCERTAIN, "The SQL block is one expression, but its input columns are not "
                   "written as schema.table.column in the note, so it cannot be a formula.",
                   "kind")
        return draft
    if shape == "query":
        asked, from_heading = question(piece)
        if asked:
            read = interpretation(piece, asked)
            draft = new_draft(K.example, piece, title_of(piece, asked), {
                "question": asked,
                "interpretation": read or asked,
                "sql": sql}, refs, extra_text="\n".join(_sql_tables(tree)))
            for t in _sql_tables(tree):
                add(draft.tables, t)
            if from_heading:
                draft.flag(FIELD_UNCERTAIN, "No question is written as such; the heading is "
                           "taken as the question.", "example.question")
            if not read:
                draft.flag(FIELD_UNCERTAIN, "The note does not say how the question is to be "
                           "read; the interpretation repeats the question.",
                           "example.interpretation")
            return draft
        draft = domain_fallback(piece, refs)
        draft.flag(UNCERTAIN, "A full SQL query without a documented question: neither an "
                   "example nor a formula.", "kind")
        return draft
    draft = domain_fallback(piece, refs)
    draft.flag(UNCERTAIN, "The SQL block is neither one composable expression nor one query "
               "(a legacy formula?).", "kind")
    return draft


_STATEMENTS = tuple(t for t in (getattr(exp, n, None) for n in (
    "Query", "DML", "DDL", "Command", "Drop", "Alter", "TruncateTable", "Create", "Insert",
    "Update", "Delete", "Merge", "Set", "Use", "Transaction", "Commit", "Rollback", "Copy",
    "Grant", "Revoke", "Describe", "Pragma", "Analyze", "Show", "Cache", "Uncache", "Refresh",
    "Comment", "LoadData", "Kill", "Declare")) if isinstance(t, type))


def _sql_shape(sql: str) -> tuple[str, exp.Expr | None]:
    """("expression" | "query" | "other", parsed tree) under the PostgreSQL dialect."""
    try:
        trees = [t for t in sqlglot.parse(sql, dialect="postgres") if t is not None]
    except SqlglotError:
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
    except SqlglotError:
        return "other", tree
    return "expression", tree


def _formula_columns(tree: exp.Expr, piece: Piece, refs: Refs) -> list[str]:
    """Columns of the expression written as schema.table.column in the note (verbatim)."""
    written = refs.find(piece_text(piece))[1]
    used = [(c.table, c.name) for c in tree.find_all(exp.Column)]
    out: list[str] = []
    for c in tree.find_all(exp.Column):
        if c.db and c.table:
            add(out, f"{c.db}.{c.table}.{c.name}")
    for ref in written:
        _schema, table, name = ref.split(".")
        for used_table, used_name in used:
            if used_name == name and (not used_table or used_table == table
                                      or used_table not in refs.table_names):
                add(out, ref)
    return [c for c in out if c in written or c in piece_text(piece)]


def _sql_tables(tree: exp.Expr | None) -> list[str]:
    if tree is None:
        return []
    out: list[str] = []
    for t in tree.find_all(exp.Table):
        if t.db and t.name:
            add(out, f"{t.db}.{t.name}")
    return out


# --- tables and code lines ---------------------------------------------------------------------


def table_or_lines_draft(piece: Piece, refs: Refs) -> Draft:
    """Codes of a column (enum), raw/normalized pairs (normalization) or a mapping."""
    assert piece.anchor is not None
    anchor = piece.anchor
    header: list[str] = []
    rows: list[list[str]] = []
    if piece.role == "table":
        header, rows = table_rows(anchor)
    else:
        values = enum_lines(anchor) or {}
        rows = [[code, meaning] for code, meaning in values.items()]
    heading_text = piece.heading or ""
    context = "\n".join([heading_text, *(b.text for b in piece.prose)])
    raw_header = bool(header) and bool(RAW_HEADER.search(header[0]))
    if raw_header and len(header) >= 2:
        return normalization_draft(piece, refs, rows=rows)
    column = _enum_column(piece, refs, header)
    code_like = rows and all(r and is_code(unquote(r[0])) for r in rows)
    if column and code_like and all(len(r) >= 2 for r in rows):
        return _enum_draft(piece, refs, column, header, rows)
    if NORMALIZATION_CUE.search(heading_text) or (
            NORMALIZATION_CUE.search(context) and piece.role == "table"):
        return normalization_draft(piece, refs, rows=rows)
    if refs.find(anchor.text)[0]:
        return mapping_draft(piece, refs)
    draft = domain_fallback(piece, refs)
    draft.flag(UNCERTAIN, "A table that is neither codes of a recognizable column, nor "
               "normalization examples, nor a mapping to schema.table references.", "kind")
    return draft


def _enum_column(piece: Piece, refs: Refs, header: list[str]) -> str | None:
    """The column the codes belong to: in the heading, else in the text just before."""
    assert piece.anchor is not None
    candidates: list[str] = []
    for text in (piece.heading or "", _before_anchor(piece)):
        for col in refs.find(text)[1]:
            add(candidates, col)
        if candidates:
            break
    if not candidates:
        return None
    if header:
        named = [c for c in candidates if c.split(".")[-1] == unquote(header[0])]
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


def _enum_draft(piece: Piece, refs: Refs, column: str, header: list[str],
                rows: list[list[str]]) -> Draft:
    values: dict[str, str] = {}
    duplicates: list[str] = []
    empty: list[str] = []
    for row in rows:
        code, meaning = unquote(row[0]), trim(row[1])
        if not meaning:
            empty.append(code)
            continue
        if code in values:
            duplicates.append(code)
            continue
        values[code] = meaning
    draft = new_draft(K.enum, piece, title_of(piece, column), {"column": column,
                                                                 "values": values}, refs)
    add(draft.columns, column)
    add(draft.tables, column.rsplit(".", 1)[0])
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


def inline_enum_draft(piece: Piece, refs: Refs) -> Draft:
    """An enum from one line ``schema.table.column: A = one, B = two``."""
    assert piece.anchor is not None
    found = inline_enum(piece.anchor.lines[0])
    assert found is not None
    column, values = found
    rows = [[code, meaning] for code, meaning in values.items()]
    return _enum_draft(piece, refs, column, [], rows)


# --- list items --------------------------------------------------------------------------------


def gloss_item_draft(piece: Piece, refs: Refs) -> Draft:
    """A glossary unit from one ``term: definition`` item."""
    assert piece.item is not None
    found = gloss_item(piece.item, refs)
    assert found is not None
    term, definition = found
    return new_draft(K.glossary, piece, term, {"term": term, "definition": definition,
                                               "synonyms": []}, refs, concepts=[term])


def ref_item_draft(piece: Piece, refs: Refs) -> Draft:
    """A reference unit from one list item holding one link."""
    assert piece.item is not None
    text = piece.item
    link = MD_LINK.search(text)
    if link:
        label, url = link.group(1).strip(), link.group(2)
        before, after = text[:link.start()], text[link.end():]
    else:
        m = URL.search(text)
        assert m is not None
        url = trim(m.group(0))
        before, after = text[:m.start()], text[m.end():]
        label = strip_joiners(before)
    description = strip_joiners(after)
    draft = new_draft(K.reference, piece, "", {}, refs)
    label = draft.or_uncertain(label, unemph(piece.heading) if piece.heading else url, NO_LABEL,
                               "reference.label")
    description = draft.or_uncertain(
        description, strip_joiners(before) or label,
        "The note does not describe the link; the description repeats its label.",
        "reference.description")
    draft.title = label
    draft.block = {"url": url, "label": label, "description": description}
    return draft
