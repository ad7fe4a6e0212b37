"""Round-trip YAML with one house style, so that load/save is byte-identical and diffs are minimal.

Front matter and workspace files are data, not programs: anchors, aliases and custom tags are
refused before anything is constructed (no alias bombs, no object construction).
"""

from __future__ import annotations

import io
import re
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.scalarstring import LiteralScalarString

from evidence_runtime.errors import UnitFormatError

_STANDARD_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
}
MAX_YAML_NODES = 100_000
# ruamel's scanner is quadratic in the depth of flow collections ([[[… or {{{…): bound it on
# the raw text before parsing (brackets inside strings count too; no real file comes close)
MAX_FLOW_DEPTH = 100
_BRACKETS = re.compile(r"[^\[\]{}]+")


def make_yaml() -> YAML:
    """The one YAML configuration used for every file this project reads or writes."""
    y = YAML(typ="rt")
    y.width = 4096
    y.indent(mapping=2, sequence=4, offset=2)
    y.preserve_quotes = True
    y.allow_duplicate_keys = False
    return y


def _check_nodes(root: Node | None, path: str | None) -> None:
    stack: list[Node] = [root] if root is not None else []
    count = 0
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_YAML_NODES:
            raise UnitFormatError("YAML document is too large", path=path,
                                  code="yaml_forbidden_construct")
        anchor = getattr(node, "anchor", None)
        if anchor:
            raise UnitFormatError(
                f"YAML anchors and aliases are not allowed (&{anchor}, line {_line(node)})",
                path=path, code="yaml_forbidden_construct",
            )
        if node.tag not in _STANDARD_TAGS and not (
            isinstance(node, ScalarNode) and node.tag.startswith("tag:yaml.org,2002:timestamp")
        ):
            raise UnitFormatError(
                f"YAML tag {node.tag!r} is not allowed (line {_line(node)})", path=path,
                code="yaml_forbidden_construct",
            )
        if isinstance(node, MappingNode):
            for k, v in node.value:
                stack.extend((k, v))
        elif isinstance(node, SequenceNode):
            stack.extend(node.value)


def _flow_depth(text: str) -> int:
    depth = deepest = 0
    for ch in _BRACKETS.sub("", text):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif depth:
            depth -= 1
    return deepest


def _line(node: Node) -> int:
    return node.start_mark.line + 1 if node.start_mark else 0


def load_rt(text: str, *, path: str | None = None) -> Any:
    """Parse YAML text into round-trip data; a clear :class:`UnitFormatError` on any fault."""
    y = make_yaml()
    if _flow_depth(text) > MAX_FLOW_DEPTH:
        raise UnitFormatError(f"YAML document is nested more than {MAX_FLOW_DEPTH} levels deep",
                              path=path, code="yaml_forbidden_construct")
    try:
        root = y.compose(text)
        _check_nodes(root, path)
        return y.load(text)
    except UnitFormatError:
        raise
    except RecursionError:
        # the composer recurses once per nesting level: a deeply nested document is a bomb
        raise UnitFormatError("YAML document is nested too deeply", path=path,
                              code="yaml_forbidden_construct") from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = exc.problem or exc.context or "malformed YAML"
        raise UnitFormatError(f"malformed YAML: {problem}{where}", path=path,
                              code="front_matter_malformed") from None
    except (YAMLError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnitFormatError(f"malformed YAML: {first}", path=path,
                              code="front_matter_malformed") from None


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


def to_plain(value: Any) -> Any:
    """Round-trip containers → plain dicts, lists and str (for pydantic)."""
    if isinstance(value, dict):
        return {_key(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


def _key(key: Any) -> str:
    # Keys in our files are always names or codes; a code such as 01 or 1 is meant as text.
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)
