"""The demo workspace: a real Git repository built from the files kept under ``examples/psd``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from evidence_runtime.errors import ErrorCode, EvidenceError
from evidence_runtime.workspace import STATE_DIR_NAME

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEMO_SOURCE = EXAMPLES / "psd"
LEGACY_FORMULAS = EXAMPLES / "legacy-formulas"
GIT_IDENTITY = ("-c", "user.name=thoth demo", "-c", "user.email=demo@thoth.invalid",
                "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main")


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` with a fixed identity; ``demo_error`` on failure."""
    proc = subprocess.run(["git", *GIT_IDENTITY, *args], cwd=repo, capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise EvidenceError(f"git {' '.join(args)} failed: {proc.stderr.strip()[:300]}",
                            code=ErrorCode.demo_error, path=str(repo))
    return proc.stdout


def create_demo_repo(dest: Path, *, source: Path = DEMO_SOURCE, force: bool = False) -> Path:
    """Copy the demo files to ``dest`` and commit them as the first revision of a new repo."""
    dest = dest.resolve()
    if not source.is_dir():
        raise EvidenceError("demo files not found (run from a checkout of thoth-evidence)",
                            code=ErrorCode.demo_error, path=str(source))
    if dest.exists():
        if not force:
            raise EvidenceError("destination exists (use --force to replace it)",
                                code=ErrorCode.demo_error, path=str(dest))
        shutil.rmtree(dest)
    shutil.copytree(source, dest)
    (dest / ".gitignore").write_text(f"{STATE_DIR_NAME}/\n", encoding="utf-8")
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "Demo workspace: sources, curated evidence, manifest")
    return dest
