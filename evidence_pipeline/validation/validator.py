"""The deterministic validator (spec §5.4): read a corpus, apply every rule, report.

The same functions check prepare's staged output, the work tree (``tht evidence validate``) and a
materialized revision before publishing.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from pydantic import ValidationError

from evidence_pipeline.formats.curated_writer import dump_rt
from evidence_pipeline.formats.evalset import EVALUATION_NAME
from evidence_pipeline.formats.fragments import ATOMIC_TOO_LARGE, atomic_problems
from evidence_pipeline.formats.manifest import (
    MANIFEST_NAME,
    ManifestError,
    read_manifest,
)
from evidence_pipeline.gitrepo import GitError, ignored_paths
from evidence_pipeline.validation.corpus import (
    LoadedUnit,
    SourceReader,
    corpus_files,
    symlinks_under,
)
from evidence_pipeline.validation.evaluation import evaluation_problems
from evidence_pipeline.validation.problems import Problem, Severity, ValidationReport
from evidence_pipeline.validation.rules import (
    check_corpus,
    check_unit,
    credential_problems,
    schema_problems,
)
from evidence_pipeline.validation.unit_cache import UnitCache
from evidence_runtime.curated import (
    MAX_CURATED_BYTES,
    CuratedDocument,
    decode_text,
    parse_curated,
    read_curated,
)
from evidence_runtime.errors import UnitFormatError
from evidence_runtime.workspace import Workspace, load_workspace

_UNSAFE_NAME_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def load_units(evidence_dir: Path, rel_paths: Iterable[str], *, shown_prefix: str,
               sources: SourceReader, skip_source: frozenset[str] = frozenset(),
               check: bool = True, cache: UnitCache | None = None,
               progress: Callable[[int, int], None] | None = None,
               ) -> tuple[list[LoadedUnit], list[Problem]]:
    """Read, parse and (unless ``check`` is false) check each curated file (``rel_paths`` from
    :func:`corpus_files`, which leaves out symbolic links); with ``cache``, a file whose bytes
    parsed into a valid unit before is not parsed nor scanned for credentials again.
    ``progress`` hears ``(files done, files)`` before each file and at the end."""
    loaded: list[LoadedUnit] = []
    problems: list[Problem] = []
    rel_paths = list(rel_paths)
    for rel in rel_paths:
        if progress is not None:
            progress(len(loaded), len(rel_paths))
        shown = f"{shown_prefix}{rel}"
        file = evidence_dir / rel
        bad = [ch for ch in rel if unicodedata.category(ch) in _UNSAFE_NAME_CATEGORIES]
        if bad:
            problems.append(Problem("unsafe_path", Severity.error, ascii(shown), None,
                                    f"the file name contains a control character "
                                    f"(U+{ord(bad[0]):04X})"))
            loaded.append(LoadedUnit(rel, None, None))
            continue
        key: str | None = None
        try:
            key, doc = _cached(cache, file, shown)
            doc = doc or read_curated(file, display_path=shown)
        except UnitFormatError as exc:
            problems.append(Problem(exc.code, Severity.error, shown, None, exc.message))
            loaded.append(LoadedUnit(rel, None, None))
            continue
        eid = doc.evidence_id
        creds: list[Problem] | None = None
        if check:
            creds = cache.credential_problems(key) if cache and key else None
            if creds is None:
                creds = credential_problems(doc.data(), doc.body, path=shown, evidence_id=eid,
                                            front_text=doc.front_text or dump_rt(doc.front))
            problems.extend(creds)
        try:
            unit = doc.unit()
        except ValidationError as exc:
            problems.extend(schema_problems(exc, path=shown, evidence_id=eid))
            loaded.append(LoadedUnit(rel, doc, None))
            continue
        if cache and key:
            cache.store(key, doc, credentials=creds)
        if check:
            problems.extend(check_unit(unit, rel_path=rel, sources=sources, shown_path=shown,
                                       body=doc.body,
                                       skip_source=unit.id in skip_source))
        loaded.append(LoadedUnit(rel, doc, unit))
    if progress is not None:
        progress(len(loaded), len(rel_paths))
    if cache:
        cache.save()
    return loaded, problems


def _cached(cache: UnitCache | None, file: Path, shown: str
            ) -> tuple[str | None, CuratedDocument | None]:
    """The cache key of ``file``'s bytes and, when known, the document they parse into; the
    document is parsed here from the same bytes (so the key always matches what was read), and
    bytes that are not a curated file raise the :class:`UnitFormatError` ``read_curated`` would
    raise for them (a hostile file is parsed once, not twice). (None, None) without a cache, or
    when the file cannot be read or is too large: ``read_curated`` then reads it and reports
    why."""
    if cache is None:
        return None, None
    try:
        raw = file.read_bytes()
    except OSError:
        return None, None
    if len(raw) > MAX_CURATED_BYTES:
        return None, None
    key = cache.key(raw, shown)
    doc = cache.document(key)
    if doc is not None:
        return key, doc
    return key, parse_curated(decode_text(raw, path=shown), path=shown)



def validate_evidence_dir(evidence_dir: Path, *, patterns: Sequence[str],
                          shown_prefix: str = "evidence/",
                          max_chunk_chars: int | None = None,
                          cache: UnitCache | None = None,
                          progress: Callable[[int, int], None] | None = None,
                          ) -> tuple[ValidationReport, list[LoadedUnit]]:
    """Validate a whole evidence directory (work tree or materialized revision).

    With ``max_chunk_chars``, a unit holding an atomic element that cannot fit one fragment is
    reported here (``atomic_content_too_large``), before any publish finds it; a workspace's
    corpus is validated with its own limit by :func:`validate_corpus`.
    """
    sources = SourceReader(evidence_dir)
    problems: list[Problem] = []
    try:
        shown = f"{shown_prefix}{MANIFEST_NAME}"
        manifest = (cache.manifest(evidence_dir, shown=shown) if cache
                    else read_manifest(evidence_dir, shown=shown))
    except ManifestError as exc:
        problems.append(Problem(exc.code, Severity.error, exc.path, None, exc.message, exc.field))
        manifest = None
    problems.extend(symlink_problems(evidence_dir, shown_prefix=shown_prefix))
    rel_paths = corpus_files(evidence_dir, patterns)
    skip = frozenset([*manifest.orphans, *manifest.retirement_candidates]) if manifest \
        else frozenset()
    loaded, unit_problems = load_units(evidence_dir, rel_paths, shown_prefix=shown_prefix,
                                       sources=sources, skip_source=skip, cache=cache,
                                       progress=progress)
    problems.extend(unit_problems)
    if max_chunk_chars is not None:
        problems.extend(oversized_problems(loaded, max_chunk_chars, shown_prefix=shown_prefix))
    if manifest is not None or not problems:
        problems.extend(check_corpus(loaded, manifest, shown_prefix=shown_prefix,
                                     sources=sources))
    return ValidationReport(units=len(rel_paths), problems=problems), loaded


def symlink_problems(evidence_dir: Path, *, shown_prefix: str) -> list[Problem]:
    """``unsafe_path`` for every symbolic link under the evidence directory, itself included:
    a commit holds the link, never what it points to, so nothing reached through one is read
    (spec §7.2: only what a reviewed revision holds is published)."""
    out: list[Problem] = []
    for rel in symlinks_under(evidence_dir):
        shown = shown_prefix.rstrip("/") if rel == "." else f"{shown_prefix}{rel}"
        link = evidence_dir if rel == "." else evidence_dir / rel
        out.append(Problem("unsafe_path", Severity.error, _printable(shown), None,
                           f"a symbolic link (to {os.readlink(link)!r}) is not allowed under "
                           f"{shown_prefix}: publication reads only what a commit holds; commit "
                           "the files themselves"))
    return out


def _printable(shown: str) -> str:
    """``shown``, or its ``ascii()`` form when it holds a control character."""
    unsafe = any(unicodedata.category(ch) in _UNSAFE_NAME_CATEGORIES for ch in shown)
    return ascii(shown) if unsafe else shown


def atomic_problem(path: str, evidence_id: str, field: str, message: str) -> Problem:
    """The finding of an atomic element too large for one fragment (spec §9.8): a review item,
    the same wherever it is found (validate, prepare's output, a publish that cut fragments)."""
    return Problem(ATOMIC_TOO_LARGE, Severity.review, path, evidence_id, message, field)


def oversized_problems(loaded: Iterable[LoadedUnit], max_chunk_chars: int, *,
                       shown_prefix: str) -> list[Problem]:
    """``atomic_content_too_large`` for each unit with an element too large for one fragment
    that does not already carry that review item (prepare writes it into the unit)."""
    out: list[Problem] = []
    for item in loaded:
        unit, doc = item.unit, item.doc
        if unit is None or doc is None or any(r.code == ATOMIC_TOO_LARGE
                                              for r in unit.review_items):
            continue
        out.extend(atomic_problem(f"{shown_prefix}{item.rel_path}", unit.id, field, message)
                   for field, message in atomic_problems(unit, doc.body, max_chunk_chars))
    return out


def validate_corpus(ws: Workspace, evidence_dir: Path | None = None, *,
                    progress: Callable[[int, int], None] | None = None,
                    ) -> tuple[ValidationReport, list[LoadedUnit]]:
    """The corpus of ``ws`` checked as publishing checks it: every rule, and fragments within
    the workspace's ``max_chunk_chars``. ``evidence_dir`` is the work tree's by default, where
    more is reported before anything is committed or published: a file Git ignores (no commit
    will hold it) and every problem of the evaluation set the gate will run (a curator fixes it
    before merging); or a materialized revision's, where the gate itself judges the set and
    explains each miss."""
    shown_prefix = f"{ws.config.evidence.root}/"
    report, loaded = validate_evidence_dir(evidence_dir or ws.evidence_dir,
                                           patterns=ws.config.evidence.patterns,
                                           shown_prefix=shown_prefix,
                                           max_chunk_chars=ws.config.embeddings.max_chunk_chars,
                                           cache=UnitCache.in_state_dir(ws.state_dir),
                                           progress=progress)
    more: list[Problem] = []
    if evidence_dir is None:
        more.extend(evaluation_problems(ws.evidence_dir, loaded, shown_prefix=shown_prefix))
        more.extend(ignored_problems(ws, [item.rel_path for item in loaded]))
    if more:
        report = ValidationReport(units=report.units, problems=[*report.problems, *more])
    return report, loaded


def ignored_problems(ws: Workspace, curated: Iterable[str]) -> list[Problem]:
    """``ignored_by_git`` for each curated file, source, manifest or evaluation set of the work
    tree that Git ignores: it validates here, but no commit holds it, so publication (which
    reads the commit) would not find it. Nothing when the workspace is not a Git work tree."""
    prefix = f"{ws.config.evidence.root}/"
    try:
        ignored = ignored_paths(ws.root, [prefix])
    except GitError:
        return []
    read = {*curated, MANIFEST_NAME, EVALUATION_NAME}
    out = []
    for path in ignored:
        rel = path.removeprefix(prefix)
        if rel in read or (rel.startswith("source/")
                           and not any(part.startswith(".") for part in rel.split("/"))):
            out.append(Problem("ignored_by_git", Severity.error, _printable(path), None,
                               "Git ignores this file: no commit will hold it, so the published "
                               "revision will not have it; change .gitignore or move the file"))
    return out


def validate_workspace(root: Path) -> ValidationReport:
    """``tht evidence validate``: the work tree of a workspace."""
    report, _ = validate_corpus(load_workspace(root))
    return report
