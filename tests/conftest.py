"""Shared fixtures: every test builds its own Git workspace in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from evidence_pipeline.demo import create_demo_repo


@pytest.fixture
def demo_ws(tmp_path: Path) -> Path:
    """A fresh copy of the demo workspace as a committed Git repository."""
    return create_demo_repo(tmp_path / "ws")


def curated_files(ws: Path, kind: str) -> list[Path]:
    return sorted((ws / "evidence" / "curated" / kind).glob("*.md"))
