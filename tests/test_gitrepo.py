"""Git helpers against real repositories built in tmp_path."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from evidence_pipeline.gitrepo import (
    MARKER_NAME,
    GitError,
    changed_files,
    dirty_paths,
    materialize_revision,
    open_repo,
    require_clean,
    resolve_revision,
)
from tests.helpers import commit


def git(root: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Curator",
        "GIT_AUTHOR_EMAIL": "curator@example.org",
        "GIT_COMMITTER_NAME": "Curator",
        "GIT_COMMITTER_EMAIL": "curator@example.org",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    done = subprocess.run(
        ["git", *args], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A workspace repository with two commits; returns its root."""
    root = tmp_path / "ws"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    write(root, "thoth.yaml", "workspace_id: psd\n")
    write(root, ".gitignore", ".tht/\n")
    write(root, "evidence/source/paziente.md", "# Paziente\nv1\n")
    write(root, "evidence/curated/concept/fascia.md", "---\nid: evidence:fascia\n---\nv1\n")
    commit(root, "first")
    write(root, "evidence/curated/concept/fascia.md", "---\nid: evidence:fascia\n---\nv2\n")
    write(root, "evidence/curated/rule/eta.md", "---\nid: evidence:eta\n---\nnew\n")
    commit(root, "second")
    return root


def test_open_repo_refuses_non_repositories(tmp_path: Path, repo: Path) -> None:
    with open_repo(repo) as r:
        assert Path(r.working_tree_dir) == repo  # type: ignore[arg-type]
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(GitError, match="not a Git work tree") as exc:
        open_repo(plain)
    assert exc.value.path == str(plain) and exc.value.code == "git_error"
    with pytest.raises(GitError, match="does not exist"):
        open_repo(tmp_path / "missing")
    with pytest.raises(GitError, match="not a Git work tree"):
        open_repo(repo / "evidence")  # a subdirectory is not the workspace's repository top


def test_a_clean_tree_has_no_dirty_paths(repo: Path) -> None:
    write(repo, ".tht/registry.db", "ignored state")
    assert dirty_paths(repo, ()) == []
    require_clean(repo, what="write new proposals")


def test_dirty_paths_sees_staged_unstaged_and_untracked_changes(repo: Path) -> None:
    write(repo, "evidence/curated/concept/fascia.md", "edited, not staged\n")
    write(repo, "evidence/curated/rule/eta.md", "edited and staged\n")
    git(repo, "add", "evidence/curated/rule/eta.md")
    write(repo, "evidence/curated/new dir/nuova unità.md", "untracked\n")
    (repo / "evidence/source/paziente.md").unlink()
    write(repo, "notes.txt", "outside the evidence tree\n")
    git(repo, "mv", "thoth.yaml", "thoth2.yaml")

    assert dirty_paths(repo, ["evidence/curated"]) == [
        "evidence/curated/concept/fascia.md",
        "evidence/curated/new dir/nuova unità.md",
        "evidence/curated/rule/eta.md",
    ]
    assert dirty_paths(repo, ["evidence/source", "notes.txt"]) == [
        "evidence/source/paziente.md",
        "notes.txt",
    ]
    everything = dirty_paths(repo, ())
    assert "thoth.yaml" in everything and "thoth2.yaml" in everything  # both sides of a rename
    assert len(everything) == 7
    assert dirty_paths(repo, ["."]) == everything
    assert dirty_paths(repo, ["evidence/manifest.yaml"]) == []


def test_pathspecs_are_literal(repo: Path) -> None:
    write(repo, "evidence/curated/x.md", "untracked\n")
    assert dirty_paths(repo, ["evidence/*"]) == []


def test_require_clean_names_the_action_and_at_most_ten_paths(repo: Path) -> None:
    for i in range(12):
        write(repo, f"evidence/curated/concept/n{i:02d}.md", "x\n")
    with pytest.raises(GitError) as exc:
        require_clean(repo, ["evidence/curated"], what="write new proposals")
    message = str(exc.value)
    assert message.startswith(
        f"{repo}: cannot write new proposals: 12 uncommitted change(s) "
        "under evidence/curated: evidence/curated/concept/n00.md, "
    )
    assert "n09.md and 2 more; commit or stash them first" in message
    assert "n10.md" not in message
    require_clean(repo, ["evidence/source"], what="write new proposals")


def test_require_clean_refuses_paths_outside_the_repository(repo: Path) -> None:
    with pytest.raises(GitError, match="stay inside it"):
        dirty_paths(repo, ["../elsewhere"])
    with pytest.raises(GitError, match="stay inside it"):
        dirty_paths(repo, ["/etc"])


