"""Source intake (spec §5.1): allowed files, size, strict UTF-8, safe paths, hashes, changes.

Every refusal is a typed error naming the file; nothing here writes.
"""

from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath

from evidence_pipeline.formats.manifest import Manifest
from evidence_pipeline.formats.normalize import drop_embedded_data, normalize_text
from evidence_pipeline.validation.corpus import sha256_bytes
from evidence_runtime.curated import decode_text
from evidence_runtime.errors import ErrorCode, EvidenceError, UnitFormatError

ALLOWED_SUFFIXES = (".sql.md", ".md", ".txt")
# Guards against hostile size only, set where no real note reaches: the file, with its images
# embedded as base64 (a wiki or notebook export), and the text left once they are dropped (some
# 500 pages). Lines have no limit of their own: base64, minified JSON and one-line SQL are what
# real notes hold.
MAX_SOURCE_BYTES = 8 * 1024 * 1024
MAX_TEXT_CHARS = 1_000_000


class SourceError(EvidenceError):
    """A source file cannot be taken in (encoding, size, path, type)."""

    code = ErrorCode.source_invalid


class Change(StrEnum):
    unchanged = "unchanged"
    changed = "changed"
    new = "new"
    removed = "removed"
    renamed = "renamed"
    restored = "restored"  # back at its path, unchanged, while its units are orphans


@dataclass(frozen=True)
class Source:
    """One source note taken in: path relative to evidence/, hash, normalized text, and info
    lines about what the deterministic extraction left out (never an error)."""

    path: str
    sha256: str
    text: str
    normalized: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourceChange:
    path: str
    change: Change
    source: Source | None  # None for removed sources
    renamed_from: str | None = None


def check_rel_path(rel: str) -> None:
    """Refuse unsafe names: absolute, ``..``, backslashes, control or format characters."""
    pure = PurePosixPath(rel)
    if pure.is_absolute() or rel.startswith("/"):
        raise SourceError("absolute paths are not allowed", path=rel, code="unsafe_path")
    if ".." in pure.parts:
        raise SourceError("'..' is not allowed in a source path", path=rel, code="unsafe_path")
    if "\\" in rel:
        raise SourceError("backslashes are not allowed in a source path", path=rel,
                          code="unsafe_path")
    for ch in rel:
        if unicodedata.category(ch) in {"Cc", "Cf", "Zl", "Zp"}:
            raise SourceError(f"the file name contains a control character (U+{ord(ch):04X})",
                              path=repr(rel), code="unsafe_path")


def _unsafe_name(rel: str) -> SourceError | None:
    try:
        check_rel_path(rel)
    except SourceError as exc:
        return exc
    return None


def _allowed(name: str) -> bool:
    return name.endswith(ALLOWED_SUFFIXES)


def read_source(evidence_dir: Path, rel: str) -> Source:
    """Take in one source file (strict checks) and normalize it mechanically."""
    check_rel_path(rel)
    file = evidence_dir / rel
    base = (evidence_dir / "source").resolve()
    try:
        resolved = file.resolve()
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
        raise SourceError("the path cannot be resolved (symlink loop?)", path=rel,
                          code="unsafe_path") from None
    if file.is_symlink() and not resolved.is_relative_to(base):
        raise SourceError("symlink leaves the source/ tree", path=rel, code="unsafe_path")
    if not resolved.is_relative_to(base):
        raise SourceError("path leaves the source/ tree", path=rel, code="unsafe_path")
    if not file.is_file():
        raise SourceError("not a regular file", path=rel, code="unsafe_path")
    size = file.stat().st_size
    if size > MAX_SOURCE_BYTES:
        raise SourceError(f"file is {size} bytes, larger than the {MAX_SOURCE_BYTES} byte limit",
                          path=rel, code="source_too_large")
    return take_in(file.read_bytes(), rel)


