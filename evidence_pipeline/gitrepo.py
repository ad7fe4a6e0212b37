"""Git helpers for the authoring and publishing commands (GitPython over the git CLI).

Authoring refuses to write over uncommitted work (spec §13.1); publishing reads a revision's
committed tree, never the work tree, so what is indexed is exactly what was reviewed (§7.2, §8).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

import git

from evidence_runtime.errors import ErrorCode, EvidenceError

__all__ = [
    "MARKER_NAME",
    "GitError",
    "changed_files",
    "dirty_paths",
    "ignored_paths",
    "materialize_revision",
    "merge_text",
    "open_repo",
    "require_clean",
    "resolve_revision",
    "stale_paths",
]

# Written last into a materialized tree; its presence with the right revision means "complete".
MARKER_NAME = ".tht-materialized.json"
MAX_LISTED = 10


class GitError(EvidenceError):
    """The workspace is not a usable Git work tree, is dirty, or a revision is unknown."""

    code = ErrorCode.git_error


# Settings every git process runs with, over whatever the repository (or a file it includes)
# configures: nothing the repository names is ever executed (issue 28, item 5). Environment
# configuration (GIT_CONFIG_COUNT, Git >= 2.31) wins over every configuration file.
_SAFE_SETTINGS = (
    ("core.fsmonitor", "false"),  # a command Git runs on status/diff/ls-files
    ("core.hooksPath", os.devnull),  # no hook
    ("core.pager", "cat"),  # diff.external is never run: the one diff is --no-ext-diff
    ("core.sshCommand", "false"),  # no transport is ever used; none may run
    ("core.askPass", ""),
    ("protocol.allow", "never"),
)
# Settings whose name holds a driver the repository names (``filter.<driver>.process``): each one
# the configuration defines is overridden with an empty command, which Git does not run.
_DRIVER_KEYS = {
    "filter": {"clean": "", "smudge": "", "process": "", "required": "false"},
    "diff": {"textconv": "", "command": ""},
    "merge": {"driver": ""},
}
_SAFE_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "GIT_EDITOR": "false",
    "GIT_PROTOCOL_FROM_USER": "0",
}


def _config_env(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``GIT_CONFIG_COUNT``/``_KEY_n``/``_VALUE_n`` for ``pairs``, after any the caller set."""
    try:
        start = int(os.environ.get("GIT_CONFIG_COUNT", "0"))
    except ValueError:
        start = 0
    env = {"GIT_CONFIG_COUNT": str(start + len(pairs))}
    for i, (key, value) in enumerate(pairs, start):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def _driver_overrides(repo: git.Repo) -> list[tuple[str, str]]:
    """An empty command for every filter, diff or merge driver the configuration defines
    (includes followed), read with the safe settings already in force."""
    try:
        out = repo.git.execute(["git", "config", "--list", "-z", "--name-only"],
                               strip_newline_in_stdout=False)
    except git.GitCommandError:
        return []
    pairs: dict[tuple[str, str], None] = {}
    for name in str(out).split("\0"):
        section, _, rest = name.partition(".")
        driver, _, _ = rest.rpartition(".")
        keys = _DRIVER_KEYS.get(section.lower())
        if keys is None or not driver:
            continue
        for key, value in keys.items():
            pairs[(f"{section}.{driver}.{key}", value)] = None
    return list(pairs)


MIN_GIT = (2, 31)  # GIT_CONFIG_COUNT; an older Git ignores it and would run the commands


@functools.cache
def _git_version() -> tuple[int, ...]:
    return tuple(int(part) for part in git.Git().version_info[:2])


def _harden(repo: git.Repo, root: Path) -> None:
    """Make every git process of ``repo`` run with repository-configured commands disabled;
    :class:`GitError` with a Git too old to be told so."""
    found = _git_version()
    if found < MIN_GIT:
        raise GitError(f"Git {'.'.join(map(str, MIN_GIT))} or newer is needed (found "
                       f"{'.'.join(map(str, found))}): older versions cannot be kept from "
                       "running commands the repository configures", path=str(root))
    repo.git.update_environment(**_SAFE_ENV, **_config_env(_SAFE_SETTINGS))
    drivers = _driver_overrides(repo)
    if drivers:
        repo.git.update_environment(**_config_env([*_SAFE_SETTINGS, *drivers]))


