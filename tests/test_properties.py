"""Property-based tests (issue 8, part 4): normalization, excerpt matching, query text, ids,
and the Markdown grammar's block slicing (issue 13).

Bounded runs (at most 200 examples, no deadline) so the file stays well under 20 s.
"""

from __future__ import annotations

import random
import unicodedata

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from evidence_pipeline import markdown
from evidence_pipeline.authoring.backends.base import ModelRequest
from evidence_pipeline.authoring.backends.structural import StructuralBackend
from evidence_pipeline.authoring.ids import MAX_SLUG, assign_id, slugify
from evidence_pipeline.formats.fragments import body_pieces
from evidence_pipeline.formats.normalize import canonical, excerpt_in_source, normalize_text
from evidence_runtime.query import EmptyQueryError, EvidenceSearchContext, render_query
from evidence_runtime.units import ID_PREFIX, SLUG_RE, EvidenceKind, check_evidence_id

BOUNDED = settings(max_examples=200, deadline=None)

KINDS = [k.value for k in EvidenceKind]

# Pieces of Markdown and of Unicode that the normalizer treats specially, mixed with free text
# so that generated notes exercise headings, bullets, fences, tables, line endings and spaces.
MARKDOWN_PIECES = [
    "# ", "## ", "#Titolo", " #", "* ", "- ", "+ ", "• ", "– ", "1) ", "2. ", "```", "```SQL",
    "~~~", "| a | b |", "|", "===", "---", "> ", "\n", "\n\n\n", "\r\n", "\r", "\t", "  ",
    "\u00a0", "\u2003", "\u3000", "\ufeff", "\u200b", "e\u0301", "é", "ß", "İ", "ﬁ", "Ω",
    "![x](data:image/png;base64,iVBO)", "[y](data:text/csv,a)", "![z][img]", "[img]: data:a",
    "<img src='data:image/gif;base64,R0'>", "---\ntitolo: x\n---\n",
]
notes = st.lists(st.sampled_from(MARKDOWN_PIECES) | st.text(max_size=12), max_size=30).map(
    "".join)
any_text = st.text(max_size=200) | notes

# Words that carry no Markdown meaning at a line start (no bullets, headings, fences, tables,
# ordered-list parentheses), so that re-wrapping a text of them cannot change its structure.
WORD_ALPHABET = st.characters(codec="utf-8", categories=("Ll", "Lu", "Nd"))
words = st.lists(st.text(WORD_ALPHABET, min_size=1, max_size=8)
                 .map(lambda w: unicodedata.normalize("NFC", w))
                 .filter(lambda w: w.strip() == w and " " not in w and w.isalnum()),
                 min_size=1, max_size=25)
punctuated_words = st.lists(
    st.tuples(st.text(WORD_ALPHABET, min_size=1, max_size=8),
              st.sampled_from(["", ",", ".", ";", ":", "!", "?", "'"]))
    .map(lambda t: unicodedata.normalize("NFC", t[0]) + t[1])
    .filter(lambda w: w.isprintable() and not any(c.isspace() for c in w)),
    min_size=1, max_size=25)
separators = st.sampled_from([" ", "  ", "\n", "\r\n", "\r", "\t", " \n ", "\n\n", "\u00a0"])


def rewrap(ws: list[str], seps: list[str]) -> str:
    out = ws[0]
    for i, w in enumerate(ws[1:]):
        out += seps[i % len(seps)] + w
    return out


# ---------------------------------------------------------------------------------------------
# normalize_text and canonical
# ---------------------------------------------------------------------------------------------


@BOUNDED
@given(any_text)
def test_normalize_text_never_raises_and_is_idempotent(text: str) -> None:
    once = normalize_text(text)
    assert normalize_text(once) == once
    assert once == "" or (once.endswith("\n") and not once.endswith("\n\n"))
    assert "\r" not in once and unicodedata.is_normalized("NFC", once)


@BOUNDED
@given(any_text)
def test_canonical_is_single_spaced_and_matches_its_source(text: str) -> None:
    # (canonical is not idempotent, by design: joining lines may form a new line start)
    c = canonical(text)
    assert "  " not in c and "\n" not in c and c == c.strip()
    assert c == "" or excerpt_in_source(c, normalize_text(text))


@BOUNDED
@given(punctuated_words, st.lists(separators, min_size=1, max_size=5))
def test_canonical_ignores_rewrapping_and_line_endings(ws: list[str], seps: list[str]) -> None:
    flat = " ".join(ws)
    assert canonical(rewrap(ws, seps)) == canonical(flat)
    assert canonical(flat.replace(" ", "\r\n")) == canonical(flat)


