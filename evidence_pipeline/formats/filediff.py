"""One file's change as a Git-style unified diff: what ``git apply`` reads and reviewers read."""

from __future__ import annotations

import difflib

from evidence_runtime.curated import decode_text
from evidence_runtime.errors import EvidenceError


def _lines(raw: bytes | None) -> list[str]:
    if raw is None:
        return []
    try:
        return decode_text(raw).splitlines(keepends=True)
    except EvidenceError:
        return ["(not UTF-8 text)\n"]


def unified_diff(path: str, old: bytes | None, new: bytes | None) -> str:
    """A Git-style unified diff of the file at ``path`` (``/dev/null`` for a side that does
    not exist; a last line without its newline marked as Git marks it)."""
    lines = difflib.unified_diff(_lines(old), _lines(new),
                                 fromfile=f"a/{path}" if old is not None else "/dev/null",
                                 tofile=f"b/{path}" if new is not None else "/dev/null")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)