def open_repo(root: Path) -> git.Repo:
    """The repository whose work tree top is ``root``; use it as a context manager to close it.

    Its git processes never run a command the repository configures (fsmonitor, hooks, filter,
    textconv, diff and merge drivers, pagers, editors, transports): see :data:`_SAFE_SETTINGS`.
    """
    root = Path(root)
    if not root.is_dir():
        raise GitError("workspace directory does not exist", path=str(root))
    try:
        repo = git.Repo(root)
    except git.InvalidGitRepositoryError:
        raise GitError(
            "not a Git work tree (expected a repository whose top directory is the workspace)",
            path=str(root),
        ) from None
    except git.NoSuchPathError:
        raise GitError("workspace directory does not exist", path=str(root)) from None
    except git.GitCommandNotFound:
        raise GitError("the git command is not installed", path=str(root)) from None
    if repo.bare:
        repo.close()
        raise GitError("a bare repository has no work tree", path=str(root))
    try:
        _harden(repo, root)
    except BaseException:
        repo.close()
        raise
    return repo


def _pathspecs(under: Sequence[str]) -> list[str]:
    """Literal, top-relative pathspecs (no globbing); none (the whole tree) for ``.``."""
    cleaned = [_clean_relpath(p) for p in under]
    if "" in cleaned:
        return []
    return [f":(top,literal){p}" for p in cleaned]


def _clean_relpath(path: str) -> str:
    pure = PurePosixPath(str(path).replace("\\", "/"))
    if pure.is_absolute() or ".." in pure.parts:
        raise GitError(f"path must be relative to the repository and stay inside it: {path!r}")
    cleaned = str(pure)
    return "" if cleaned == "." else cleaned


def _run_git(root: Path, action: str, repo: git.Repo, *args: str) -> str:
    """Run ``git <args>`` in the work tree; stdout untouched (``-z`` output keeps its NULs)."""
    try:
        return repo.git.execute(["git", *args], strip_newline_in_stdout=False)
    except git.GitCommandError as exc:
        detail = str(exc.stderr or "").strip().removeprefix("stderr:").strip(" '\n")
        raise GitError(f"cannot {action}: {detail or exc}", path=str(root)) from None


def _git_z(root: Path, action: str, *args: str, under: Sequence[str]) -> list[str]:
    """The NUL-separated entries ``git <args> -- <under's pathspecs>`` writes (``args`` ask
    for ``-z``), in Git's order, empty ones included."""
    with open_repo(root) as repo:
        return _run_git(root, action, repo, *args, "--", *_pathspecs(under)).split("\0")


def dirty_paths(root: Path, under: Sequence[str] = ()) -> list[str]:
    """Repo-relative paths with uncommitted changes (staged, unstaged or untracked, not
    ignored) under ``under`` (the whole tree when empty), sorted."""
    entries = _git_z(root, "read the Git status", "status", "--porcelain=v1", "-z",
                     "--untracked-files=all", "--ignore-submodules=none", under=under)
    paths: set[str] = set()
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        xy, path = entry[:2], entry[3:]
        paths.add(path)
        if "R" in xy or "C" in xy:  # renames and copies carry the old path as the next entry
            if i < len(entries) and entries[i]:
                paths.add(entries[i])
            i += 1
    return sorted(paths)


def ignored_paths(root: Path, under: Sequence[str] = ()) -> list[str]:
    """Repo-relative paths of the files Git ignores under ``under`` (the whole tree when
    empty), sorted: files no commit will ever hold."""
    out = _git_z(root, "list ignored files", "ls-files", "-z", "--others", "--ignored",
                 "--exclude-standard", under=under)
    return sorted(p for p in out if p)


def require_clean(root: Path, under: Sequence[str] = (), *, what: str) -> None:
    """Raise ``GitError`` naming up to ten dirty paths if ``under`` has uncommitted changes.

    ``what`` is the refused action as a verb phrase, e.g. ``"write new proposals"``.
    """
    dirty = dirty_paths(root, under)
    if not dirty:
        return
    scope = f" under {', '.join(under)}" if under else ""
    listed = ", ".join(dirty[:MAX_LISTED])
    more = f" and {len(dirty) - MAX_LISTED} more" if len(dirty) > MAX_LISTED else ""
    raise GitError(
        f"cannot {what}: {len(dirty)} uncommitted change(s){scope}: {listed}{more}; "
        "commit or stash them first",
        path=str(root),
    )


def resolve_revision(root: Path, rev: str = "HEAD") -> str:
    """The full 40-hex commit id that ``rev`` names."""
    if not rev or rev.startswith("-") or any(c.isspace() or c == "\0" for c in rev):
        raise GitError(f"not a valid Git revision: {rev!r}", path=str(root))
    with open_repo(root) as repo:
        try:
            sha = repo.git.rev_parse("--verify", "--quiet", f"{rev}^{{commit}}")
        except git.GitCommandError:
            if rev == "HEAD" and not repo.head.is_valid():
                raise GitError("the repository has no commits yet", path=str(root)) from None
            raise GitError(f"unknown Git revision {rev!r}", path=str(root)) from None
    return sha.strip()


