"""The cache of parsed and checked curated files (``.tht/units-cache.json``, issue 18): a warm
run reads the same report as a cold one, and a changed or broken file is always read again."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from evidence_pipeline.demo import create_demo_repo
from evidence_pipeline.publishing.evaluate import revision_evidence_dir, unit_kinds
from evidence_pipeline.validation import validator
from evidence_pipeline.validation.corpus import SourceReader, corpus_files
from evidence_pipeline.validation.unit_cache import CACHE_NAME, UnitCache, blob_id
from evidence_pipeline.validation.validator import load_units, validate_corpus, validate_workspace
from evidence_runtime.workspace import load_workspace
from tests.helpers import PublishedDemo, copy_workspace

CURATED = "evidence/curated/enum/regime-sdo.md"


@pytest.fixture
def demo_ws(tmp_path: Path) -> Path:
    """The demo workspace without a cache: these tests start cold (conftest's starts warm)."""
    return create_demo_repo(tmp_path / "ws")


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The shown path of every curated file the validator parses (or reads and parses)."""
    seen: list[str] = []

    def counted(real: Callable[..., Any]) -> Callable[..., Any]:
        def parse(*args: Any, **kwargs: Any) -> Any:
            seen.append(str(kwargs.get("path") or kwargs.get("display_path") or args[0]))
            return real(*args, **kwargs)
        return parse

    monkeypatch.setattr(validator, "parse_curated", counted(validator.parse_curated))
    monkeypatch.setattr(validator, "read_curated", counted(validator.read_curated))
    return seen


def _report(ws: Path) -> list[str]:
    return sorted(str(p) for p in validate_workspace(ws).problems)


def test_blob_id_is_gits() -> None:
    assert blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_warm_run_reads_the_cache_and_reports_the_same(demo_ws: Path) -> None:
    cold = _report(demo_ws)
    cache_file = demo_ws / ".tht" / CACHE_NAME
    entries = json.loads(cache_file.read_text(encoding="utf-8"))["entries"]
    assert len(entries) == validate_workspace(demo_ws).units
    ws = load_workspace(demo_ws)
    cache = UnitCache.in_state_dir(ws.state_dir)
    report, loaded = validate_corpus(ws)
    assert sorted(str(p) for p in report.problems) == cold
    assert all(item.unit is not None for item in loaded)
    warm = UnitCache.in_state_dir(ws.state_dir)
    assert warm.path == cache.path
    # every file is a hit on a warm run: none is parsed again
    rels = corpus_files(ws.evidence_dir, ws.config.evidence.patterns)
    load_units(ws.evidence_dir, rels, shown_prefix="evidence/",
               sources=SourceReader(ws.evidence_dir), cache=warm)
    assert warm.hits == len(rels) and warm.misses == 0


def test_a_changed_file_is_read_again(demo_ws: Path) -> None:
    assert validate_workspace(demo_ws).status.value == "publishable"
    file = demo_ws / CURATED
    text = file.read_text(encoding="utf-8")
    # a credential in the body: the warm cache must not hide it
    file.write_text(text + "\nAuthorization: Bearer abcdefghijklmnopqrstuvwxyz012345\n",
                    encoding="utf-8")
    codes = {p.code for p in validate_workspace(demo_ws).problems}
    assert any("credential" in c for c in codes), codes
    # a broken front matter: refused every time, never cached
    file.write_text(text.replace("---\n", "", 1), encoding="utf-8")
    for _ in range(2):
        problems = validate_workspace(demo_ws).problems
        assert any(p.code == "front_matter_missing" and p.path == CURATED for p in problems)
    file.write_text(text, encoding="utf-8")
    assert validate_workspace(demo_ws).status.value == "publishable"


def test_a_cached_credential_finding_is_reported_again(demo_ws: Path) -> None:
    file = demo_ws / CURATED
    file.write_text(file.read_text(encoding="utf-8")
                    + "\nAuthorization: Bearer abcdefghijklmnopqrstuvwxyz012345\n",
                    encoding="utf-8")
    first = _report(demo_ws)
    assert any("credential" in p for p in first)
    assert _report(demo_ws) == first


def test_a_corrupt_cache_is_ignored(demo_ws: Path) -> None:
    cold = _report(demo_ws)
    (demo_ws / ".tht" / CACHE_NAME).write_text("{not json", encoding="utf-8")
    assert _report(demo_ws) == cold


def test_evaluation_takes_the_kinds_of_a_published_revision_from_the_cache(
        published_demo: PublishedDemo, tmp_path: Path, parsed: list[str]) -> None:
    """Evaluating a generation reads the kind of every unit of its revision: from the entries
    its publication's validation left in the cache, without parsing one curated file again."""
    ws = load_workspace(copy_workspace(published_demo.ws, tmp_path / "ws"))
    evidence_dir = revision_evidence_dir(ws, published_demo.revision)
    kinds = unit_kinds(ws, evidence_dir)
    assert len(kinds) == validate_workspace(ws.root).units == 80
    assert set(kinds.values()) >= {"glossary", "enum", "mapping", "formula"}
    assert parsed == []
    # a file the cache does not know is parsed, and its kind is read from it
    (ws.state_dir / CACHE_NAME).unlink()
    assert unit_kinds(ws, evidence_dir) == kinds
    assert len(parsed) == 80


def test_a_malformed_file_is_parsed_once_per_validation(demo_ws: Path, parsed: list[str]) -> None:
    """The cache's read of a file that is not a curated file already says why: validate reports
    it without parsing the same bytes a second time (a hostile front matter costs seconds)."""
    file = demo_ws / CURATED
    file.write_text("---\ntitle: [a, b\n---\n\nTesto.\n", encoding="utf-8")
    problems = validate_workspace(demo_ws).problems
    assert [p.code for p in problems if p.path == CURATED] == ["front_matter_malformed"]
    assert parsed.count(CURATED) == 1
