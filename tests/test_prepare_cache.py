"""prepare fills the unit cache with the curated files it writes (issue 18): the first no-op
prepare after it parses nothing, and a file edited since is read again and judged afresh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evidence_pipeline.authoring.prepare import PrepareError, prepare
from evidence_pipeline.demo import git
from evidence_pipeline.validation.corpus import SourceReader, corpus_files
from evidence_pipeline.validation.unit_cache import CACHE_NAME, UnitCache
from evidence_pipeline.validation.validator import load_units, validate_workspace
from evidence_runtime.curated import read_curated
from evidence_runtime.workspace import load_workspace
from tests.helpers import commit

NOTES = {
    "reparti/ricovero.md": "# Ricovero\n\n## Degenza\n\nIl ricovero ordinario dura almeno una "
                           "notte; il codice REG01 indica il regime ordinario.\n\n## Day "
                           "hospital\n\nIl day hospital (codice REG02) non prevede notti.\n",
    "pazienti.md": "# Paziente\n\nPer fascia pediatrica si intendono i pazienti con età "
                   "inferiore a 18 anni.\n",
}


def _workspace(root: Path) -> Path:
    for rel, text in NOTES.items():
        file = root / "evidence" / "source" / rel
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text, encoding="utf-8")
    (root / "thoth.yaml").write_text("workspace_id: cache\nlanguage: italian\nmodel:\n"
                                     "  backend: structural\n", encoding="utf-8")
    (root / ".gitignore").write_text(".tht/\n", encoding="utf-8")
    git(root, "init", "-q")
    commit(root, "sources")
    return root


def _hits(root: Path) -> UnitCache:
    ws = load_workspace(root)
    cache = UnitCache.in_state_dir(ws.state_dir)
    load_units(ws.evidence_dir, corpus_files(ws.evidence_dir, ws.config.evidence.patterns),
               shown_prefix="evidence/", sources=SourceReader(ws.evidence_dir), check=False,
               cache=cache)
    return cache


def test_prepare_remembers_what_it_wrote_as_a_parse_would_read_it(tmp_path: Path) -> None:
    root = _workspace(tmp_path)
    result = prepare(root)
    curated = [w for w in result.written if w.startswith("evidence/curated/")]
    assert result.status == "applied" and len(curated) >= 3
    state = load_workspace(root).state_dir
    entries = json.loads((state / CACHE_NAME).read_text(encoding="utf-8"))["entries"]
    for shown in curated:
        fresh = read_curated(root / shown, display_path=shown)
        entry = entries[UnitCache.key((root / shown).read_bytes(), shown)]
        assert entry == {"path": shown, "front_text": fresh.front_text, "body": fresh.body,
                         "data": fresh.data()}
    commit(root, "prepared")
    cache = _hits(root)  # what the next prepare reads: every file from the cache
    assert (cache.hits, cache.misses) == (len(curated), 0)
    assert prepare(root).status == "unchanged"
    warm = sorted(str(p) for p in validate_workspace(root).problems)
    (state / CACHE_NAME).unlink()
    assert sorted(str(p) for p in validate_workspace(root).problems) == warm


def test_a_file_edited_after_prepare_is_read_again(tmp_path: Path) -> None:
    root = _workspace(tmp_path)
    result = prepare(root)
    commit(root, "prepared")
    shown = next(w for w in result.written if w.startswith("evidence/curated/"))
    file = root / shown
    file.write_text(file.read_text(encoding="utf-8").replace("---\n", "", 1), encoding="utf-8")
    commit(root, "a broken front matter")
    assert _hits(root).misses == 1
    for _ in range(2):  # refused every time: a broken file is never cached
        with pytest.raises(PrepareError) as refused:
            prepare(root)
        assert any(p.code == "front_matter_missing" and p.path == shown
                   for p in refused.value.problems)
