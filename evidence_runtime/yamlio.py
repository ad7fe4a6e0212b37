"""Reading YAML: round-trip data in one house style, so that load/save is byte-identical and
diffs are minimal (the pipeline's writer, ``evidence_pipeline.formats.curated_writer``, dumps
with the same :func:`make_yaml`).

Front matter and workspace files are data, not programs: anchors, aliases and custom tags are
refused before anything is constructed (no alias bombs, no object construction). Each text is
parsed once: the check runs on the composed node tree, inside the load, before construction.
A long text is first counted by libyaml (PyYAML's C parser, events only): one with more nodes
than the limit is refused at C speed (a 100,001-node front matter: 0.1 s instead of the ~4 s
ruamel takes to compose it). The count refuses, never accepts: ruamel's check still runs.
"""

from __future__ import annotations

import re
from typing import Any, cast

import yaml as pyyaml
from ruamel.yaml import YAML
from ruamel.yaml.constructor import RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

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
# texts longer than this are counted by libyaml first (a front matter is a few kB; a manifest of
# 1,000 sources ~100 kB, counted in ~20 ms)
FAST_COUNT_CHARS = 16_384
_FAST_LOADER: Any = getattr(pyyaml, "CSafeLoader", None)  # None where PyYAML lacks libyaml
_NODE_EVENTS = (pyyaml.ScalarEvent, pyyaml.SequenceStartEvent, pyyaml.MappingStartEvent,
                pyyaml.AliasEvent)


def make_yaml() -> YAML:
    """The one YAML configuration used for every file this project reads or writes."""
    y = YAML(typ="rt")
    y.width = 4096
    y.indent(mapping=2, sequence=4, offset=2)
    y.preserve_quotes = True
    y.allow_duplicate_keys = False
    return y


def _check_nodes(root: Node | None, path: str | None = None) -> None:
    # ruamel's nodes carry no type annotations: they are handled as Any, told apart by ``id``
    stack: list[Any] = [root] if root is not None else []
    count = 0
    while stack:
        node: Any = stack.pop()
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
        tag = str(node.tag)
        if tag not in _STANDARD_TAGS and not (
            node.id == ScalarNode.id and tag.startswith("tag:yaml.org,2002:timestamp")
        ):
            raise UnitFormatError(
                f"YAML tag {tag!r} is not allowed (line {_line(node)})", path=path,
                code="yaml_forbidden_construct",
            )
        if node.id == MappingNode.id:
            for k, v in node.value:
                stack.extend((k, v))
        elif node.id == SequenceNode.id:
            stack.extend(node.value)


def _too_many_nodes(text: str) -> bool:
    """True when libyaml counts more than ``MAX_YAML_NODES`` nodes in a long ``text``; False
    for a short text, without libyaml, or when libyaml cannot parse it (ruamel then says why)."""
    if len(text) <= FAST_COUNT_CHARS or _FAST_LOADER is None:
        return False
    count = 0
    try:
        parser: Any = _FAST_LOADER(text)  # what pyyaml.parse does, typed (its events are not)
    except UnicodeError:  # libyaml takes UTF-8: a lone surrogate cannot be encoded
        return False
    try:
        while parser.check_event():
            if isinstance(parser.get_event(), _NODE_EVENTS):
                count += 1
                if count > MAX_YAML_NODES:
                    return True
    except (pyyaml.YAMLError, UnicodeError):
        return False
    finally:
        parser.dispose()
    return False


def _flow_depth(text: str) -> int:
    depth = deepest = 0
    for ch in _BRACKETS.sub("", text):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif depth:
            depth -= 1
    return deepest


def _line(node: Any) -> int:
    mark: Any = node.start_mark
    return int(mark.line) + 1 if mark else 0


class _CheckedConstructor(RoundTripConstructor):
    """Refuses forbidden constructs on the composed tree before constructing anything."""

    def construct_document(self, node: Any) -> Any:
        _check_nodes(node)
        base: Any = super()
        return base.construct_document(node)


def _loader() -> YAML:
    y = make_yaml()
    y.Constructor = _CheckedConstructor
    return y


def load_rt(text: str, *, path: str | None = None) -> Any:
    """Parse YAML text into round-trip data; a clear :class:`UnitFormatError` on any fault."""
    if _flow_depth(text) > MAX_FLOW_DEPTH:
        raise UnitFormatError(f"YAML document is nested more than {MAX_FLOW_DEPTH} levels deep",
                              path=path, code="yaml_forbidden_construct")
    if _too_many_nodes(text):
        raise UnitFormatError("YAML document is too large", path=path,
                              code="yaml_forbidden_construct")
    try:
        loader: Any = _loader()
        return loader.load(text)
    except UnitFormatError as exc:  # raised by the node check, which does not know the path
        raise UnitFormatError(exc.message, path=path, code=exc.code) from None
    except RecursionError:
        # the composer recurses once per nesting level: a deeply nested document is a bomb
        raise UnitFormatError("YAML document is nested too deeply", path=path,
                              code="yaml_forbidden_construct") from None
    except MarkedYAMLError as exc:
        err: Any = exc
        mark: Any = err.problem_mark or err.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = str(err.problem or err.context or "malformed YAML")
        raise UnitFormatError(f"malformed YAML: {problem}{where}", path=path,
                              code="front_matter_malformed") from None
    except (YAMLError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnitFormatError(f"malformed YAML: {first}", path=path,
                              code="front_matter_malformed") from None


def to_plain(value: Any) -> Any:
    """Round-trip containers → plain dicts, lists and str (for pydantic)."""
    if isinstance(value, dict):
        return {_key(k): to_plain(v) for k, v in cast(dict[Any, Any], value).items()}
    if isinstance(value, list):
        return [to_plain(v) for v in cast(list[Any], value)]
    if isinstance(value, str):
        return str(value)
    return value


def _key(key: Any) -> str:
    # Keys in our files are always names or codes; a code such as 01 or 1 is meant as text.
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)
