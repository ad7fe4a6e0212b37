"""Reading a curated corpus: its files, its sources (hash and normalized text) and its units.

No rule lives here (see ``rules``); ``validator`` puts reading and rules together.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from evidence_pipeline.formats.normalize import normalize_text
from evidence_runtime.curated import (
    CuratedDocument,
    decode_text,
)
from evidence_runtime.errors import UnitFormatError
from evidence_runtime.units import (
    UnitBase,
)


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------


class SourceReader:
    """Reads sources under an evidence directory once: hash and normalized text, or why not."""

    def __init__(self, evidence_dir: Path) -> None:
        self.evidence_dir = evidence_dir
        self._cache: dict[str, tuple[str, str] | str] = {}

    def get(self, rel: str) -> tuple[str, str] | str:
        """(sha256, normalized text) of ``rel`` (relative to evidence/), or an error message."""
        if rel not in self._cache:
            self._cache[rel] = self._load(rel)
        return self._cache[rel]

    def _load(self, rel: str) -> tuple[str, str] | str:
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts or not rel.startswith("source/"):
            return "source path must stay under source/"
        file = self.evidence_dir / rel
        try:
            resolved = file.resolve()
        except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
            return "source cannot be resolved"
        if resolved != self.evidence_dir.resolve() / pure:
            return "source is reached through a symbolic link (a commit holds only the link)"
        if not file.is_file():
            return "source file does not exist"
        raw = file.read_bytes()
        try:
            text = decode_text(raw, path=rel)
        except UnitFormatError as exc:
            return f"source is not readable text: {exc.message}"
        return sha256_bytes(raw), normalize_text(text)




@dataclass
class LoadedUnit:
    rel_path: str  # relative to evidence/
    doc: CuratedDocument | None
    unit: UnitBase | None


def symlinks_under(evidence_dir: Path) -> list[str]:
    """Every symbolic link under ``evidence_dir`` (files and directories; links are never
    followed), relative to it and sorted; ``["."]`` when ``evidence_dir`` itself is one.

    A commit holds a link, not what it points to: content reached through one was never
    reviewed, so none of it may enter the corpus (spec §7.2).
    """
    if evidence_dir.is_symlink():
        return ["."]
    found: list[str] = []
    for top, dirs, files in os.walk(evidence_dir, followlinks=False):
        for name in [*dirs, *files]:
            path = Path(top, name)
            if path.is_symlink():
                found.append(path.relative_to(evidence_dir).as_posix())
    return sorted(found)


def corpus_files(evidence_dir: Path, patterns: Sequence[str]) -> list[str]:
    """Curated files matching the descriptor's patterns, relative to evidence/, sorted; never
    a symbolic link nor a file reached through one (see :func:`symlinks_under`)."""
    links = set(symlinks_under(evidence_dir))
    if "." in links:
        return []
    found: set[str] = set()
    for pattern in patterns:
        for file in evidence_dir.glob(pattern):
            parts = file.relative_to(evidence_dir).parts
            if file.is_file() and not any("/".join(parts[:n]) in links
                                          for n in range(1, len(parts) + 1)):
                found.add("/".join(parts))
    return sorted(found)


