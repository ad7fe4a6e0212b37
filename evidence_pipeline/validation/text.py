"""Text a reviewer cannot see as it is (issue 28, items 8 and 9).

- Invisible characters (Unicode category Cf: zero-width, bidirectional controls — the "Trojan
  Source" class, CVE-2021-42574 —, soft hyphen, tags): a review item naming the field and the
  code points, wherever they are in a unit.
- A word of a title that mixes letters of two scripts, one of them a look-alike of a Latin
  letter (a Cyrillic 'а' in "pediаtrica"): a review item naming the letters.
- :func:`scan_form`: the form the credential rules read (invisible characters removed, NFKC).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterator
from typing import Any

__all__ = [
    "INVISIBLE_TEXT",
    "MIXED_SCRIPT_TITLE",
    "has_invisible",
    "invisible_code_points",
    "mixed_script_letters",
    "scan_form",
    "text_findings",
    "walk_strings",
]

INVISIBLE_TEXT = "invisible_characters"
MIXED_SCRIPT_TITLE = "mixed_script_title"

# Every character of category Cf (Unicode 14, tests/test_hostile_repo.py checks it against the
# running Python's tables).
_INVISIBLE = re.compile(
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f]")
# The same split in two for speed: a class with astral ranges makes ``re`` scan about ten times
# slower, and astral characters are rare; the full class runs only where one is.
_INVISIBLE_BMP = re.compile(
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb]")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
_WORD = re.compile(r"[^\W\d_]+")  # a run of letters


def scan_form(text: str) -> str:
    """``text`` with invisible characters removed, then NFKC-normalized (fullwidth
    ``ＰＧＰＡＳＳＷＯＲＤ`` is ``PGPASSWORD``); ASCII text is returned as it is."""
    if text.isascii():
        return text
    if has_invisible(text):
        text = _INVISIBLE.sub("", text)
    return text if unicodedata.is_normalized("NFKC", text) else unicodedata.normalize("NFKC", text)


def has_invisible(text: str) -> bool:
    """Whether ``text`` holds an invisible character."""
    if text.isascii():
        return False
    if _INVISIBLE_BMP.search(text) is not None:
        return True
    return _ASTRAL.search(text) is not None and _INVISIBLE.search(text) is not None


def invisible_code_points(text: str) -> list[str]:
    """The invisible characters of ``text``, once each in order, as ``U+200B ZERO WIDTH
    SPACE``."""
    if not has_invisible(text):
        return []
    found = dict.fromkeys(_INVISIBLE.findall(text))
    return [f"U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')}" for ch in found]


def _script(ch: str) -> str:
    """The script of a letter as its Unicode name starts (LATIN, CYRILLIC, GREEK, …)."""
    return unicodedata.name(ch, "UNKNOWN").split(" ", 1)[0]


def mixed_script_letters(text: str) -> list[str]:
    """Letters of a word of ``text`` that is written in two scripts, where they look like a
    letter of the word's other script (``U+0430 CYRILLIC SMALL LETTER A in 'pediаtrica'``);
    a word wholly in one script (``β-bloccanti``) is fine."""
    if text.isascii():
        return []
    from confusable_homoglyphs import confusables  # its tables load on first use

    out: list[str] = []
    for word in _WORD.findall(text):
        scripts = Counter(_script(ch) for ch in word)
        if len(scripts) < 2:
            continue
        main = scripts.most_common(1)[0][0]  # the word's script; the others are intruders
        for found in confusables.is_confusable(word, greedy=True,
                                               preferred_aliases=[main.lower()]) or []:
            ch = found["character"]
            if _script(ch) != main and any(h["n"].startswith(f"{main} ")
                                           for h in found["homoglyphs"]):
                out.append(f"U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')} in {word!r}")
    return list(dict.fromkeys(out))


def walk_strings(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """Every string in nested data, with its dotted field path (mapping keys too, below the
    top level)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if prefix:  # a key is text too (an enum code)
                yield prefix, str(k)
            yield from walk_strings(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk_strings(v, f"{prefix}[{i}]")
    elif isinstance(value, str):
        yield prefix, value


def text_findings(data: dict[str, Any], body: str | None) -> list[tuple[str, str, str]]:
    """(code, field, message) of each field (and the body) holding invisible characters, and
    of a title mixing scripts; review items, since the text may be right but cannot be seen
    as it is."""
    out: list[tuple[str, str, str]] = []
    fields = [*walk_strings({k: v for k, v in data.items() if k != "review_items"})]
    if body is not None:
        fields.append(("body", body))
    for field, text in fields:
        points = invisible_code_points(text)
        if points:
            out.append((INVISIBLE_TEXT, field,
                        f"{field} holds invisible or direction-changing characters a reviewer "
                        f"cannot see: {', '.join(points[:5])}"
                        f"{f' and {len(points) - 5} more' if len(points) > 5 else ''}; "
                        "remove them or say why they are needed"))
    title = data.get("title")
    if isinstance(title, str):
        letters = mixed_script_letters(title)
        if letters:
            out.append((MIXED_SCRIPT_TITLE, "title",
                        f"the title mixes scripts in one word and looks like another text: "
                        f"{'; '.join(letters[:5])}; write it in one script"))
    return out