# ---------------------------------------------------------------------------------------------
# excerpt_in_source
# ---------------------------------------------------------------------------------------------


@BOUNDED
@given(punctuated_words, st.lists(separators, min_size=1, max_size=5), st.data())
def test_every_run_of_whole_words_is_found(ws: list[str], seps: list[str],
                                           data: st.DataObject) -> None:
    source = normalize_text(rewrap(ws, seps))
    i = data.draw(st.integers(0, len(ws) - 1))
    j = data.draw(st.integers(i + 1, len(ws)))
    quoted = ws[i:j]
    # the quote may itself be wrapped differently from the source (by design, spec §5.2)
    excerpt = rewrap(quoted, data.draw(st.lists(separators, min_size=1, max_size=3)))
    assert excerpt_in_source(excerpt, source)
    assert excerpt_in_source(" ".join(quoted), source)


@BOUNDED
@given(any_text, st.data())
def test_every_canonical_token_run_of_any_note_is_found(text: str, data: st.DataObject) -> None:
    tokens = canonical(text).split(" ")
    assume(tokens != [""])
    i = data.draw(st.integers(0, len(tokens) - 1))
    j = data.draw(st.integers(i + 1, len(tokens)))
    assert excerpt_in_source(" ".join(tokens[i:j]), normalize_text(text))


# Latin letters and a look-alike from another script (Cyrillic, Greek) or a compatibility form.
LOOKALIKES = {
    "a": "\u0430", "c": "\u0441", "e": "\u0435", "i": "\u0456", "o": "\u043e", "p": "\u0440",
    "x": "\u0445", "y": "\u0443", "s": "\u0455", "A": "\u0391", "B": "\u0392", "E": "\u0395",
    "H": "\u0397", "K": "\u039a", "M": "\u039c", "O": "\u039f", "T": "\u03a4", "0": "\uff10",
    "1": "\uff11",
}
latin_words = st.lists(st.text(st.sampled_from("aceiopxysABEHKMOTbdfglmnrtuvz01"),
                               min_size=1, max_size=8), min_size=1, max_size=20)


@BOUNDED
@given(latin_words, st.data())
def test_one_lookalike_character_is_never_found(ws: list[str], data: st.DataObject) -> None:
    source = normalize_text(" ".join(ws))
    i = data.draw(st.integers(0, len(ws) - 1))
    j = data.draw(st.integers(i + 1, len(ws)))
    excerpt = " ".join(ws[i:j])
    positions = [k for k, ch in enumerate(excerpt) if ch in LOOKALIKES]
    assume(positions)
    k = data.draw(st.sampled_from(positions))
    near = excerpt[:k] + LOOKALIKES[excerpt[k]] + excerpt[k + 1:]
    assert excerpt_in_source(excerpt, source)
    assert not excerpt_in_source(near, source)


@BOUNDED
@given(latin_words, st.data(), st.sampled_from(["\u200b", "\u200c", "\u200d", "\u2060",
                                                "\u00ad", "\ufeff"]))
def test_an_invisible_character_is_never_found(ws: list[str], data: st.DataObject,
                                               invisible: str) -> None:
    source = normalize_text(" ".join(ws))
    excerpt = " ".join(ws)
    assume(len(excerpt) > 1)
    k = data.draw(st.integers(1, len(excerpt) - 1))
    assume(" " not in excerpt[k - 1:k + 1])  # inside a word
    assert not excerpt_in_source(excerpt[:k] + invisible + excerpt[k:], source)


@BOUNDED
@given(latin_words.filter(lambda ws: len(ws) >= 2), st.data())
def test_words_run_together_are_not_found(ws: list[str], data: st.DataObject) -> None:
    source = normalize_text(" ".join(ws))
    k = data.draw(st.integers(0, len(ws) - 2))
    joined = " ".join([*ws[:k], ws[k] + ws[k + 1], *ws[k + 2:]])
    assume(joined not in canonical(source))  # "ab a b": the joined word may exist elsewhere
    assert not excerpt_in_source(joined, source)


# ---------------------------------------------------------------------------------------------
# The Markdown grammar: blocks are exact slices of the text
# ---------------------------------------------------------------------------------------------

