"""One Markdown grammar (issue 13): a fence, a heading, a table is the same thing to the
normalizer, the structural backend, the fragment cutter and the legacy formula reader."""

from __future__ import annotations

import hashlib

import pytest

from evidence_pipeline import markdown
from evidence_pipeline.authoring.backends.base import ModelRequest
from evidence_pipeline.authoring.backends.structural import StructuralBackend
from evidence_pipeline.authoring.formulas import parse_legacy
from evidence_pipeline.formats.fragments import body_pieces
from evidence_pipeline.formats.normalize import excerpt_in_source, normalize_text
from evidence_pipeline.markdown import BlockKind

# a fence holding a line that would close a fence of the other kind (or a shorter one)
NESTED_FENCES = [
    pytest.param("```sql", "~~~", "```", id="tilde-inside-backticks"),
    pytest.param("~~~sql", "```", "~~~", id="backticks-inside-tildes"),
    pytest.param("````sql", "```", "````", id="short-inside-long"),
]


def note(opening: str, inner: str, closing: str) -> str:
    return (f"# Durata della degenza\n\n{opening}\nSELECT count(*)\n{inner}\n"
            f"FROM clinical.episode\n{closing}\n\nIl blocco sopra resta intero.\n")


def request(text: str) -> ModelRequest:
    return ModelRequest(source_file="source/nota.md",
                        source_sha256="sha256:" + hashlib.sha256(text.encode()).hexdigest(),
                        normalized_text=normalize_text(text), language="it")


@pytest.mark.parametrize(("opening", "inner", "closing"), NESTED_FENCES)
def test_a_fence_inside_a_fence_of_another_kind_is_content_everywhere(
        opening: str, inner: str, closing: str) -> None:
    text = note(opening, inner, closing)
    content = f"SELECT count(*)\n{inner}\nFROM clinical.episode"

    # the grammar: one fence, then the paragraph after it
    kinds = [(b.kind, b.lang) for b in markdown.parse_blocks(text)]
    assert kinds == [(BlockKind.heading, ""), (BlockKind.fence, "sql"),
                     (BlockKind.paragraph, "")]
    fence = markdown.parse_blocks(text)[1]
    assert "\n".join(fence.content) == content and fence.closed

    # normalization keeps the block a block: same content, closed where it was closed
    normalized = normalize_text(text)
    assert normalize_text(normalized) == normalized
    blocks = markdown.parse_blocks(normalized)
    assert [b.kind for b in blocks] == [BlockKind.heading, BlockKind.fence, BlockKind.paragraph]
    assert "\n".join(blocks[1].content) == content

    # fragments: the whole block is one atomic piece; the paragraph is its own piece
    pieces = body_pieces(text, "Durata della degenza")
    assert [(p.text, p.atomic) for p in pieces] == [
        (f"{opening}\n{content}\n{closing}", True), ("Il blocco sopra resta intero.", False)]

    # the structural backend: the block is one SQL anchor, quoted and carried whole
    req = request(text)
    reply = StructuralBackend().restructure(req)
    assert len(reply.units) == 1
    unit = reply.units[0]
    assert blocks[1].text in unit.body
    assert content in unit.data["supporting_excerpts"]
    assert all(excerpt_in_source(e, req.normalized_text)
               for e in unit.data["supporting_excerpts"])

    # the legacy formula reader (which also wants its input columns named)
    legacy = text + "\nColonne: clinical.episode.episode_id\n"
    assert parse_legacy(legacy, shown="legacy/nota.sql.md").sql == content


def test_headings_tables_and_html_are_read_by_the_grammar() -> None:
    text = ("Titolo setext\n=============\n\n  ## Indentata ##\n\n"
            "a | b\n--|--\n1 | uno \\| due\n\n<div>\n<p>html</p>\n</div>\n\n"
            "[rif]: https://example.org\n\n---\n\n    codice indentato\n")
    blocks = markdown.parse_blocks(text)
    assert [(b.kind, b.level, b.title) for b in blocks] == [
        (BlockKind.heading, 1, "Titolo setext"), (BlockKind.heading, 2, "Indentata"),
        (BlockKind.table, 0, ""), (BlockKind.html, 0, ""), (BlockKind.definition, 0, ""),
        (BlockKind.rule, 0, ""), (BlockKind.code, 0, "")]
    assert blocks[2].rows == (("a", "b"), ("1", "uno | due"))
    assert blocks[3].lines == ("<div>", "<p>html</p>", "</div>")


def test_a_loose_list_is_one_list_and_its_parts_keep_nested_code_whole() -> None:
    text = ("- primo passo:\n\n  ```sql\n  SELECT 1\n\n  UNION ALL SELECT 2\n  ```\n\n"
            "- secondo passo\n  continua qui\n")
    (block,) = markdown.parse_blocks(text)
    assert block.kind is BlockKind.list
    assert [lines[0] for lines in block.item_lines()] == ["- primo passo:", "- secondo passo"]
    parts = block.parts()
    assert [p.code for p in parts] == [False, True, False]
    assert parts[1].text == "  ```sql\n  SELECT 1\n\n  UNION ALL SELECT 2\n  ```"


