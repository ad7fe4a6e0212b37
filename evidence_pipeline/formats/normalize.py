"""Mechanical normalization of source text (spec §5.2), shared by prepare and the validator.

Only mechanics: line endings, Unicode NFC, embedded binary data, spacing, obvious headings, list
bullets, table cell padding, code fences; a leading front matter is kept as written. Nothing is
interpreted, nothing semantic is added. Excerpt matching
compares texts after this normalization with every whitespace run (line breaks included) seen
as one space, so re-wrapped quotes match, while look-alike characters, zero-width characters or
words run together do not.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from evidence_pipeline.markdown import front_matter_lines

# Unicode space separators other than the plain space become a plain space; zero-width
# characters are *not* removed (a quote containing them is a near-miss, not a match).
_SPACES = re.compile("[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000\t]")
_MULTISPACE = re.compile(r"(?<=\S) {2,}")
_ATX_NO_SPACE = re.compile(r"^(#{1,6})([^#\s])")
_ATX_CLOSING = re.compile(r"(?:\s+#+)+\s*$")  # every trailing run, or a second pass finds one
_BULLET = re.compile(r"^(\s*)(?:[*+•▪◦‣]|–|—)\s+")
_ORDERED_PAREN = re.compile(r"^(\s*)(\d{1,3})\)\s+")
# a fence opens with three or more backticks or tildes and an info string (no backtick after
# backticks); it closes with a line of the same character, at least as long (CommonMark)
_FENCE = re.compile(r"^(\s*)(`{3,}(?=[^`]*$)|~{3,})\s*(.*?)\s*$")
_LANG = re.compile(r"[A-Za-z0-9_+-]+")
_SETEXT = re.compile(r"^(=+|-+)\s*$")
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_WS = re.compile(r"\s+")

# Embedded binary (spec §5.1): an image or a link whose target is a data: URI holds no text a
# unit could use, can be megabytes long and must never reach the model. An image goes whole (its
# alt text too), a link keeps its text, a reference definition goes with the images using it.
_TITLE = r"""(?:\s+(?:"[^"\n]*"|'[^'\n]*'|\([^)\n]*\)))?"""
_DATA_TARGET = rf"\(\s*(?:<\s*data:[^>\n]*>|data:[^)\s]*){_TITLE}\s*\)"
_DATA_IMAGE = re.compile(rf"!\[[^\]\n]*\]{_DATA_TARGET}", re.IGNORECASE)
_DATA_LINK = re.compile(rf"\[([^\]\n]*)\]{_DATA_TARGET}", re.IGNORECASE)
_DATA_IMG_TAG = re.compile(
    r"""<img\b[^>]*?\bsrc\s*=\s*(?:"\s*data:[^"]*"|'\s*data:[^']*'|data:[^\s>]*)[^>]*>""",
    re.IGNORECASE)
# a blank is any character _SPACES turns into a space, so a definition is dropped on the first
# pass whether or not its indentation is written with tabs or no-break spaces (idempotence)
_BLANK = "[ \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000\t]"
_DATA_DEFINITION = re.compile(
    rf"^{_BLANK}{{0,3}}\[([^\]\n]+)\]:{_BLANK}*(?:<data:[^>\n]*>|data:\S*){_TITLE}{_BLANK}*$",
    re.IGNORECASE | re.MULTILINE)
_REF_IMAGE = re.compile(r"!\[([^\]\n]*)\](?:\[([^\]\n]*)\])?")


def drop_embedded_data(text: str) -> tuple[str, int]:
    """The text without images and links whose target is a ``data:`` URI, and how many went."""
    dropped = 0
    labels: set[str] = set()

    def definition(m: re.Match[str]) -> str:
        labels.add(_label(m.group(1)))
        return ""

    def use(m: re.Match[str]) -> str:
        nonlocal dropped
        if _label(m.group(2) or m.group(1)) not in labels:
            return m.group(0)
        dropped += 1
        return ""

    for _ in range(8):  # a removal can uncover another (an image inside a link's text)
        before = dropped
        text, n = _DATA_DEFINITION.subn(definition, text)
        dropped += n
        for pattern, repl in ((_DATA_IMAGE, ""), (_DATA_IMG_TAG, ""), (_DATA_LINK, r"\1")):
            text, n = pattern.subn(repl, text)
            dropped += n
        if labels:
            text = _REF_IMAGE.sub(use, text)
        if dropped == before:
            break
    return text, dropped


def _label(label: str) -> str:
    return " ".join(label.split()).casefold()


def normalize_text(text: str) -> str:
    """Normalize a source note mechanically; idempotent, ends with exactly one newline."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = unicodedata.normalize("NFC", text).removeprefix("\ufeff")
    text = drop_embedded_data(text)[0]
    lines = text.split("\n")
    out: list[str] = []
    n = front_matter_lines(text)
    out.extend(_SPACES.sub(" ", line).rstrip() for line in lines[:n])
    while n < len(lines):
        line = _SPACES.sub(" ", lines[n]).rstrip()
        fence = _FENCE.match(line)
        if fence:
            end = _fence_end(lines, n, fence.group(2))
            block = [_SPACES.sub(" ", raw).rstrip() for raw in lines[n:end + 1]]
            out.extend(_code_block(fence, block[1:end - n], block[end - n:]))
            n = end + 1
            continue
        n += 1
        line = _MULTISPACE.sub(" ", line)
        # setext heading: a text line underlined by === or --- becomes an ATX heading
        if _SETEXT.match(line) and out and out[-1].strip() and not _is_structural(out[-1]) \
                and len(line.strip()) >= 3:
            level = "#" if line.strip().startswith("=") else "##"
            out[-1] = f"{level} {out[-1].strip()}"
            continue
        if line.lstrip().startswith("#"):
            line = _ATX_NO_SPACE.sub(r"\1 \2", line.lstrip())
            if re.match(r"^#{1,6} ", line):
                line = _ATX_CLOSING.sub("", line)
        line = _BULLET.sub(r"\1- ", line)
        line = _ORDERED_PAREN.sub(r"\1\2. ", line)
        if _TABLE_ROW.match(line):
            line = _normalize_table_row(line)
        out.append(line)
    # at most one blank line in a row, none at the start or end
    collapsed: list[str] = []
    for line in out:
        if not line and (not collapsed or not collapsed[-1]):
            continue
        collapsed.append(line)
    while collapsed and not collapsed[-1]:
        collapsed.pop()
    result = "\n".join(collapsed) + "\n" if collapsed else ""
    # a BOM that surfaces at the start once leading blank lines are gone would be dropped by a
    # second pass: drop it now, so that normalizing twice changes nothing
    return normalize_text(result) if result.startswith("\ufeff") else result


def _closes(line: str, marker: str) -> bool:
    s = line.strip()
    return len(s) >= len(marker) and s == marker[0] * len(s)


def _fence_end(lines: list[str], start: int, marker: str) -> int:
    """Index of the line closing the fence opened at ``start`` (``len(lines)`` if none)."""
    return next((n for n in range(start + 1, len(lines)) if _closes(lines[n], marker)),
                len(lines))


def _code_block(fence: re.Match[str], content: list[str], closing: list[str]) -> list[str]:
    """A fenced block with its fences written ```lang … ``` (language in lower case); a block
    whose content holds a line that would close a ``` fence keeps its own fence characters.
    ``closing`` is the closing line, or nothing for a block left open to the end."""
    indent, marker, info = fence.group(1), fence.group(2), fence.group(3)
    if not any(_closes(line, "```") for line in content):
        marker = "```"
    lang = _LANG.match(info)
    if lang and (len(info) == lang.end() or info[lang.end()].isspace()):
        info = lang.group(0).lower() + info[lang.end():]
    close = [line[:len(line) - len(line.lstrip())] + marker for line in closing]
    return [f"{indent}{marker}{info}", *content, *close]


def _is_structural(line: str) -> bool:
    s = line.lstrip()
    return s.startswith(("#", "-", "|", "```", ">")) or bool(re.match(r"\d+\.", s))


def _normalize_table_row(line: str) -> str:
    cells = line.strip()[1:-1].split("|")
    return "| " + " | ".join(c.strip() for c in cells) + " |"


def canonical(text: str) -> str:
    """The comparison form: normalized, every whitespace run one space, stripped."""
    return _WS.sub(" ", normalize_text(text)).strip()


@lru_cache(maxsize=4)
def _single_spaced(text: str) -> str:
    # one source is checked against many excerpts in a row: spaced once, not once per excerpt
    return _WS.sub(" ", text)


def excerpt_in_source(excerpt: str, normalized_source: str) -> bool:
    """Is the excerpt found verbatim in the (already normalized) source text?

    The excerpt is compared in :func:`canonical` form, and also with only the character-level
    rules applied (an excerpt may start mid-line, where line-start rules do not apply).
    """
    haystack = _single_spaced(normalized_source)
    light = unicodedata.normalize("NFC", _SPACES.sub(" ", excerpt))
    for candidate in (canonical(excerpt), _WS.sub(" ", light).strip()):
        if candidate and candidate in haystack:
            return True
    return False


def excerpt_span(excerpt: str, normalized_source: str) -> tuple[int, int] | None:
    """Where the excerpt stands in the (already normalized) source: ``(start, end)`` offsets
    of ``normalized_source`` for the first match :func:`excerpt_in_source` would find, or
    ``None``. A reviewer's page highlights the span in place."""
    # the single-spaced haystack, and for each of its characters the source offset it came from
    starts: list[int] = []
    ends: list[int] = []
    chars: list[str] = []
    for m in re.finditer(r"\s+|\S+", normalized_source):
        if m.group().isspace():
            chars.append(" ")
            starts.append(m.start())
            ends.append(m.end())
        else:
            chars.extend(m.group())
            starts.extend(range(m.start(), m.end()))
            ends.extend(range(m.start() + 1, m.end() + 1))
    haystack = "".join(chars)
    light = unicodedata.normalize("NFC", _SPACES.sub(" ", excerpt))
    for candidate in (canonical(excerpt), _WS.sub(" ", light).strip()):
        at = haystack.find(candidate) if candidate else -1
        if at >= 0:
            return starts[at], ends[at + len(candidate) - 1]
    return None
