"""Evidence Fragments (spec §9.8): index cards cut along headings, typed fields and paragraphs.

A fragment's rendered text — labels and textual metadata included — is exactly what the
embedder and BM25 receive, and it never exceeds ``max_chunk_chars``. Atomic elements (a formula,
a value/meaning pair, a mapping, a rule, a URL, a code block) are never split: one that cannot
fit on its own is the review item ``atomic_content_too_large``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import qdrant_edge as qe

from evidence_pipeline import markdown
from evidence_pipeline.markdown import BlockKind
from evidence_runtime.index.base import DEFAULT_BM25_AVG_LEN, Bm25Settings
from evidence_runtime.units import (
    DomainUnit,
    EnumUnit,
    ExampleUnit,
    FormulaUnit,
    GlossaryUnit,
    MappingUnit,
    NormalizationUnit,
    ReferenceUnit,
    UnitBase,
)

ATOMIC_TOO_LARGE = "atomic_content_too_large"

# The content a fragment packs at most besides its header, when smaller than what
# ``max_chunk_chars`` leaves (spec §9.8: no second user setting). None: pack up to
# ``max_chunk_chars``. Measured in bench/README ("granularity", issue 26 item 3).
TARGET_FRAGMENT_CHARS: int | None = None

KIND_LABELS = {
    "glossary": "glossario",
    "domain": "regola di dominio",
    "enum": "valori codificati",
    "example": "esempio",
    "mapping": "mapping",
    "normalization": "normalizzazione",
    "formula": "formula",
    "reference": "riferimento",
}


@dataclass(frozen=True)
class Piece:
    """One element; atomic ones are never split. ``field`` says where it comes from; a
    heading is kept with the piece that follows it; a table (``rows``) is cut only between
    rows."""

    text: str
    field: str
    atomic: bool = True
    heading: bool = False
    rows: bool = False


@dataclass(frozen=True)
class Fragment:
    evidence_id: str
    ordinal: int
    text: str


class AtomicTooLarge(Exception):
    def __init__(self, field: str, size: int, limit: int) -> None:
        super().__init__(f"{field}: {size} characters do not fit in one fragment "
                         f"(max_chunk_chars {limit})")
        self.field = field
        self.size = size
        self.limit = limit


def header(unit: UnitBase) -> str:
    """The labels every fragment of a unit repeats: title, kind and applies_to."""
    lines = [f"Titolo: {unit.title}", f"Tipo: {KIND_LABELS[unit.kind.value]}"]
    if unit.applies_to.concepts:
        lines.append("Concetti: " + ", ".join(unit.applies_to.concepts))
    if unit.applies_to.tables:
        lines.append("Tabelle: " + ", ".join(unit.applies_to.tables))
    if unit.applies_to.columns:
        lines.append("Colonne: " + ", ".join(unit.applies_to.columns))
    return "\n".join(lines)


def typed_pieces(unit: UnitBase) -> list[Piece]:
    """The kind block rendered as labelled pieces, one per atomic element."""
    p: list[Piece] = []
    if isinstance(unit, GlossaryUnit):
        g = unit.glossary
        p.append(Piece(f"Termine: {g.term}\nDefinizione: {g.definition}", "glossary.definition"))
        if g.synonyms:
            p.append(Piece("Sinonimi: " + ", ".join(g.synonyms), "glossary.synonyms"))
    elif isinstance(unit, DomainUnit):
        d = unit.domain
        p.append(Piece(f"Regola: {d.rule}", "domain.rule"))
        p.extend(Piece(f"Condizione: {c}", f"domain.conditions[{i}]")
                 for i, c in enumerate(d.conditions))
        p.extend(Piece(f"Eccezione: {c}", f"domain.exceptions[{i}]")
                 for i, c in enumerate(d.exceptions))
    elif isinstance(unit, EnumUnit):
        e = unit.enum
        p.append(Piece(f"Colonna: {e.column}", "enum.column"))
        p.extend(Piece(f"{code} = {meaning}", f"enum.values.{code}")
                 for code, meaning in e.values.items())
    elif isinstance(unit, ExampleUnit):
        x = unit.example
        p.append(Piece(f"Domanda: {x.question}", "example.question"))
        p.append(Piece(f"Interpretazione: {x.interpretation}", "example.interpretation"))
        if x.sql:
            p.append(Piece(f"SQL:\n{x.sql}", "example.sql"))
    elif isinstance(unit, MappingUnit):
        m = unit.mapping
        text = f"Concetto: {m.concept}\nTabelle: {', '.join(m.tables)}"
        if m.columns:
            text += f"\nColonne: {', '.join(m.columns)}"
        p.append(Piece(text, "mapping"))
        if m.notes:
            p.append(Piece(f"Note: {m.notes}", "mapping.notes", atomic=False))
    elif isinstance(unit, NormalizationUnit):
        n = unit.normalization
        p.append(Piece(f"Oggetto: {n.subject}\nRegola: {n.rule}", "normalization.rule"))
        p.extend(Piece(f"Esempio: {ex.raw} → {ex.normalized}", f"normalization.examples[{i}]")
                 for i, ex in enumerate(n.examples))
    elif isinstance(unit, FormulaUnit):
        f = unit.formula
        p.append(Piece(f"Concetto: {f.concept}\nColonne: {', '.join(f.columns)}\n"
                       f"Espressione SQL:\n{f.sql}", "formula"))
    elif isinstance(unit, ReferenceUnit):
        r = unit.reference
        p.append(Piece(f"Riferimento: {r.label}\nURL: {r.url}", "reference.url"))
        p.append(Piece(f"Descrizione: {r.description}", "reference.description", atomic=False))
    return p


def body_pieces(body: str, title: str) -> list[Piece]:
    """Body blocks in the shared Markdown grammar: a heading is a piece, a code block is one
    atomic piece, other blocks are cut at their blank lines (never inside nested code).

    The leading ``# <title>`` heading that curated files carry is dropped (the header has it).
    Remembered per process (a publication cuts each body twice: validation checks that its
    atomic elements fit, then the fragments are built), and across runs through the unit
    cache (:func:`known_pieces`): the Markdown parse is the cost.
    """
    return list(_body_pieces(body, title))


_KNOWN: dict[tuple[str, str], tuple[Piece, ...]] = {}
_KNOWN_MAX = 100_000


def known_pieces(body: str, title: str, pieces: Sequence[Piece]) -> None:
    """The pieces of (``body``, ``title``) as an earlier run computed them (the unit cache
    keeps them with the file's bytes and this module's source): :func:`body_pieces` takes them
    instead of parsing the body again."""
    if len(_KNOWN) >= _KNOWN_MAX:
        _KNOWN.clear()
    _KNOWN[(body, title)] = tuple(pieces)


@functools.lru_cache(maxsize=4096)
def _body_pieces(body: str, title: str) -> tuple[Piece, ...]:
    known = _KNOWN.pop((body, title), None)
    return known if known is not None else _parse_pieces(body, title)


def _parse_pieces(body: str, title: str) -> tuple[Piece, ...]:
    found: list[tuple[str, bool, bool, bool]] = []  # (text, atomic, heading, rows)
    for block in markdown.parse_blocks(body):
        if block.kind is BlockKind.heading:
            found.append(("\n".join(line.strip() for line in block.lines), False, True, False))
            continue
        for part in block.parts():
            text = part.text.strip()
            if text:
                found.append((text, part.code, False, block.kind is BlockKind.table))
    if found and found[0][0].lstrip("# ").strip() == title.strip():
        found = found[1:]
    return tuple(Piece(text, f"body[{i}]", atomic=atomic or bool(re.fullmatch(r"\S+", text)),
                       heading=heading, rows=rows)
                 for i, (text, atomic, heading, rows) in enumerate(found))


# line, sentence, word boundaries; the separator is captured so that it is kept as written
_SOFT_BREAKS = (r"(\n)", r"(?<=[.!?;:])(\s+)", r"(\s+)")


def _split_soft(text: str, limit: int, *, rows: bool = False) -> list[str]:
    """Split a non-atomic paragraph at line, then sentence, then word boundaries.

    Pieces keep their original separators (a list stays a list). A table (``rows``) is cut
    only between rows, each row a value/meaning pair that is never cut: a table holding a row
    longer than ``limit`` is returned whole for the caller to refuse.
    """
    if len(text) <= limit:
        return [text]
    if rows and any(len(line) > limit for line in text.split("\n")):
        return [text]
    for pattern in _SOFT_BREAKS[:1] if rows else _SOFT_BREAKS:
        tokens = re.split(pattern, text)  # part, separator, part, separator, ...
        if len(tokens) < 3:
            continue
        out: list[str] = []
        cur = tokens[0]
        for sep, part in zip(tokens[1::2], tokens[2::2], strict=True):
            if len(cur) + len(sep) + len(part) <= limit:
                cur = f"{cur}{sep}{part}"
            else:
                out.append(cur)
                cur = part
        out.append(cur)
        out = [o.strip() for o in out if o.strip()]
        if all(len(o) <= limit for o in out):
            return out
    return [text]


def build_fragments(unit: UnitBase, body: str, max_chunk_chars: int) -> list[Fragment]:
    """Cut one unit into fragments; raises :class:`AtomicTooLarge` for an element that cannot
    fit even alone with the header."""
    head = header(unit)
    budget = max_chunk_chars - len(head) - 2  # two newlines between header and content
    if budget < 1:
        # the labels every fragment repeats (title, kind, applies_to) leave no room at all
        raise AtomicTooLarge("applies_to", len(head), max_chunk_chars)
    # content packed per fragment: the target when smaller; an atomic element longer than
    # the target stays whole (it still has to fit ``budget``)
    target = budget if TARGET_FRAGMENT_CHARS is None else min(budget, TARGET_FRAGMENT_CHARS)
    pieces = _with_headings(typed_pieces(unit) + body_pieces(body, unit.title), budget)
    texts: list[str] = []
    for piece in pieces:
        if len(piece.text) <= target or (piece.atomic and len(piece.text) <= budget):
            texts.append(piece.text)
            continue
        if piece.atomic:
            raise AtomicTooLarge(piece.field, len(piece.text), max_chunk_chars)
        soft = _split_soft(piece.text, target, rows=piece.rows)
        if any(len(s) > target for s in soft):
            soft = _split_soft(piece.text, budget, rows=piece.rows)
        if any(len(s) > budget for s in soft):
            raise AtomicTooLarge(piece.field, len(piece.text), max_chunk_chars)
        texts.extend(soft)
    fragments: list[Fragment] = []
    current: list[str] = []
    for text in texts:
        candidate = "\n\n".join([*current, text])
        if current and len(candidate) > target:
            fragments.append(_fragment(unit, head, current, len(fragments)))
            current = [text]
        else:
            current.append(text)
    if current or not fragments:
        fragments.append(_fragment(unit, head, current, len(fragments)))
    return fragments


def _with_headings(pieces: list[Piece], budget: int) -> list[Piece]:
    """Join each heading to the block that follows it, so that a section never starts in one
    fragment and continues in the next (unless that would make an atomic block too large)."""
    out: list[Piece] = []
    for piece in reversed(pieces):
        if piece.heading and out:
            nxt = out[-1]
            joined = f"{piece.text}\n\n{nxt.text}"
            if not nxt.atomic or len(joined) <= budget:
                out[-1] = Piece(joined, nxt.field, atomic=nxt.atomic, rows=nxt.rows)
                continue
        out.append(piece)
    out.reverse()
    return out


def _fragment(unit: UnitBase, head: str, texts: list[str], ordinal: int) -> Fragment:
    content = "\n\n".join(texts)
    return Fragment(unit.id, ordinal, f"{head}\n\n{content}" if content else head)


def atomic_problems(unit: UnitBase, body: str, max_chunk_chars: int) -> list[tuple[str, str]]:
    """(field, message) for an atomic element too large for one fragment (empty when fine)."""
    try:
        build_fragments(unit, body, max_chunk_chars)
    except AtomicTooLarge as exc:
        return [(exc.field, str(exc))]
    return []


# BM25 of a generation ---------------------------------------------------------------------

_PROBE_K = 1.2  # a BM25 with b=1 and avg_len=1: a term's value tf·(k+1)/(tf + k·len) gives len


def bm25_length(text: str, settings: Bm25Settings) -> int:
    """The number of tokens BM25 counts in ``text`` (its document length) under ``settings``.

    Edge's embedder shows no tokens, only the weights: with b=1 and avg_len=1 a term of
    frequency tf weighs w = tf·(k+1)/(tf + k·len), so tf = k·len·w/(k+1−w). The
    least-weighted term has the smallest frequency: assuming it is 1 (then 2, …) gives len,
    kept when every frequency it implies is a whole number.
    """
    probe = qe.Bm25(qe.Bm25Config(
        k=_PROBE_K, b=1.0, avg_len=1.0, language=settings.language,
        stopwords=settings.edge_config().stopwords))
    values = probe.embed_document(text).values
    if not values:
        return 0
    low = min(values)
    for tf_low in range(1, 50):
        length = tf_low * ((_PROBE_K + 1) / low - 1) / _PROBE_K
        tfs = [_PROBE_K * length * v / (_PROBE_K + 1 - v) for v in values]
        if all(abs(tf - round(tf)) < 0.02 for tf in tfs):
            return round(sum(tfs))
    return len(values)  # not reached for real texts: at least the distinct terms


def bm25_settings(language: str, texts: Sequence[str], *, avg_len: float | str,
                  stopwords: Sequence[str]) -> Bm25Settings:
    """The BM25 settings a generation's fragments are tokenized with, recorded with it and
    used by its searches on either engine: the workspace's extra stop words, and ``avg_len``
    as configured or, for ``corpus``, the mean BM25 length of these fragments (at least 1)."""
    base = Bm25Settings(language=language, stopwords=tuple(sorted(set(stopwords))))
    if avg_len != "corpus":
        return Bm25Settings(language=language, avg_len=float(avg_len), stopwords=base.stopwords)
    lengths = [bm25_length(t, base) for t in texts]
    mean = sum(lengths) / len(lengths) if lengths else DEFAULT_BM25_AVG_LEN
    return Bm25Settings(language=language, avg_len=max(1.0, round(mean, 1)),
                        stopwords=base.stopwords)
