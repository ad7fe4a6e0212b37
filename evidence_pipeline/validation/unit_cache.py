"""A cache of parsed and checked curated files in the state directory (``units-cache.json``).

Parsing a curated file's front matter with round-trip YAML costs 3–40 ms and the credential scan
about 5 ms; a no-op ``prepare`` or an unchanged re-publication used to pay both for every file.
An entry remembers, for one file's exact bytes at one shown path, the front matter text, the
body, the front matter as plain data and (once a check ran) the credential findings.

- The key is the file's Git blob id (``sha1("blob <size>\\0" + bytes)``, what ``git ls-tree``
  prints), computed from the bytes just read: the same key on the work tree and on a
  materialized revision, and a changed file never matches.
- The whole cache is dropped when the validator's fingerprint changes: the source of every
  module whose output is cached (parsing, unit schema, credential rules) and the pipeline version.
- Only files that parsed into a valid unit are stored: a file that is unreadable, malformed or
  fails the schema is always read again, so its refusal is always reported afresh. The checks
  that look beyond the file (sources, the manifest, the whole corpus) are never cached.
- The round-trip front matter (``doc.front``, which authoring edits) is parsed from the cached
  text only when asked for.
- ``prepare`` fills the cache with the files it has just written
  (:meth:`UnitCache.remember_written`), from the documents they were dumped from, so the next run
  does not parse them either; the entry is keyed by the blob id of the bytes written, so a file
  edited since is read again.
- Once a file is checked, the entry also keeps its body's pieces (``fragments.body_pieces``,
  a Markdown parse): a publication cuts fragments without parsing unchanged bodies again.
- The manifest is kept the same way (its plain data, by blob id and path): with thousands of
  sources, parsing it costs as much as a few hundred curated files.
- Writing is best effort (atomic rename); an unreadable or foreign cache file is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from evidence_pipeline.formats.fragments import Piece, body_pieces, known_pieces
from evidence_pipeline.formats.manifest import (
    MANIFEST_NAME,
    PIPELINE_VERSION,
    Manifest,
    decode_manifest,
    manifest_data,
    manifest_from_data,
    read_manifest,
)
from evidence_pipeline.state import ensure_state_dir
from evidence_pipeline.validation.problems import Problem
from evidence_runtime.curated import (
    MAX_CURATED_BYTES,
    CuratedDocument,
    decode_text,
    split_front_matter,
)
from evidence_runtime.errors import EvidenceError, UnitFormatError
from evidence_runtime.yamlio import load_rt, to_plain

CACHE_NAME = "units-cache.json"
CACHE_FORMAT = 1
# modules whose results an entry holds: a change to any of them empties the cache
_FINGERPRINTED = (
    "evidence_pipeline.formats.manifest",
    "evidence_pipeline.markdown",
    "evidence_pipeline.formats.fragments",
    "evidence_runtime.curated",
    "evidence_runtime.units",
    "evidence_runtime.yamlio",
    "evidence_pipeline.validation.credentials",
    "evidence_pipeline.validation.rules",
    "evidence_pipeline.validation.validator",
    "evidence_pipeline.validation.unit_cache",
)


def _plain_copy(value: Any) -> Any:
    """A deep copy of JSON-like data (dicts, lists, scalars): what ``copy.deepcopy`` does for
    it, several times faster."""
    if isinstance(value, dict):
        return {k: _plain_copy(v) for k, v in cast(dict[str, Any], value).items()}
    if isinstance(value, list):
        return [_plain_copy(v) for v in cast(list[Any], value)]
    return value


def blob_id(raw: bytes) -> str:
    """The Git blob id of ``raw`` (SHA-1 object format)."""
    return hashlib.sha1(b"blob %d\0" % len(raw) + raw, usedforsecurity=False).hexdigest()


def validator_fingerprint() -> str:
    """The validator's version: the pipeline version and the source of every cached stage."""
    h = hashlib.sha256(f"{CACHE_FORMAT}:{PIPELINE_VERSION}".encode())
    for name in _FINGERPRINTED:
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if file is None:  # not imported (cannot happen once the validator runs): never reuse
            h.update(os.urandom(16))
            continue
        h.update(Path(file).read_bytes())
    return h.hexdigest()


