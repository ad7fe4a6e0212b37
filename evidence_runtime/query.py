"""The search request contract and the deterministic query text of spec §9.6.

One text is rendered once and given, byte for byte, to both the dense embedder and BM25.
"""

from __future__ import annotations

import unicodedata

from pydantic import BaseModel, ConfigDict, Field

from evidence_runtime.errors import ErrorCode, EvidenceError
from evidence_runtime.units import EvidenceKind

_QUESTION_LABEL = "Domanda"
_LABELS = (("concepts", "Concetti"), ("tables", "Tabelle"), ("columns", "Colonne"))
# The label words every query text may carry whatever it asks: BM25 ignores them by default
# (thoth.yaml index.bm25_stopwords), for queries and fragments alike, so that they match
# nothing (issue 16: "Domanda" made BM25 return ten unrelated units for every question)
LABEL_STOPWORDS = tuple(w.lower() for w in (_QUESTION_LABEL, *(lbl for _, lbl in _LABELS)))


class EvidenceConstraints(BaseModel):
    """Explicit, binding filters: applied only when the caller declares them (spec §9.6)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kinds: tuple[EvidenceKind, ...] = ()
    tables: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    concepts: tuple[str, ...] = ()

    def is_empty(self) -> bool:
        return not (self.kinds or self.tables or self.columns or self.concepts)


class EvidenceSearchContext(BaseModel):
    """What a stage knows: values added to the query text, plus optional binding constraints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concepts: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    constraints: EvidenceConstraints = Field(default_factory=EvidenceConstraints)


# The longest query text (question and context, rendered) a search takes: far above any real
# question (the embedder reads at most 512 tokens of it), and a bound on the work a caller can ask
# for (a 40,000-character question took 34 s to embed). Refused, never cut, so that both
# branches always receive the text the caller gave.
MAX_QUERY_CHARS = 4000


class InvalidQueryError(EvidenceError, ValueError):
    """The question cannot be searched: a caller's bug, not a fault of the Evidence service, so
    it is raised rather than answered as ``unavailable``."""

    code = ErrorCode.invalid_query


class EmptyQueryError(InvalidQueryError):
    """The question is empty after normalization."""


def _clean(text: str) -> str:
    return unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n")).strip()


def context_values(values: tuple[str, ...] | list[str]) -> list[str]:
    """NFC + strip, empty strings and exact duplicates removed, sorted by code point."""
    return sorted({v for v in (_clean(x) for x in values) if v})


def _require_text(text: str) -> None:
    """:class:`InvalidQueryError` for a string that is not text: a lone surrogate (half of a
    UTF-16 pair, from a broken decoder) cannot be encoded, embedded nor matched."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise InvalidQueryError(f"the question or its context holds a lone surrogate "
                                f"(U+{ord(bad):04X}) at character {exc.start + 1}: not text; "
                                "decode the input correctly") from None


def render_query(question: str, context: EvidenceSearchContext | None = None) -> str:
    """Render ``Domanda / Concetti / Tabelle / Colonne`` exactly as spec §9.6 prescribes.

    The question keeps case, punctuation and inner spacing; only NFC, CR/LF → LF and outer
    whitespace are touched. Context values are deduplicated and sorted without case folding.
    """
    if not isinstance(question, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"the question must be a str, not {type(question).__name__}")
    q = _clean(question)
    _require_text(q)
    if not q:
        raise EmptyQueryError("the question is empty")
    if len(q) > MAX_QUERY_CHARS:  # before the context is rendered: a huge question costs nothing
        raise InvalidQueryError(f"the question is {len(q)} characters long; a search takes at "
                                f"most {MAX_QUERY_CHARS} (question and context)")
    lines = [f"{_QUESTION_LABEL}: {q}"]
    if context is not None:
        for attr, label in _LABELS:
            values = context_values(getattr(context, attr))
            if values:
                lines.append(f"{label}: {', '.join(values)}")
    text = "\n".join(lines)
    _require_text(text)
    if len(text) > MAX_QUERY_CHARS:
        raise InvalidQueryError(f"the question and its context are {len(text)} characters long "
                                f"once rendered; a search takes at most {MAX_QUERY_CHARS}")
    return text
