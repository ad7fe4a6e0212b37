"""The purpose policy (docs/purposes.md): a unit gets every purpose whose stage could use it.

A purpose is a mandatory search filter (spec §9.6): a unit without it is hidden from that
stage's searches for good, while an extra purpose only costs the stage one candidate to ignore.
So purposes follow what the unit says, and in doubt a purpose is included:

- ``disambiguation`` (clarification) and ``rewriting``: every unit says what a term, a code, a
  rule, a concept or a question means, which is what these stages look for;
- ``schema_linking``: the unit names a table or a column (in ``applies_to``, its typed block or
  its SQL), or lists the values of one even when the note names the column only in words ("lo
  stato della scheda SDO", "the status field": :func:`lists_values`): there is something to
  link;
- ``sql_generation``: every unit a query could have to express (a rule, a condition, a code, an
  expression, a normalization, an example, a definition, where a concept lives), i.e. all but
  a ``reference`` that names no table or column: an external link a SQL statement cannot use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from evidence_pipeline.authoring.backends.structural.text import is_code
from evidence_runtime.units import EvidenceKind, EvidencePurpose

P = EvidencePurpose


def policy_purposes(kind: EvidenceKind, *, names_schema: bool) -> tuple[EvidencePurpose, ...]:
    """The purposes of a unit of ``kind`` that names a table or a column (``names_schema``) or
    not, in the order of :class:`EvidencePurpose`."""
    wanted = {P.disambiguation, P.rewriting}
    if names_schema:
        wanted |= {P.schema_linking, P.sql_generation}
    elif kind is not EvidenceKind.reference:
        wanted.add(P.sql_generation)
    return tuple(p for p in EvidencePurpose if p in wanted)


def names_schema(tables: Iterable[str], columns: Iterable[str], block: object) -> bool:
    """Whether a unit names a table or a column: in ``applies_to`` or in its typed block (an
    enum's column, a mapping's or formula's tables and columns, an example's SQL)."""
    if any(True for _ in tables) or any(True for _ in columns):
        return True
    if not isinstance(block, dict):
        return False
    return any(bool(block.get(name)) for name in ("column", "columns", "tables", "sql"))


# a table row; a separator row (|---|:--|)
_ROW = re.compile(r"^\s*\|(?P<cells>.+)\|\s*$")
_SEPARATOR = re.compile(r"^[\s|:-]+$")
# one value per line, as a list item or not: ``B = bozza``, ```B`: bozza``, ``01 - ordinario``
_VALUE_LINE = re.compile(r"^\s*(?:[-*+]\s+|\d+[.)]\s+)?"
                         r"(?P<tick>`?)(?P<code>[^\s`=:]{1,16})(?P=tick)"
                         r"\s*(?P<sep>=|:|→|->|–|—| - )\s*\S")
# prose that says the list is a column's values
_VALUE_CUE = re.compile(r"\b(?:valor[ei]|codic[ei]|codific\w*|camp[oi]|colonn[ae]|attribut[oi]|"
                        r"stat[oi]|values?|codes?|coded|fields?|columns?|status)\b",
                        re.IGNORECASE)


def lists_values(text: str) -> bool:
    """Whether ``text`` (a unit's body) lists the values of a column: a table of at least two
    rows whose first cell is a code and whose second says what it means, at least two
    ``code = meaning`` lines, or one such line where the prose speaks of values, codes or a
    field (a glossary item cut from a list of codes)."""
    lines = text.splitlines()
    rows = [[c.strip().strip("`") for c in m.group("cells").split("|")]
            for line in lines if (m := _ROW.match(line))
            and not _SEPARATOR.match(m.group("cells"))]
    data = rows[1:]  # the first row is the header
    if len(data) >= 2 and all(len(r) >= 2 and is_code(r[0]) and r[1] for r in data):
        return True
    values = 0
    for line in lines:
        m = _VALUE_LINE.match(line)
        if m is None or not is_code(m.group("code")):
            continue
        # ``word: text`` is a label ("Nota: …") unless the word is written as code or short
        if m.group("sep") == ":" and not (m.group("tick") or len(m.group("code")) <= 3
                                          or m.group("code").isupper()):
            continue
        values += 1
    return values >= 2 or (values == 1 and bool(_VALUE_CUE.search(text)))
