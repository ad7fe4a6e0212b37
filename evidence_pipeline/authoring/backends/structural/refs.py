"""Recognizable ``schema.table`` and ``schema.table.column`` references of a note."""

from __future__ import annotations

import re
from collections.abc import Iterable

from evidence_pipeline.authoring.backends.structural.text import IDENT, URL, add

_REF = re.compile(rf"(?<![\w.$/@-])({IDENT}(?:\.{IDENT}){{1,2}})(?![\w$(]|\.[A-Za-z0-9_])")
_FILE_EXT = frozenset({"md", "txt", "sql", "yaml", "yml", "json", "csv", "html", "htm", "pdf",
                       "py", "xml", "png", "jpg", "jsp", "php", "it", "org", "com"})
_PLACEHOLDERS = frozenset({"schema", "tabella", "table", "colonna", "column", "tab", "col"})
_COLUMNISH = re.compile(r"_(?:id|ts|date|code|no|type|status|role|name|at|flag)$")


class Refs:
    """The references of one note; tells tables from columns using the whole note."""

    def __init__(self, text: str) -> None:
        found = list(_raw_refs(text))
        self.schemas = {r.split(".")[0] for r in found if r.count(".") == 2}
        self.table_names = {r.split(".")[1] for r in found if r.count(".") >= 1}

    def find(self, text: str) -> tuple[list[str], list[str]]:
        """(tables, columns) referenced in ``text``, in order of appearance, verbatim."""
        tables: list[str] = []
        columns: list[str] = []
        for ref in _raw_refs(text):
            parts = ref.split(".")
            if len(parts) == 3:
                add(columns, ref)
                add(tables, ".".join(parts[:2]))
            elif parts[0] in self.schemas or (
                    not _COLUMNISH.search(parts[1]) and parts[0] not in self.table_names):
                add(tables, ref)
        return tables, columns


def _raw_refs(text: str) -> Iterable[str]:
    text = URL.sub(" ", text)
    for m in _REF.finditer(text):
        ref = m.group(1)
        parts = ref.split(".")
        if parts[-1].lower() in _FILE_EXT or any(len(p) < 2 for p in parts) or \
                parts[0].lower() in _PLACEHOLDERS:
            continue
        yield ref