def take_in(raw: bytes, rel: str) -> Source:
    """The intake rules for the bytes of a source at ``rel``: size, strict UTF-8, hash,
    extraction and normalization; :class:`SourceError` naming ``rel`` when refused."""
    if len(raw) > MAX_SOURCE_BYTES:
        raise SourceError(f"file is {len(raw)} bytes, larger than the {MAX_SOURCE_BYTES} byte "
                          "limit", path=rel, code="source_too_large")
    try:
        text = decode_text(raw, path=rel)
    except UnitFormatError as exc:
        raise SourceError(exc.message, path=rel, code="source_encoding_invalid") from None
    kept, dropped = drop_embedded_data(text)
    if len(kept) > MAX_TEXT_CHARS:
        raise SourceError(f"the note has {len(kept)} characters besides embedded images, more "
                          f"than the {MAX_TEXT_CHARS} character limit", path=rel,
                          code="source_too_large")
    notes = (f"{dropped} embedded data: image(s) or link(s) dropped: never sent to the model, "
             "never in a unit",) if dropped else ()
    return Source(path=rel, sha256=sha256_bytes(raw), text=text, normalized=normalize_text(text),
                  notes=notes)


def list_sources(evidence_dir: Path, hidden: list[str] | None = None,
                 ) -> tuple[list[str], list[SourceError]]:
    """Relative paths of the candidate sources, and errors for entries that must be refused.

    Hidden files and directories (``.x.md``, ``..md``, ``.drafts/``) are skipped, each one
    added to ``hidden`` when given (a directory with a trailing ``/``) so the caller can say
    so; files with another extension are refused (the spec accepts Markdown, UTF-8 text and
    ``.sql.md`` only).
    """
    root = evidence_dir / "source"
    found: list[str] = []
    errors: list[SourceError] = []
    if not root.is_dir():
        return found, errors
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        if hidden is not None:
            hidden.extend(f"{(here / d).relative_to(evidence_dir).as_posix()}/"
                          for d in sorted(dirnames) if d.startswith("."))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for d in list(dirnames):
            if (here / d).is_symlink():
                rel = (here / d).relative_to(evidence_dir).as_posix()
                errors.append(_unsafe_name(rel) or SourceError(
                    "symlinked directories are not followed", path=rel, code="unsafe_path"))
                dirnames.remove(d)
        for name in sorted(filenames):
            if name.startswith("."):
                if hidden is not None:
                    hidden.append((here / name).relative_to(evidence_dir).as_posix())
                continue
            rel = (here / name).relative_to(evidence_dir).as_posix()
            unsafe = _unsafe_name(rel)
            if unsafe is not None:  # said first: the raw name must not reach a terminal
                errors.append(unsafe)
                continue
            if not _allowed(name):
                errors.append(SourceError("only .md, .txt and .sql.md sources are accepted",
                                          path=rel, code="source_type_not_allowed"))
                continue
            found.append(rel)
    return sorted(found), errors


def intake(evidence_dir: Path, hidden: list[str] | None = None,
           ) -> tuple[dict[str, Source], list[SourceError]]:
    """Read every acceptable source; the errors list every refusal, ``hidden`` (when given)
    every hidden entry skipped (nothing is skipped silently)."""
    paths, errors = list_sources(evidence_dir, hidden)
    sources: dict[str, Source] = {}
    for rel in paths:
        try:
            sources[rel] = read_source(evidence_dir, rel)
        except SourceError as exc:
            errors.append(exc)
    return sources, errors


def compare(sources: dict[str, Source], manifest: Manifest,
            *, everything: bool = False) -> list[SourceChange]:
    """Classify each source against the manifest; a rename is a new source whose hash matches
    exactly one removed source (and no other new source)."""
    known = manifest.sources
    removed = sorted(p for p in known if p not in sources)
    new = sorted(p for p in sources if p not in known)
    changes: dict[str, SourceChange] = {}
    by_hash_removed: dict[str, list[str]] = {}
    for p in removed:
        by_hash_removed.setdefault(known[p].sha256, []).append(p)
    by_hash_new: dict[str, list[str]] = {}
    for p in new:
        by_hash_new.setdefault(sources[p].sha256, []).append(p)
    renamed_old: set[str] = set()
    for p in new:
        sha = sources[p].sha256
        olds = by_hash_removed.get(sha, [])
        if len(olds) == 1 and len(by_hash_new[sha]) == 1:
            changes[p] = SourceChange(p, Change.renamed, sources[p], renamed_from=olds[0])
            renamed_old.add(olds[0])
        else:
            changes[p] = SourceChange(p, Change.new, sources[p])
    for p, src in sources.items():
        if p in known:
            same = known[p].sha256 == src.sha256 and not everything
            changes[p] = SourceChange(p, Change.unchanged if same else Change.changed, src)
    for p in removed:
        if p not in renamed_old:
            changes[p] = SourceChange(p, Change.removed, None)
    return [changes[p] for p in sorted(changes)]
