"""Shared fixtures: every test builds its own Git workspace in tmp_path."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


# --- fault-suite summaries --------------------------------------------------------------------


@dataclass
class Outcome:
    """One fault scenario of a suite: did it pass, and how many bytes of data did it lose."""

    group: str
    name: str
    passed: bool = False
    bytes_lost: int = 0


def print_fault_summary(outcomes: list[Outcome], title: str,
                        capsys: pytest.CaptureFixture[str]) -> None:
    """Print scenarios tried / passed / bytes lost per group and assert nothing was lost."""
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(o.group, []).append(o)
    rows = [(g, len(os_), sum(o.passed for o in os_), sum(o.bytes_lost for o in os_))
            for g, os_ in sorted(groups.items())]
    total = ("total", len(outcomes), sum(o.passed for o in outcomes),
             sum(o.bytes_lost for o in outcomes))
    width = max([len(r[0]) for r in rows] + [len("scenario group"), len(total[0])])
    header = f"{'scenario group':<{width}}  {'tried':>6}  {'passed':>6}  {'bytes lost':>10}"
    lines = ["", title, header, "-" * len(header)]
    lines += [f"{g:<{width}}  {t:>6}  {p:>6}  {lost:>10}" for g, t, p, lost in rows]
    lines += ["-" * len(header), f"{total[0]:<{width}}  {total[1]:>6}  {total[2]:>6}  "
              f"{total[3]:>10}"]
    with capsys.disabled():
        print("\n".join(lines))
    assert total[3] == 0, [o.name for o in outcomes if o.bytes_lost]


# --- index wrappers for fault injection ------------------------------------------------------


class Delegating:
    """An index that forwards everything to a real one (fault injection overrides a method)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class KeepOpen(Delegating):
    """Keeps an in-process qdrant-client collection alive after ``preprocess`` closes it."""

    def close(self) -> None:
        pass
