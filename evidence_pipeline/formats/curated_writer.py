"""Writing curated files and the workspace's other YAML files in the house style.

The runtime only reads them (``evidence_runtime.curated``, ``evidence_runtime.yamlio``); these
writers use the same :func:`~evidence_runtime.yamlio.make_yaml` configuration, so that a
load/save round trip is byte-identical and a change touches only the edited lines.
"""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import LiteralScalarString

from evidence_pipeline.markdown import BlockKind, parse_blocks, split_lines
from evidence_runtime.curated import DELIMITER, CuratedDocument
from evidence_runtime.units import UnitBase, unit_to_data
from evidence_runtime.yamlio import make_yaml

__all__ = [
    "curated_relpath",
    "document_from_unit",
    "dump_curated",
    "dump_rt",
    "render_body",
    "to_rt",
]


def dump_rt(data: Any) -> str:
    """Serialize round-trip or plain data in the house style."""
    buf = io.StringIO()
    make_yaml().dump(data, buf)
    return buf.getvalue()


def to_rt(value: Any) -> Any:
    """Plain data → round-trip containers, multi-line strings as literal blocks."""
    if isinstance(value, dict):
        m = CommentedMap()
        for k, v in value.items():
            m[k] = to_rt(v)
        return m
    if isinstance(value, (list, tuple)):
        return CommentedSeq([to_rt(v) for v in value])
    if isinstance(value, str) and "\n" in value:
        return LiteralScalarString(value)
    return value


def dump_curated(doc: CuratedDocument) -> str:
    """Serialize a curated document (front matter in the house style, body verbatim)."""
    return f"{DELIMITER}\n{dump_rt(doc.front)}{DELIMITER}\n{doc.body}"


def document_from_unit(unit: UnitBase, body: str, *, path: str | None = None) -> CuratedDocument:
    """A new curated document in canonical key order."""
    return CuratedDocument(front=to_rt(unit_to_data(unit)), body=body, path=path)


def render_body(unit: UnitBase, text: str | None = None) -> str:
    """Markdown body: a title heading and the restructured text (or the first excerpt).

    A text that already opens with a heading equal to the title (models often write one) does
    not get it twice.
    """
    content = (text if text is not None else unit.provenance.supporting_excerpts[0]).strip()
    blocks = parse_blocks(content)
    if (blocks and blocks[0].kind is BlockKind.heading
            and blocks[0].title.casefold() == unit.title.strip().casefold()):
        content = "\n".join(split_lines(content)[blocks[0].end:]).strip()
    return f"\n# {unit.title}\n\n{content}\n" if content else f"\n# {unit.title}\n"


def curated_relpath(unit: UnitBase) -> str:
    """Path of a unit's file relative to ``evidence/``: ``curated/<kind>/<slug>.md``."""
    slug = unit.id.removeprefix("evidence:")
    return f"curated/{unit.kind.value}/{slug}.md"