def test_resolve_revision(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    first = git(repo, "rev-parse", "HEAD~1")
    assert resolve_revision(repo) == head
    assert resolve_revision(repo, "main") == head
    assert resolve_revision(repo, "HEAD~1") == first
    assert resolve_revision(repo, first[:8]) == first
    git(repo, "tag", "-a", "v1", "-m", "annotated", first)
    assert resolve_revision(repo, "v1") == first  # the commit, not the tag object
    for bad in ("no-such-branch", "HEAD~9", "0" * 40):
        with pytest.raises(GitError, match=f"unknown Git revision '{bad}'"):
            resolve_revision(repo, bad)
    for bad in ("", "--all", "main main"):
        with pytest.raises(GitError, match="not a valid Git revision"):
            resolve_revision(repo, bad)


def test_resolve_revision_in_an_empty_repository(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    with pytest.raises(GitError, match="no commits yet"):
        resolve_revision(tmp_path)


def test_materialize_writes_the_committed_tree_not_the_work_tree(
    repo: Path, tmp_path: Path
) -> None:
    first = resolve_revision(repo, "HEAD~1")
    write(repo, "evidence/curated/concept/fascia.md", "uncommitted edit\n")
    write(repo, "evidence/curated/untracked.md", "untracked\n")

    dest = materialize_revision(repo, "HEAD~1", tmp_path / "revs" / first)
    assert dest == tmp_path / "revs" / first
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert files == [
        ".gitignore",
        MARKER_NAME,
        "evidence/curated/concept/fascia.md",
        "evidence/source/paziente.md",
        "thoth.yaml",
    ]
    assert (dest / "evidence/curated/concept/fascia.md").read_text() == (
        "---\nid: evidence:fascia\n---\nv1\n"
    )
    assert json.loads((dest / MARKER_NAME).read_text()) == {"revision": first, "paths": []}
    leftovers = [p.name for p in dest.parent.iterdir() if p.name != first]
    assert leftovers == []  # the temporary directory was renamed, nothing else remains


def test_materialize_only_some_paths(repo: Path, tmp_path: Path) -> None:
    head = resolve_revision(repo)
    dest = materialize_revision(
        repo,
        head,
        tmp_path / "m",
        paths=["evidence/curated", "evidence/curated/rule", "thoth.yaml"],
    )
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert files == [
        MARKER_NAME,
        "evidence/curated/concept/fascia.md",
        "evidence/curated/rule/eta.md",
        "thoth.yaml",
    ]
    marker = json.loads((dest / MARKER_NAME).read_text())
    assert marker == {"revision": head, "paths": ["evidence/curated", "thoth.yaml"]}
    with pytest.raises(GitError, match="'evidence/nope' does not exist at revision"):
        materialize_revision(repo, head, tmp_path / "n", paths=["evidence/nope"])
    assert not (tmp_path / "n").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".n.")] == []


def test_materialize_keeps_modes_and_links(repo: Path, tmp_path: Path) -> None:
    write(repo, "tools/run.sh", "#!/bin/sh\n")
    (repo / "tools/run.sh").chmod(0o755)
    os.symlink("run.sh", repo / "tools/link")
    head = commit(repo, "tools")
    dest = materialize_revision(repo, head, tmp_path / "m", paths=["tools"])
    assert (dest / "tools/run.sh").stat().st_mode & stat.S_IXUSR
    assert os.readlink(dest / "tools/link") == "run.sh"


def test_materialize_reuses_a_complete_destination(repo: Path, tmp_path: Path) -> None:
    head = resolve_revision(repo)
    dest = materialize_revision(repo, head, tmp_path / "m")
    built = dest.stat().st_ino
    assert materialize_revision(repo, "HEAD", dest) == dest
    assert dest.stat().st_ino == built  # reused, not rebuilt
    sentinel = dest / "sentinel"
    sentinel.write_text("not committed")
    assert materialize_revision(repo, "HEAD", dest) == dest
    assert not sentinel.exists()  # a file no commit holds: rebuilt from Git (issue 14 item 4)
    assert dest.stat().st_ino != built


def test_materialize_replaces_another_revision_but_never_foreign_directories(
    repo: Path, tmp_path: Path
) -> None:
    dest = materialize_revision(repo, "HEAD~1", tmp_path / "m")
    assert not (dest / "evidence/curated/rule/eta.md").exists()
    materialize_revision(repo, "HEAD", dest)
    assert (dest / "evidence/curated/rule/eta.md").read_text().endswith("new\n")
    assert json.loads((dest / MARKER_NAME).read_text())["revision"] == resolve_revision(repo)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "ws"]

    foreign = tmp_path / "mine"
    write(foreign, "precious.txt", "user data")
    with pytest.raises(GitError, match="not a materialized revision; refusing to replace it"):
        materialize_revision(repo, "HEAD", foreign)
    assert (foreign / "precious.txt").read_text() == "user data"


def test_materialize_unknown_revision(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(GitError, match="unknown Git revision 'v9'"):
        materialize_revision(repo, "v9", tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_changed_files(repo: Path) -> None:
    first = resolve_revision(repo, "HEAD~1")
    assert changed_files(repo, first, "HEAD") == [
        "evidence/curated/concept/fascia.md",
        "evidence/curated/rule/eta.md",
    ]
    git(repo, "mv", "evidence/source/paziente.md", "evidence/source/pazienti.md")
    commit(repo, "rename")
    assert changed_files(repo, "HEAD~1", "HEAD") == [
        "evidence/source/paziente.md",
        "evidence/source/pazienti.md",
    ]
    assert changed_files(repo, first, "HEAD", under=["evidence/source"]) == [
        "evidence/source/paziente.md",
        "evidence/source/pazienti.md",
    ]
    assert changed_files(repo, "HEAD", "HEAD") == []
    with pytest.raises(GitError, match="unknown Git revision"):
        changed_files(repo, "nope", "HEAD")
