"""The purpose policy of the structural backend (docs/purposes.md) for a unit that lists the
values of a column (issue 26 item 6): it needs ``schema_linking`` even when the note names the
column only in prose, so that no schema identifier is found (the SDO status case of the
Italian DWH notes: a ``purpose_filtered`` miss on a schema-linking question).
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from evidence_pipeline.authoring.backends.base import ModelRequest
from evidence_pipeline.authoring.backends.structural import StructuralBackend
from evidence_pipeline.authoring.backends.structural.purposes import lists_values
from evidence_pipeline.formats.normalize import normalize_text

EVERY = ["disambiguation", "rewriting", "schema_linking", "sql_generation"]


def units(text: str) -> list[dict[str, Any]]:
    req = ModelRequest(source_file="source/note.md",
                       source_sha256="sha256:" + hashlib.sha256(text.encode()).hexdigest(),
                       normalized_text=normalize_text(text), language="it",
                       previous_units=(), max_chunk_chars=4000)
    return [u.data for u in StructuralBackend().restructure(req).units]


# the values in a table, the column named only in words ("lo stato della scheda")
TABLE = """\
# Scheda SDO

## Stato della scheda

Lo stato della scheda SDO indica a che punto è la sua compilazione:

| stato | significato |
|---|---|
| B | bozza |
| C | chiusa |
| I | inviata alla Regione |
"""

# the values as lines ``code = meaning``, the field named in prose
LINES = """\
# Scheda SDO

## Stato

Il campo stato della scheda assume questi valori:

- B = bozza
- C = chiusa
- I = inviata alla Regione
"""

# an English note: the column is "the status field"
ENGLISH = """\
# Orders

## Order status

The status field of an order takes these values:

| code | meaning |
|---|---|
| N | new |
| S | shipped |
| X | cancelled |
"""


@pytest.mark.parametrize("text", [TABLE, LINES, ENGLISH], ids=["table", "lines", "english"])
def test_a_unit_listing_a_column_s_values_named_only_in_prose_has_schema_linking(
        text: str) -> None:
    listing = [u for u in units(text) if any(v in str(u) for v in ("bozza", "shipped"))]
    assert listing, units(text)
    for u in listing:
        assert u["purposes"] == EVERY, (u["kind"], u["title"])


def test_prose_without_a_list_of_values_gets_no_schema_linking() -> None:
    text = ("# Scheda SDO\n\n## Compilazione\n\nLa scheda SDO si compila alla dimissione del "
            "paziente e si invia alla Regione entro il mese successivo.\n")
    (u,) = units(text)
    assert "schema_linking" not in u["purposes"]


def test_a_table_that_lists_no_codes_gets_no_schema_linking() -> None:
    text = ("# Reparti\n\n## Responsabili\n\nChi risponde di ogni reparto:\n\n"
            "| reparto | responsabile della struttura |\n|---|---|\n"
            "| Cardiologia dell'adulto | dottoressa Bianchi |\n"
            "| Medicina generale interna | dottor Rossi |\n")
    for u in units(text):
        assert "schema_linking" not in u["purposes"], (u["kind"], u["title"])


@pytest.mark.parametrize(("body", "listed"), [
    ("| codice | significato |\n|---|---|\n| 1 | ordinario |\n| 2 | urgente |", True),
    ("Valori ammessi:\n\n- `A` = aperto\n- `C` = chiuso", True),
    ("Il campo esito vale:\n\n- D = deceduto", True),  # one value, the prose names the field
    ("- D = deceduto", False),  # one value, nothing says it is a column's
    ("Nota: vale solo per i ricoveri.\nEccezione: i day hospital.", False),  # labels
    ("| reparto | responsabile |\n|---|---|\n| Medicina interna | Rossi |\n"
     "| Chirurgia generale | Bianchi |", False),  # names, not codes
])
def test_lists_values_reads_value_tables_and_lines_not_labels(body: str, listed: bool) -> None:
    assert lists_values(body) is listed
