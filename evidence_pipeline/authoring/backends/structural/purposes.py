"""The purpose policy (docs/purposes.md): a unit gets every purpose whose stage could use it.

A purpose is a mandatory search filter (spec §9.6): a unit without it is hidden from that
stage's searches for good, while an extra purpose only costs the stage one candidate to ignore.
So purposes follow what the unit says, and in doubt a purpose is included:

- ``disambiguation`` (clarification) and ``rewriting``: every unit says what a term, a code, a
  rule, a concept or a question means, which is what these stages look for;
- ``schema_linking``: the unit names a table or a column (in ``applies_to``, its typed block or
  its SQL): there is something to link;
- ``sql_generation``: every unit a query could have to express (a rule, a condition, a code, an
  expression, a normalization, an example, a definition, where a concept lives), i.e. all but
  a ``reference`` that names no table or column: an external link a SQL statement cannot use.
"""

from __future__ import annotations

from collections.abc import Iterable

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