def test_an_empty_code_block_makes_no_unit() -> None:
    assert StructuralBackend().restructure(request("```\n")).units == ()
    reply = StructuralBackend().restructure(request("# Titolo\n\n```sql\n```\n\nTesto.\n"))
    assert [u.data["supporting_excerpts"] for u in reply.units] == [["Testo."]]


def test_a_table_is_cut_only_between_rows_even_without_outer_pipes() -> None:
    from evidence_pipeline.formats.fragments import AtomicTooLarge, build_fragments
    from evidence_runtime.units import parse_unit

    unit = parse_unit({
        "schema_version": 1, "id": "evidence:codici", "title": "Codici", "kind": "domain",
        "purposes": ["rewriting"], "language": "it",
        "provenance": {"source_file": "source/nota.md", "source_sha256": "sha256:" + "0" * 64,
                       "supporting_excerpts": ["I codici sono quelli della tabella."]},
        "domain": {"rule": "I codici sono quelli della tabella."}, "review_items": []})
    rows = [f"C{i:03d} | reparto numero {i}. Sede del presidio {i}" for i in range(150)]
    body = "\n# Codici\n\ncodice | reparto\n--|--\n" + "\n".join(rows) + "\n"
    fragments = build_fragments(unit, body, 1200)
    assert len(fragments) > 2
    text = "\n".join(f.text for f in fragments)
    assert all(f"{row}\n" in text + "\n" for row in rows)  # never cut at a sentence or word
    wide = body.replace(rows[7], rows[7] + " lungo" * 300)
    with pytest.raises(AtomicTooLarge):
        build_fragments(unit, wide, 1200)


def test_the_fragment_target_is_off_and_when_set_packs_smaller_fragments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from evidence_pipeline.formats import fragments
    from evidence_pipeline.formats.fragments import build_fragments, header
    from evidence_runtime.units import parse_unit

    assert fragments.TARGET_FRAGMENT_CHARS is None  # measured, not adopted (bench/README)
    unit = parse_unit({
        "schema_version": 1, "id": "evidence:ricoveri", "title": "Ricoveri", "kind": "domain",
        "purposes": ["rewriting"], "language": "it",
        "provenance": {"source_file": "source/nota.md", "source_sha256": "sha256:" + "0" * 64,
                       "supporting_excerpts": ["Un ricovero è un episodio."]},
        "domain": {"rule": "Un ricovero è un episodio."}, "review_items": []})
    paragraphs = [f"Paragrafo {i}: " + "il ricovero ordinario dura più giorni. " * 4
                  for i in range(6)]
    code = "```sql\n" + "SELECT episode_id FROM clinical.episode;\n" * 12 + "```"
    body = "\n\n".join([*paragraphs, code]) + "\n"
    whole = build_fragments(unit, body, 4000)
    assert len(whole) == 1
    monkeypatch.setattr(fragments, "TARGET_FRAGMENT_CHARS", 300)
    small = build_fragments(unit, body, 4000)
    head = header(unit)
    contents = [f.text.removeprefix(head + "\n\n") for f in small]
    assert all(f.text.startswith(head + "\n\n") for f in small)
    assert len(small) > 3 and [f.ordinal for f in small] == list(range(len(small)))
    assert all(len(c) <= 300 for c in contents if not c.startswith("```"))
    assert code in contents  # an atomic element longer than the target stays whole
    assert "\n\n".join(contents) == "\n\n".join(
        f.text.removeprefix(head + "\n\n") for f in whole)  # nothing lost or reordered


def test_front_matter_html_wrappers_and_html_tables_in_a_note() -> None:
    note = ("---\ntitle: \"Esiti: dimissione\"\ntags: [sdo]\n---\n\n"
            "<div class=\"macro\">\n\n<!-- bozza: non pubblicare -->\n\n"
            "Codici di clinical.episode.discharge_status:\n\n"
            "<table><tr><th>Codice</th><th>Esito</th></tr>"
            "<tr><td>D</td><td>dimesso</td></tr><tr><td>T</td><td>trasferito</td></tr></table>\n"
            "\n</div>\n")
    normalized = normalize_text(note)
    assert normalized.startswith("---\ntitle: \"Esiti: dimissione\"\ntags: [sdo]\n---\n")
    reply = StructuralBackend().restructure(request(note))
    [unit] = reply.units  # nothing from the front matter, the comment or the wrapper tags
    assert unit.data["title"] == "Esiti: dimissione"
    assert unit.data["enum"] == {"column": "clinical.episode.discharge_status",
                                 "values": {"D": "dimesso", "T": "trasferito"}}
    assert "bozza" not in unit.body and "tags:" not in unit.body