# Lines that open or close the structures the grammar knows, mixed with text lines, so that
# generated notes hold fences of both kinds inside each other, tables, lists, HTML, quotes.
MARKDOWN_LINES = [
    "```", "```sql", "````", "~~~", "~~~~ text", "   ```", "    codice indentato", "# Titolo",
    "## Sezione ##", "Titolo setext", "===", "---", "***", "- voce", "  - sotto voce", "1. primo",
    "2) secondo", "| a | b |", "|---|---|", "| 1 | 2 |", "a | b", "> citazione", "<div>",
    "</div>", "<!-- commento -->", "[rif]: https://example.org", "", "", "testo libero",
    "Regola: i DH vanno esclusi.", "SELECT 1", "\t- tab", "- [x] fatto",
]
markdown_notes = st.lists(st.sampled_from(MARKDOWN_LINES) | st.text(max_size=10),
                          max_size=40).map("\n".join)


def _check_blocks(text: str) -> list[markdown.Block]:
    lines = markdown.split_lines(text)
    found = markdown.parse_blocks(text)
    covered: list[int] = []
    for block in found:
        assert block.lines == tuple(lines[block.start:block.end]), block
        assert block.lines and not markdown.is_blank(block.lines[-1]), block  # none trailing
        covered.extend(range(block.start, block.end))
        if "\r" not in text:
            assert block.text in text
    assert covered == sorted(set(covered)), "blocks overlap or are out of order"
    uncovered = [n for n, line in enumerate(lines)
                 if not markdown.is_blank(line) and n not in set(covered)]
    assert not uncovered, [lines[n] for n in uncovered]
    return found


@BOUNDED
@given(markdown_notes | any_text)
def test_blocks_are_exact_ordered_slices_covering_every_non_blank_line(text: str) -> None:
    for block in _check_blocks(text):
        parts = block.parts()
        if block.kind in markdown.VERBATIM:
            assert [p.lines for p in parts] == [block.lines]
        # parts are consecutive runs of the block's own lines, blank lines only between them
        joined = [line for p in parts for line in p.lines]
        assert [ln for ln in joined if not markdown.is_blank(ln)] == [
            ln for ln in block.lines if not markdown.is_blank(ln)]
        for part in parts:
            assert part.text in block.text
        if block.kind is markdown.BlockKind.fence:
            assert block.content == block.lines[1:len(block.content) + 1]


@BOUNDED
@given(markdown_notes)
def test_blocks_of_normalized_notes_are_exact_slices_too(text: str) -> None:
    _check_blocks(normalize_text(text))


@BOUNDED
@given(markdown_notes)
def test_body_pieces_are_verbatim_slices_of_the_body(body: str) -> None:
    lf = "\n".join(markdown.split_lines(body))
    for piece in body_pieces(body, "Titolo"):
        if not piece.heading:
            assert piece.text in lf, piece


@settings(max_examples=100, deadline=None)
@given(markdown_notes)
def test_structural_units_quote_only_the_normalized_note(text: str) -> None:
    normalized = normalize_text(text)
    assume(normalized.strip())
    request = ModelRequest(source_file="source/nota.md", source_sha256="sha256:" + "0" * 64,
                           normalized_text=normalized, language="it")
    reply = StructuralBackend().restructure(request)
    for unit in reply.units:
        for excerpt in unit.data["supporting_excerpts"]:
            assert excerpt_in_source(excerpt, normalized), excerpt


# ---------------------------------------------------------------------------------------------
# render_query (spec §9.6)
# ---------------------------------------------------------------------------------------------

questions = st.text(min_size=1, max_size=80).filter(lambda q: q.strip() != "")
values = st.lists(st.text(max_size=20), max_size=6)
QUOTED_IDENTIFIERS = ['"Patient"."BirthDate"', '"patient"."birthdate"', 'clinical."Patient"',
                      '"PATIENT".sex_code', '"Pa tient"."Età"', 'clinical.patient.birth_date',
                      '"a""b".c']


def _ctx(concepts: list[str], tables: list[str], columns: list[str]) -> EvidenceSearchContext:
    return EvidenceSearchContext(concepts=tuple(concepts), tables=tuple(tables),
                                 columns=tuple(columns))


@BOUNDED
@given(questions, values, values, values, st.randoms(use_true_random=False))
def test_render_query_ignores_the_order_of_context_values(q: str, concepts: list[str],
                                                          tables: list[str], columns: list[str],
                                                          rnd: random.Random) -> None:
    shuffled = [rnd.sample(v, len(v)) for v in (concepts, tables, columns)]
    doubled = [v + v for v in (concepts, tables, columns)]  # exact duplicates are dropped
    try:
        expected = render_query(q, _ctx(concepts, tables, columns))
    except EmptyQueryError:
        return
    assert render_query(q, _ctx(*shuffled)) == expected
    assert render_query(q, _ctx(*doubled)) == expected