def _read_marker(dest: Path) -> dict[str, object] | None:
    try:
        data = json.loads((dest / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_blob(blob: git.Blob, target: Path) -> None:
    """One blob exactly as committed: raw bytes (no eol or smudge filters), mode kept; a
    symbolic link stays a link, as a checkout would leave it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if stat.S_ISLNK(blob.mode):
        os.symlink(os.fsdecode(blob.data_stream.read()), target)
        return
    with open(target, "wb") as fh:
        shutil.copyfileobj(blob.data_stream, fh)
    if blob.mode & 0o111:
        target.chmod(target.stat().st_mode | 0o111)


def _write_item(item: git.Blob | git.Tree | git.Submodule, target: Path) -> None:
    if item.type == "blob":
        _write_blob(item, target)
        return
    target.mkdir(parents=True, exist_ok=True)
    if item.type != "tree":  # a submodule's mount point, left empty as without --recursive
        return
    base = PurePosixPath(item.path)
    for sub in item.traverse():
        out = target / PurePosixPath(sub.path).relative_to(base)
        if sub.type == "blob":
            _write_blob(sub, out)
        else:  # a directory, or a submodule's mount point (left empty, as without --recursive)
            out.mkdir(parents=True, exist_ok=True)


def materialize_revision(
    root: Path, revision: str, dest: Path, *, paths: Sequence[str] = ()
) -> Path:
    """Write the committed tree of ``revision`` (only ``paths`` when given) into ``dest``.

    The tree is built in a temporary directory beside ``dest`` and renamed into place, with a
    marker naming the revision written last. An existing ``dest`` for the same revision and
    paths is reused only when every file in it still is the committed blob (same object id,
    nothing added, removed or turned into a link); otherwise it is rebuilt from Git, so what is
    read from ``dest`` is always what the commit holds. A ``dest`` that is not a
    materialization (or is a symbolic link) is never replaced.
    """
    root, dest = Path(root), Path(dest)
    sha = resolve_revision(root, revision)
    wanted = _outermost({_clean_relpath(p) for p in paths})
    expected = {"revision": sha, "paths": wanted}
    if dest.exists() or dest.is_symlink():
        marker = None if dest.is_symlink() or not dest.is_dir() else _read_marker(dest)
        if marker is None:
            raise GitError(
                "exists and is not a materialized revision; refusing to replace it",
                path=str(dest),
            )
        if marker == expected and not _stale(root, sha, wanted, dest):
            return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        with open_repo(root) as repo:
            tree = repo.commit(sha).tree
            if not wanted:
                _write_item(tree, tmp)
            for sub in wanted:
                _write_item(_subtree(tree, sub, sha, root), tmp / sub)
        (tmp / MARKER_NAME).write_text(json.dumps(expected, indent=2) + "\n", encoding="utf-8")
        tmp.chmod(0o755)
        _swap_into_place(tmp, dest, expected)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _subtree(tree: git.Tree, sub: str, sha: str, root: Path) -> git.Blob | git.Tree | git.Submodule:
    try:
        return tree / sub
    except KeyError:
        raise GitError(f"path {sub!r} does not exist at revision {sha}", path=str(root)) from None


# What materializing writes, as (kind, object id): a regular file or a link with its blob id, a
# directory (a tree, a submodule's empty mount point, or a parent of a requested path).
_Entry = tuple[str, str | None]


def _committed_entries(tree: git.Tree, wanted: Sequence[str], sha: str,
                       root: Path) -> dict[str, _Entry]:
    entries: dict[str, _Entry] = {}

    def add(path: str, item: git.Blob | git.Tree | git.Submodule) -> None:
        if item.type == "blob":
            entries[path] = ("link" if stat.S_ISLNK(item.mode) else "file", item.hexsha)
        else:
            entries[path] = ("dir", None)

    for sub in wanted or [""]:
        item = _subtree(tree, sub, sha, root) if sub else tree
        parts = PurePosixPath(sub).parts
        for i in range(1, len(parts)):
            entries["/".join(parts[:i])] = ("dir", None)
        if sub:
            add(sub, item)
        if item.type == "tree":
            for found in item.traverse():
                add(found.path, found)
    return entries


def _blob_id(data: bytes, algorithm: str) -> str:
    """Git's object id of a blob holding ``data`` (``sha1``, or ``sha256`` repositories)."""
    digest = hashlib.new(algorithm)
    digest.update(b"blob %d\0" % len(data))
    digest.update(data)
    return digest.hexdigest()


def _present_entries(dest: Path, algorithm: str) -> dict[str, _Entry]:
    """What ``dest`` holds, in the shape of :func:`_committed_entries` (links never followed)."""
    found: dict[str, _Entry] = {}
    for top, dirs, files in os.walk(dest, followlinks=False):
        base = Path(top)
        for name in [*dirs, *files]:
            path = base / name
            rel = path.relative_to(dest).as_posix()
            if rel == MARKER_NAME:
                continue
            if path.is_symlink():
                found[rel] = ("link", _blob_id(os.fsencode(os.readlink(path)), algorithm))
            elif path.is_dir():
                found[rel] = ("dir", None)
            elif path.is_file():
                found[rel] = ("file", _blob_id(path.read_bytes(), algorithm))
            else:  # a fifo, socket or device: nothing a commit holds
                found[rel] = ("other", None)
    return found


def stale_paths(root: Path, revision: str, dest: Path, *, paths: Sequence[str] = ()) -> list[str]:
    """Paths under ``dest`` that differ from ``revision``'s committed tree (``paths`` only, as
    materialized): edited, added, removed, or of another type (a link for a file); sorted."""
    return _stale(root, resolve_revision(root, revision),
                  _outermost({_clean_relpath(p) for p in paths}), dest)


def _stale(root: Path, sha: str, wanted: Sequence[str], dest: Path) -> list[str]:
    with open_repo(root) as repo:
        committed = _committed_entries(repo.commit(sha).tree, wanted, sha, root)
    present = _present_entries(dest, "sha256" if len(sha) == 64 else "sha1")
    return sorted(p for p in committed.keys() | present.keys()
                  if committed.get(p) != present.get(p))


def _outermost(paths: set[str]) -> list[str]:
    """Sorted paths without those inside another one; [] when the whole tree is asked for."""
    if "" in paths:
        return []
    kept: list[str] = []
    for path in sorted(paths):
        if not any(path.startswith(f"{k}/") for k in kept):
            kept.append(path)
    return kept


def _swap_into_place(tmp: Path, dest: Path, expected: dict[str, object]) -> None:
    old: Path | None = None
    if dest.exists():  # an older materialization of another revision: move it aside first
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}-{tmp.name[-8:]}")
        os.rename(dest, old)
    try:
        os.rename(tmp, dest)
    except OSError:
        # Another process finished the same materialization first: keep theirs.
        if _read_marker(dest) != expected:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def changed_files(
    root: Path, old_rev: str, new_rev: str, *, under: Sequence[str] = ()
) -> list[str]:
    """Repo-relative paths that differ between two commits (a rename is its two paths), sorted."""
    old_sha = resolve_revision(root, old_rev)
    new_sha = resolve_revision(root, new_rev)
    out = _git_z(root, "compare revisions", "diff", "--name-only", "-z", "--no-renames",
                 "--no-ext-diff", "--no-textconv",
                 old_sha, new_sha, under=under)
    return sorted({p for p in out if p})


def committed_bytes_with_sha256(root: Path, path: str, sha256: str, *,
                                max_commits: int = 50) -> bytes | None:
    """The bytes of ``path`` as committed in the most recent of the last ``max_commits``
    commits touching it whose content hashes to ``sha256`` (``"sha256:<hex>"``), or None.

    prepare uses it to hand the model the source text its previous units were made from.
    """
    want = sha256.removeprefix("sha256:")
    spec = _clean_relpath(path)
    try:
        with open_repo(root) as repo:
            if not repo.head.is_valid():
                return None
            for commit in repo.iter_commits(paths=spec, max_count=max_commits):
                try:
                    blob = commit.tree / spec
                except KeyError:
                    continue
                data = blob.data_stream.read()
                if hashlib.sha256(data).hexdigest() == want:
                    return data
    except (GitError, git.GitCommandError, ValueError):
        return None
    return None


def merge_text(base: str, ours: str, theirs: str, *,
               labels: tuple[str, str, str] = ("curated", "before", "source")) -> tuple[str, int]:
    """Three-way merge of texts by ``git merge-file``: (merged text, number of conflicts).

    The merged text holds conflict markers where there are conflicts. Git runs outside any
    repository and without system or user configuration (no ``merge.conflictStyle``, drivers
    or hooks of the machine's or a workspace's config apply). :class:`GitError` when git
    cannot run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    with tempfile.TemporaryDirectory(prefix="tht-merge-") as tmp:
        env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, HOME=tmp,
                   XDG_CONFIG_HOME=tmp, GIT_CEILING_DIRECTORIES=tmp)
        files = []
        for name, text in (("ours", ours), ("base", base), ("theirs", theirs)):
            f = Path(tmp) / name
            f.write_text(text, encoding="utf-8")
            files.append(str(f))
        label_args = [arg for label in labels for arg in ("-L", label)]
        try:
            proc = subprocess.run(["git", "merge-file", "-p", *label_args, *files], cwd=tmp,
                                  env=env, capture_output=True, check=False)
        except OSError as exc:
            raise GitError(f"cannot run git merge-file: {exc}") from None
    if proc.returncode < 0 or proc.returncode > 127:
        detail = proc.stderr.decode("utf-8", "replace").strip()
        raise GitError(f"git merge-file failed: {detail or proc.returncode}")
    return proc.stdout.decode("utf-8"), proc.returncode
