"""Shared fixtures: every test builds its own Git workspace in tmp_path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evidence_pipeline.demo import create_demo_repo


@pytest.fixture
def demo_ws(tmp_path: Path) -> Path:
    """A fresh copy of the demo workspace as a committed Git repository."""
    return create_demo_repo(tmp_path / "ws")


def curated_files(ws: Path, kind: str) -> list[Path]:
    return sorted((ws / "evidence" / "curated" / kind).glob("*.md"))


def vector_store(factory: pytest.TempPathFactory) -> Path:
    """A vector cache shared by this session's published workspaces (content-keyed, so it only
    saves time: a missing or cold cache gives the same results)."""
    return factory.getbasetemp() / "shared-vector-cache"


def seed_vectors(ws: Path, store: Path) -> None:
    if (store / "vectors.sqlite3").is_file():
        (ws / ".tht").mkdir(parents=True, exist_ok=True)
        shutil.copy2(store / "vectors.sqlite3", ws / ".tht" / "vectors.sqlite3")


def keep_vectors(ws: Path, store: Path) -> None:
    store.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ws / ".tht" / "vectors.sqlite3", store / "vectors.sqlite3.tmp")
    (store / "vectors.sqlite3.tmp").replace(store / "vectors.sqlite3")