@BOUNDED
@given(questions, values, values, values)
def test_render_query_is_idempotent_on_its_own_question(q: str, concepts: list[str],
                                                        tables: list[str],
                                                        columns: list[str]) -> None:
    try:
        bare = render_query(q)
    except EmptyQueryError:
        return
    rendered_question = bare.removeprefix("Domanda: ")
    assert render_query(rendered_question) == bare
    ctx = _ctx(concepts, tables, columns)
    assert render_query(rendered_question, ctx) == render_query(q, ctx)
    assert render_query(q, ctx).startswith(bare)


@BOUNDED
@given(st.text(min_size=1, max_size=80))
def test_render_query_keeps_case_punctuation_and_inner_spaces(q: str) -> None:
    q = unicodedata.normalize("NFC", q).strip()
    assume(q and "\r" not in q)
    assert render_query(q) == f"Domanda: {q}"
    padded = f" \t{q.replace(chr(10), chr(13) + chr(10))}\r\n "
    assert render_query(padded) == f"Domanda: {q}"


@BOUNDED
@given(questions, st.lists(st.sampled_from(QUOTED_IDENTIFIERS), min_size=1, max_size=7))
def test_render_query_keeps_quoted_identifiers_byte_for_byte(q: str, cols: list[str]) -> None:
    try:
        text = render_query(q, _ctx([], cols, cols))
    except EmptyQueryError:
        return
    expected = ", ".join(sorted(set(cols)))  # code-point order, no case folding
    assert text.splitlines()[-2:] == [f"Tabelle: {expected}", f"Colonne: {expected}"]
    assert render_query('Età di "Patient"."BirthDate"?  Sì!') == (
        'Domanda: Età di "Patient"."BirthDate"?  Sì!')


@BOUNDED
@given(st.text(st.sampled_from(" \t\n\r\x0b\x0c\u00a0\u1680\u2000\u2003\u2028\u2029\u3000"),
               max_size=20))
def test_render_query_rejects_empty_questions(q: str) -> None:
    with pytest.raises(EmptyQueryError):
        render_query(q)
    with pytest.raises(EmptyQueryError):
        render_query(q, _ctx(["fascia pediatrica"], ["clinical.patient"], []))


# ---------------------------------------------------------------------------------------------
# slugify and assign_id
# ---------------------------------------------------------------------------------------------

titles = (st.text(max_size=80)
          | st.lists(st.sampled_from([*KINDS, *(k.capitalize() for k in KINDS), "Età",
                                      "fascia", "pediatrica", "-", ":", "2", "unit", " "]),
                     max_size=6).map(" ".join))


@BOUNDED
@given(titles)
def test_slugify_always_gives_a_valid_id_without_a_kind_prefix(title: str) -> None:
    slug = slugify(title)
    assert SLUG_RE.match(slug), slug
    assert len(slug) <= MAX_SLUG
    assert check_evidence_id(f"{ID_PREFIX}{slug}") == f"{ID_PREFIX}{slug}"
    assert not any(slug.startswith(f"{kind}-") for kind in KINDS), slug
    assert slugify(title) == slug


@pytest.mark.parametrize("title", [*KINDS, "Formula", "Formula formula", "formula enum",
                                   "Reference: linee guida"])
def test_slugify_of_kind_names(title: str) -> None:
    slug = slugify(title)
    check_evidence_id(f"{ID_PREFIX}{slug}")
    assert not any(slug.startswith(f"{kind}-") for kind in KINDS), slug


taken_ids = st.sets(st.builds(lambda t: f"{ID_PREFIX}{slugify(t)}", titles), max_size=10)


@BOUNDED
@given(st.lists(titles, max_size=25), taken_ids)
def test_assign_id_is_deterministic_collision_free_and_stable(names: list[str],
                                                              taken: set[str]) -> None:
    first_taken = set(taken)
    first = [assign_id(t, first_taken) for t in names]
    again_taken = set(taken)
    again = [assign_id(t, again_taken) for t in names]
    assert first == again  # the same run on the same taken set gives the same ids
    assert len(set(first)) == len(first)  # no two new units share an id
    assert not set(first) & taken  # no new id reuses a taken one
    assert first_taken == taken | set(first)  # every new id is reserved
    for eid in first:
        check_evidence_id(eid)
    # a re-run that already holds these ids mints none of them again
    rerun = [assign_id(t, set(first_taken)) for t in names]
    assert not set(rerun) & first_taken
