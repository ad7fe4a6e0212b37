"""The demo workspace: a real Git repository built from the files kept under ``examples/psd``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from evidence_runtime.errors import EvidenceError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEMO_SOURCE = EXAMPLES / "psd"
LEGACY_FORMULAS = EXAMPLES / "legacy-formulas"
GIT_IDENTITY = ("-c", "user.name=thoth demo", "-c", "user.email=demo@thoth.invalid",
                "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main")


class DemoError(EvidenceError):
    code = "demo_error"


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` with a fixed identity; :class:`DemoError` on failure."""
    proc = subprocess.run(["git", *GIT_IDENTITY, *args], cwd=repo, capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise DemoError(f"git {' '.join(args)} failed: {proc.stderr.strip()[:300]}",
                        path=str(repo))
    return proc.stdout


def create_demo_repo(dest: Path, *, source: Path = DEMO_SOURCE, force: bool = False) -> Path:
    """Copy the demo files to ``dest`` and commit them as the first revision of a new repo."""
    dest = dest.resolve()
    if not source.is_dir():
        raise DemoError("demo files not found (run from a checkout of thoth-evidence)",
                        path=str(source))
    if dest.exists():
        if not force:
            raise DemoError("destination exists (use --force to replace it)", path=str(dest))
        shutil.rmtree(dest)
    shutil.copytree(source, dest)
    (dest / ".gitignore").write_text(".tht/\n", encoding="utf-8")
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "Demo workspace: sources, curated evidence, manifest")
    return dest