class CachedDocument(CuratedDocument):
    """A :class:`CuratedDocument` from the cache: plain data at once, ``front`` parsed on use."""

    def __init__(self, *, plain: dict[str, Any], body: str, path: str | None,
                 front_text: str) -> None:
        self._plain = plain
        self._front: Any = None
        self.body = body
        self.path = path
        self.front_text = front_text

    @property  # type: ignore[override]
    def front(self) -> Any:
        if self._front is None:
            self._front = load_rt(cast(str, self.front_text), path=self.path)
        return self._front

    @front.setter
    def front(self, value: Any) -> None:
        self._front = value

    def data(self) -> dict[str, Any]:
        if self._front is not None:  # edited in place: read what it holds now
            return to_plain(self._front)
        return _plain_copy(self._plain)

    @property
    def evidence_id(self) -> str | None:
        value = (self.data() if self._front is not None else self._plain).get("id")
        return value if isinstance(value, str) else None


class UnitCache:
    """Entries by (blob id, shown path); see the module docstring. ``path`` None: no cache."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.fingerprint = validator_fingerprint()
        self._old: dict[str, dict[str, Any]] = {}
        self._used: dict[str, dict[str, Any]] = {}
        # the manifest's entries, apart from the curated files' (same key: blob id + path)
        self._old_manifests: dict[str, dict[str, Any]] = {}
        self._manifests: dict[str, dict[str, Any]] = {}
        self._dirty = False
        self.hits = 0
        self.misses = 0
        if path is not None:
            self._old, self._old_manifests = self._read(path)

    @classmethod
    def in_state_dir(cls, state_dir: Path) -> UnitCache:
        return cls(state_dir / CACHE_NAME)

    def _read(self, path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return {}, {}
        if not isinstance(doc, dict) or cast(dict[str, Any], doc).get("fingerprint") \
                != self.fingerprint:
            return {}, {}
        entries, manifests = (cast(dict[str, Any], doc).get(k) for k in ("entries", "manifests"))
        return (cast(dict[str, dict[str, Any]], entries) if isinstance(entries, dict) else {},
                cast(dict[str, dict[str, Any]], manifests) if isinstance(manifests, dict)
                else {})

    @staticmethod
    def key(raw: bytes, shown: str) -> str:
        return f"{blob_id(raw)} {shown}"

    def document(self, key: str) -> CachedDocument | None:
        """The cached document for ``key``, or None (a miss)."""
        entry = self._used.get(key) or self._old.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._used[key] = entry
        pieces = entry.get("pieces")
        if pieces is not None:
            data = entry["data"]
            known_pieces(entry["body"], str(data.get("title", "")),
                         [Piece(text, field, atomic=atomic, heading=heading, rows=rows)
                          for text, field, atomic, heading, rows in pieces])
        return CachedDocument(plain=_plain_copy(entry["data"]), body=entry["body"],
                              path=entry["path"], front_text=entry["front_text"])

    def credential_problems(self, key: str) -> list[Problem] | None:
        """The credential findings stored with ``key``, or None when never checked."""
        entry = self._used.get(key)
        if entry is None or "credentials" not in entry:
            return None
        found = cast(list[dict[str, Any]], entry["credentials"])
        return [Problem.model_validate(p) for p in found]

    def store(self, key: str, doc: CuratedDocument, *,
              credentials: list[Problem] | None) -> None:
        """Remember a file that parsed into a valid unit (with its findings once checked)."""
        entry = self._used.get(key)
        if entry is None:
            entry = {"path": doc.path, "front_text": doc.front_text, "body": doc.body,
                     "data": doc.data()}
            self._used[key] = entry
            self._dirty = True
        if credentials is not None and "credentials" not in entry:
            entry["credentials"] = [p.model_dump(mode="json") for p in credentials]
            self._dirty = True
        if credentials is not None and "pieces" not in entry:  # a checked file: publishing next
            title = entry["data"].get("title")
            if isinstance(title, str):
                entry["pieces"] = [[p.text, p.field, p.atomic, p.heading, p.rows]
                                   for p in body_pieces(doc.body, title)]
                self._dirty = True

    def remember_written(self, writes: Mapping[str, bytes], docs: Mapping[str, CuratedDocument],
                         *, deleted: Iterable[str] = ()) -> int:
        """After an apply: remember the curated files just written (shown path → bytes) from the
        documents they were dumped from (shown path → document), without parsing them again.

        A file is remembered only when its bytes split into the document's own body and a
        front matter, its data is a valid unit and survives the JSON round trip of the cache
        file; anything else is left to be parsed (and judged) when next read. Older entries
        of the written and deleted paths are dropped, every other one is kept. Returns how
        many files were remembered; call :meth:`save` after.
        """
        touched = {*writes, *deleted}
        for key, entry in self._old.items():
            if entry.get("path") not in touched:
                self._used.setdefault(key, entry)
        for key, entry in self._old_manifests.items():
            if entry.get("path") not in touched:
                self._manifests.setdefault(key, entry)
        remembered = 0
        for shown, raw in writes.items():
            doc = docs.get(shown)
            if doc is None or len(raw) > MAX_CURATED_BYTES:
                continue
            try:
                front_text, body = split_front_matter(decode_text(raw, path=shown), path=shown)
                data = doc.data()
                doc.unit()
                same = json.loads(json.dumps(data, ensure_ascii=False)) == data
            except (UnitFormatError, ValidationError, TypeError, ValueError):
                continue
            if body != doc.body or not same:
                continue
            self._used[self.key(raw, shown)] = {"path": shown, "front_text": front_text,
                                                "body": body, "data": data}
            remembered += 1
        self._dirty = True
        return remembered

    def manifest(self, evidence_dir: Path, *, shown: str) -> Manifest | None:
        """``read_manifest(evidence_dir, shown=shown)``, from the cache when these bytes at this
        path parsed before, else parsed as ``read_manifest`` parses it (the same
        :class:`ManifestError` for bytes that are not a manifest; those are never cached)."""
        file = evidence_dir / MANIFEST_NAME
        try:
            raw = file.read_bytes() if file.is_file() and not file.is_symlink() else None
        except OSError:
            raw = None
        if raw is None:
            return read_manifest(evidence_dir, shown=shown)
        key = self.key(raw, shown)
        entry = self._manifests.get(key) or self._old_manifests.get(key)
        if entry is not None and isinstance(entry.get("manifest"), dict):
            self._manifests[key] = entry
            self.hits += 1
            return manifest_from_data(_plain_copy(entry["manifest"]), path=shown)
        self.misses += 1
        # the parse read_manifest does, keeping the plain data; its errors name the field
        data = manifest_data(decode_manifest(raw, path=shown), path=shown)
        manifest = manifest_from_data(data, path=shown)
        self._manifests[key] = {"path": shown, "manifest": data}
        self._dirty = True
        return manifest

    def save(self) -> None:
        """Write the entries used in this run (and older ones, up to as many again); best
        effort: a cache that cannot be written only costs the next run its speed."""
        if self.path is None or not self._dirty:
            return
        keep = dict(self._used)
        for key, entry in self._old.items():
            if len(keep) >= 2 * len(self._used) + 100:
                break
            keep.setdefault(key, entry)
        tmp = self.path.with_name(f".{CACHE_NAME}.{os.getpid()}.tmp")
        try:
            ensure_state_dir(self.path.parent)
            manifests = self._manifests or dict(list(self._old_manifests.items())[:4])
            tmp.write_text(json.dumps({"fingerprint": self.fingerprint, "entries": keep,
                                       "manifests": manifests}, ensure_ascii=False),
                           encoding="utf-8")
            os.replace(tmp, self.path)
        except (OSError, EvidenceError):  # state_dir_unwritable
            tmp.unlink(missing_ok=True)
            return
        self._dirty = False
