"""The package's layers: every import of ``evidence_pipeline`` points down (or stays in its room).

cli → orchestration → authoring / publishing → validation → formats → gitrepo, lock, markdown,
state → evidence_runtime. Imports inside functions count as much as those at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# a room's rank: it may import rooms of a lower rank, and its own
RANKS = {
    "evidence_runtime": 0,
    "gitrepo": 1, "lock": 1, "markdown": 1, "state": 1, "demo": 1,
    "formats": 2,
    "validation": 3,
    "authoring": 4, "publishing": 4,
    "orchestration": 5, "definitions": 5, "review": 5,
    "cli": 6,
}


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "evidence_runtime":
        return "evidence_runtime"
    if parts[0] == "evidence_pipeline" and len(parts) > 1:
        return parts[1]
    return None


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in ``path``, ``from evidence_pipeline import x``
    read as ``evidence_pipeline.x``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "evidence_pipeline":
                found += [(node.lineno, f"evidence_pipeline.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def _upward(root: Path, package: str) -> list[str]:
    wrong = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root)
        own = _room(".".join(rel.with_suffix("").parts))
        for line, module in _imports(path):
            target = _room(module)
            if own is None or target is None or target == own:
                continue
            if RANKS[target] > RANKS[own]:
                wrong.append(f"{rel}:{line} ({own}) imports {module} ({target})")
    return wrong


def test_every_room_of_the_pipeline_has_a_rank() -> None:
    rooms = {p.stem if p.is_file() else p.name for p in (ROOT / "evidence_pipeline").iterdir()
             if (p.suffix == ".py" and p.stem != "__init__")
             or (p.is_dir() and any(p.glob("*.py")))}
    assert rooms - RANKS.keys() == set()


@pytest.mark.parametrize("package", ["evidence_pipeline", "evidence_runtime"])
def test_imports_point_down(package: str) -> None:
    assert _upward(ROOT, package) == []


def test_an_upward_import_is_seen_even_inside_a_function(tmp_path: Path) -> None:
    (tmp_path / "evidence_pipeline" / "validation").mkdir(parents=True)
    (tmp_path / "evidence_pipeline" / "validation" / "m.py").write_text(
        "from evidence_pipeline.formats import manifest\n"
        "def f():\n    from evidence_pipeline.publishing import evaluate\n"
        "from evidence_pipeline import cli\n", encoding="utf-8")
    assert sorted(_upward(tmp_path, "evidence_pipeline")) == [
        "evidence_pipeline/validation/m.py:3 (validation) imports "
        "evidence_pipeline.publishing (publishing)",
        "evidence_pipeline/validation/m.py:4 (validation) imports evidence_pipeline.cli (cli)",
    ]
