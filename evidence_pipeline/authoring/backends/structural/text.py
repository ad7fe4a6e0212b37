"""Small verbatim text helpers of the structural backend: they only cut, never add."""

from __future__ import annotations

import re

URL = re.compile(r"https?://[^\s<>)\]\"']+")
MD_LINK = re.compile(r"\[([^\]]+)\]\((https?://[^\s)]+)\)")
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"

_SENTENCE_END = re.compile(r"[.!?;:,]+$")
_EMPHASIS = re.compile(r"(?<![\w*])(\*\*|\*)(?=\S)(.+?)(?<=\S)\1(?![\w*])"
                       r"|(?<!\w)(__|_)(?=\S)(.+?)(?<=\S)\3(?!\w)")


def add(values: list[str], value: str) -> None:
    """Append ``value`` unless it is empty or already there (order of first appearance)."""
    if value and value not in values:
        values.append(value)


def unemph(text: str) -> str:
    return _EMPHASIS.sub(lambda m: m.group(2) or m.group(4), text).strip()


def unquote(text: str) -> str:
    s = text.strip()
    for a, b in (("'", "'"), ('"', '"'), ("`", "`"), ("“", "”"), ("«", "»")):
        if len(s) >= 2 and s.startswith(a) and s.endswith(b) and a not in s[1:-1]:
            return s[1:-1]
    return s


def unquote_code(text: str) -> str:
    s = text.strip()
    if len(s) >= 2 and s.startswith("`") and s.endswith("`") and "`" not in s[1:-1]:
        return s[1:-1]
    return s


def trim(text: str) -> str:
    return _SENTENCE_END.sub("", text.strip()).strip()


def strip_joiners(text: str) -> str:
    return re.sub(r"^[\s:—–\-,;]+|[\s:—–\-,;]+$", "", text)


def first_words(text: str, n: int = 8) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = re.sub(r"^(?:- |\d{1,3}\. |#+ )", "", line)
    words = unemph(line).split()
    return trim(" ".join(words[:n])) or " ".join(words[:n])


def balanced(text: str) -> bool:
    return text.count("(") == text.count(")") and text.count('"') % 2 == 0


def is_code(value: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9_.*%+-]{1,16}", value))
