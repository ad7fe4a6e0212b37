"""Only what a commit holds is validated as the corpus and published (issue 14 item 4).

A symbolic link anywhere under ``evidence/`` is an error naming it, in ``validate`` and in
``preprocess`` (a commit holds the link, never what it points to); a materialized revision
under ``.tht/revisions/<sha>/`` is used only while every file in it is still the committed blob,
and is rebuilt from Git otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from evidence_pipeline.demo import git
from evidence_pipeline.gitrepo import GitError, materialize_revision, stale_paths
from evidence_runtime.index import EdgeIndex
from evidence_runtime.workspace import load_workspace
from tests.helpers import PublishedDemo, cli, commit, copy_workspace, edit

pytestmark = pytest.mark.usefixtures("own_state")

UNIT = "curated/domain/fascia-pediatrica.md"
NOT_REVIEWED = "Frasenonrivista"  # one BM25 token that no committed unit holds


def unsafe_paths(problems: list[dict]) -> list[str]:
    return sorted(p["path"] for p in problems if p["code"] == "unsafe_path")


def validate_json(ws: Path) -> tuple[int, dict]:
    r = cli("evidence", "validate", str(ws), "--json")
    return r.exit_code, json.loads(r.stdout)


# --------------------------------------------------------------------------- links in a commit


def test_a_committed_link_to_content_outside_git_is_refused_by_validate_and_publish(
        demo_ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(demo_ws / "evidence" / "curated", outside / "curated")
    os.symlink(outside / "curated", demo_ws / "evidence" / "curated")
    commit(demo_ws, "curated/ is a link to a directory no commit holds")
    assert git(demo_ws, "ls-tree", "HEAD", "evidence/curated").startswith("120000 blob")

    code, report = validate_json(demo_ws)
    assert code == 1 and report["status"] == "invalid"
    assert unsafe_paths(report["problems"]) == ["evidence/curated"]
    assert report["units"] == 0  # nothing was read through the link
    assert str(outside) in next(p["message"] for p in report["problems"]
                                if p["code"] == "unsafe_path")

    assert cli("workspace", "activate", str(demo_ws)).exit_code == 0
    pre = cli("workspace", "preprocess", "evidence", str(demo_ws), "--json")
    published = json.loads(pre.stdout)
    assert pre.exit_code == 1 and published["activated"] is False
    assert unsafe_paths(published["problems"]) == ["evidence/curated"]
    assert "unsafe_path (evidence/curated)" in pre.stderr


def _curated_subfolder(ws: Path, outside: Path) -> str:
    os.symlink("domain", ws / "evidence/curated/domain-copia")  # a link inside the tree
    return "evidence/curated/domain-copia"


def _curated_file(ws: Path, outside: Path) -> str:
    (outside / "extra.md").write_text((ws / "evidence" / UNIT).read_text(encoding="utf-8")
                                      .replace("evidence:fascia-pediatrica", "evidence:extra"),
                                      encoding="utf-8")
    os.symlink(outside / "extra.md", ws / "evidence/curated/domain/extra.md")
    return "evidence/curated/domain/extra.md"


def _source_file(ws: Path, outside: Path) -> str:
    os.symlink("paziente.md", ws / "evidence/source/10-domini-clinici/paziente-copia.md")
    return "evidence/source/10-domini-clinici/paziente-copia.md"


def _support_file(ws: Path, outside: Path) -> str:
    os.symlink("../thoth.yaml", ws / "evidence/descrittore.yaml")
    return "evidence/descrittore.yaml"


def _evidence_root(ws: Path, outside: Path) -> str:
    shutil.move(ws / "evidence", outside / "evidence")
    os.symlink(outside / "evidence", ws / "evidence")
    return "evidence"


@pytest.mark.parametrize("make", [_curated_subfolder, _curated_file, _source_file,
                                  _support_file, _evidence_root],
                         ids=lambda f: f.__name__.lstrip("_"))
def test_a_link_anywhere_under_evidence_is_an_error_naming_it(
        demo_ws: Path, tmp_path: Path, make: Callable[[Path, Path], str]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    shown = make(demo_ws, outside)
    commit(demo_ws, "a symbolic link under evidence/")
    code, report = validate_json(demo_ws)
    assert code == 1 and report["status"] == "invalid"
    assert unsafe_paths(report["problems"]) == [shown]


# --------------------------------------------------------------------------- materialized trees


@pytest.fixture
def repo(demo_ws: Path) -> Path:
    return demo_ws


def _edit(dest: Path) -> str:
    edit(dest / "evidence" / UNIT, "Sono in **fascia pediatrica**", NOT_REVIEWED)
    return f"evidence/{UNIT}"


def _add(dest: Path) -> str:
    (dest / "evidence/curated/domain/aggiunta.md").write_text("non in Git\n", encoding="utf-8")
    return "evidence/curated/domain/aggiunta.md"


def _remove(dest: Path) -> str:
    (dest / "evidence" / UNIT).unlink()
    return f"evidence/{UNIT}"


def _link(dest: Path) -> str:
    """Same bytes, but through a link to a file that a later edit could change."""
    target = dest.parent / "copy.md"
    shutil.copy(dest / "evidence" / UNIT, target)
    (dest / "evidence" / UNIT).unlink()
    os.symlink(target, dest / "evidence" / UNIT)
    return f"evidence/{UNIT}"


def _directory_link(dest: Path) -> str:
    shutil.move(dest / "evidence/curated/enum", dest.parent / "enum")
    os.symlink(dest.parent / "enum", dest / "evidence/curated/enum")
    return "evidence/curated/enum"


@pytest.mark.parametrize("tamper", [_edit, _add, _remove, _link, _directory_link],
                         ids=lambda f: f.__name__.lstrip("_"))
def test_a_materialized_revision_is_reused_only_while_it_is_the_commit(
        repo: Path, tmp_path: Path, tamper: Callable[[Path], str]) -> None:
    rev = git(repo, "rev-parse", "HEAD").strip()
    dest = materialize_revision(repo, rev, tmp_path / "revisions" / rev)
    assert stale_paths(repo, rev, dest) == []

    changed = tamper(dest)
    assert changed in stale_paths(repo, rev, dest)

    assert materialize_revision(repo, rev, dest) == dest
    assert stale_paths(repo, rev, dest) == []
    assert (dest / "evidence" / UNIT).read_bytes() == (repo / "evidence" / UNIT).read_bytes()
    assert not (dest / "evidence" / UNIT).is_symlink()


def test_a_link_in_place_of_a_materialized_revision_is_never_used(
        repo: Path, tmp_path: Path) -> None:
    rev = git(repo, "rev-parse", "HEAD").strip()
    real = materialize_revision(repo, rev, tmp_path / "elsewhere")
    (tmp_path / "revisions").mkdir()
    os.symlink(real, tmp_path / "revisions" / rev)
    with pytest.raises(GitError, match="not a materialized revision; refusing to replace it"):
        materialize_revision(repo, rev, tmp_path / "revisions" / rev)


def test_files_edited_in_a_materialized_revision_are_not_published(
        published_demo: PublishedDemo, tmp_path: Path) -> None:
    ws = copy_workspace(published_demo.ws, tmp_path / "ws")
    mat = ws / ".tht" / "revisions" / published_demo.revision
    assert mat.is_dir()
    _edit(mat)  # a file added there is refused anyway: unit_not_in_manifest

    pre = cli("workspace", "preprocess", "evidence", str(ws), "--json")
    assert pre.exit_code == 0, pre.stderr
    result = json.loads(pre.stdout)
    assert result["revision"] == published_demo.revision and result["generation"] == 2
    assert result["counts"]["units"] == published_demo.preprocess_json["counts"]["units"]
    assert result["counts"]["fragments_embedded"] == 0  # the commit's fragments: all cached
    assert stale_paths(ws, published_demo.revision, mat) == []

    with EdgeIndex.open(load_workspace(ws).index_path) as index:
        scope = {"workspace_id": "psd", "vector_generation": 2}
        assert index.query(dense=None, text=NOT_REVIEWED, match=scope, limit=5,
                           mode="bm25") == []
