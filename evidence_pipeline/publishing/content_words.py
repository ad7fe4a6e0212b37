"""The content words of a text, and which of them another text lacks (``tht evidence suggest``).

A word is a content word when BM25 keeps it (the stop-word list and Snowball stemmer packaged
with the index engine, ``qdrant_edge.Bm25``, the same ones the generation's fragments and
queries are tokenized with) and the ``stop-words`` package's longer list of the language does
not name it: BM25's Italian list keeps "viene", "cosa", "qui", "ogni", "essere", words a
curator would never write as a concept. Two words are the same word when they share a stem
(its BM25 token id), so "ricoveri" is present in a unit that says "ricovero".
"""

from __future__ import annotations

import re

import qdrant_edge as qe
from stop_words import StopWordError, get_stop_words

from evidence_runtime.index.base import Bm25Settings

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")


class ContentWords:
    """Content words of texts in one language (``italian``, ``english``, … as BM25 names them),
    with the workspace's extra stop words (thoth.yaml ``index.bm25_stopwords``)."""

    def __init__(self, language: str, stopwords: tuple[str, ...] = ()) -> None:
        self._bm25 = qe.Bm25(Bm25Settings(language=language, stopwords=stopwords).edge_config())
        self._memo: dict[str, frozenset[int]] = {}
        try:
            self._function_words = frozenset(w.casefold() for w in get_stop_words(language))
        except StopWordError:  # a language the package lacks: BM25's list alone
            self._function_words = frozenset()

    def stems(self, word: str) -> frozenset[int]:
        """The word's BM25 token ids; empty for a stop word."""
        key = word.casefold()
        hit = self._memo.get(key)
        if hit is None:
            hit = frozenset(int(i) for i in self._bm25.embed_query(key).indices)
            self._memo[key] = hit
        return hit

    def words(self, text: str) -> list[str]:
        """The content words of ``text``, lower case, in order of first appearance, once each
        (an elided article is dropped: "dell'ospedale" → "ospedale")."""
        out: dict[str, None] = {}
        for token in _WORD.findall(text):
            word = re.split(r"['’]", token.casefold())[-1]
            if (len(word) > 1 and not word.isdigit() and word not in self._function_words
                    and self.stems(word)):
                out.setdefault(word, None)
        return list(out)

    def vocabulary(self, text: str) -> frozenset[int]:
        """Every stem of ``text``."""
        return frozenset(s for token in _WORD.findall(text)
                         for part in re.split(r"['’]", token.casefold())
                         for s in self.stems(part))

    def absent(self, question: str, text: str) -> list[str]:
        """The content words of ``question`` whose stems ``text`` never uses."""
        known = self.vocabulary(text)
        return [w for w in self.words(question) if not self.stems(w) <= known]
