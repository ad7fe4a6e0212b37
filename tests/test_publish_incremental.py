"""What an unchanged re-publication reuses (issue 18), and that it never hides a change: the
manifest and each checked body's Markdown pieces are kept in the unit cache by blob id + path;
a changed manifest or body is read again."""

from __future__ import annotations

import json
from pathlib import Path

from evidence_pipeline.formats.fragments import body_pieces
from evidence_pipeline.validation.unit_cache import CACHE_NAME
from evidence_pipeline.validation.validator import validate_workspace
from evidence_runtime.workspace import load_workspace

MANIFEST = "evidence/manifest.yaml"


def _entries(ws: Path, part: str = "entries") -> dict[str, dict]:  # type: ignore[type-arg]
    path = load_workspace(ws).state_dir / CACHE_NAME
    return json.loads(path.read_text(encoding="utf-8"))[part]


def _report(ws: Path) -> list[str]:
    return sorted(str(p) for p in validate_workspace(ws).problems)


def test_the_cache_keeps_the_manifest_and_each_checked_bodys_pieces(demo_ws: Path) -> None:
    cold = _report(demo_ws)
    entries = _entries(demo_ws)
    manifests = list(_entries(demo_ws, "manifests").values())
    assert [m["path"] for m in manifests] == [MANIFEST] and "sources" in manifests[0]["manifest"]
    units = list(entries.values())
    assert units and all("pieces" in e for e in units)
    for e in units:  # what body_pieces gives for the same body and title
        fresh = body_pieces(e["body"], e["data"]["title"])
        assert e["pieces"] == [[p.text, p.field, p.atomic, p.heading, p.rows] for p in fresh]
    assert _report(demo_ws) == cold  # the warm run reports the same


def test_a_changed_manifest_is_read_again(demo_ws: Path) -> None:
    cold = _report(demo_ws)
    file = demo_ws / MANIFEST
    text = file.read_text(encoding="utf-8")
    file.write_text(text + "unexpected_key: 1\n", encoding="utf-8")
    for _ in range(2):  # refused every time: a manifest that does not parse is never cached
        problems = validate_workspace(demo_ws).problems
        assert any(p.path == MANIFEST and p.severity.value == "error" for p in problems), \
            problems
    file.write_text(text, encoding="utf-8")
    assert _report(demo_ws) == cold


def test_an_edited_body_is_cut_from_its_new_text(demo_ws: Path) -> None:
    _report(demo_ws)
    entries = _entries(demo_ws)
    shown, entry = next((e["path"], e) for e in entries.values())
    file = demo_ws / shown
    file.write_text(file.read_text(encoding="utf-8") + "\n## Nuova sezione\n\nTesto nuovo.\n",
                    encoding="utf-8")
    _report(demo_ws)
    fresh = [e for e in _entries(demo_ws).values() if e.get("path") == shown]
    assert any("Testo nuovo." in " ".join(p[0] for p in e.get("pieces", [])) for e in fresh)
    assert entry["pieces"] != next(e["pieces"] for e in fresh if "Testo nuovo." in e["body"])
