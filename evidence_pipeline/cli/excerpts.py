"""What ``tht evidence search`` shows of a result's excerpt to a person: the first lines, and
every line further down that the question asks about (an enum's code, a table row's key), so
the value asked for is never cut away."""

from __future__ import annotations

import re

HEAD_LINES = 6  # lines shown from the top of an excerpt
MAX_ASKED = 6  # lines further down shown because the question names their key
_WORD = re.compile(r"\w+")
_KEY = re.compile(r"^[\s|>*-]*(\w+)")


def _asked(line: str, words: set[str]) -> bool:
    """Does the question name this line's key (its first word: ``T`` of ``T = trasferito``,
    ``0`` of ``| 0 | …``)? A short key counts as written; a longer one in any case."""
    m = _KEY.match(line)
    if m is None:
        return False
    key = m.group(1)
    return key in words if len(key) <= 3 else key.casefold() in {w.casefold() for w in words}


def excerpt_lines(excerpt: str, question: str, *, head: int = HEAD_LINES) -> list[str]:
    """The excerpt's non-blank lines to show: the first ``head``, the asked ones after them
    (up to :data:`MAX_ASKED`), and a last line saying how many were left out."""
    lines = [line for line in excerpt.splitlines() if line.strip()]
    if len(lines) <= head + 1:
        return lines
    words = set(_WORD.findall(question))
    asked = [i for i in range(head, len(lines)) if _asked(lines[i], words)][:MAX_ASKED]
    shown = list(range(head)) + asked
    out = [lines[i] for i in shown]
    left = len(lines) - len(shown)
    if left:
        out.append(f"… ({left} more line(s); --json shows the whole excerpt)")
    return out
