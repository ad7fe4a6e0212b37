"""Curated files: Markdown with a YAML front matter holding the whole unit contract (reading).

``read_curated`` → edit ``doc.front`` in place → the pipeline's ``dump_curated``
(``evidence_pipeline.formats.curated_writer``) changes only the edited lines; a load/save
round trip is byte-identical for files in the house style.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from evidence_runtime.errors import UnitFormatError
from evidence_runtime.units import EvidenceKind, UnitBase, parse_unit
from evidence_runtime.yamlio import load_rt, to_plain

DELIMITER = "---"
MAX_CURATED_BYTES = 1_000_000


@dataclass
class CuratedDocument:
    """One curated file: round-trip front matter plus the Markdown body."""

    front: Any
    body: str
    path: str | None = None
    front_text: str | None = None  # the front matter as read (comments included), if read

    def data(self) -> dict[str, Any]:
        """The front matter as plain data."""
        return to_plain(self.front)

    def unit(self) -> UnitBase:
        """The validated unit; raises ``pydantic.ValidationError``."""
        return parse_unit(self.data())

    @property
    def evidence_id(self) -> str | None:
        front: Any = self.front
        value = cast(dict[str, Any], front).get("id") if isinstance(front, dict) else None
        return value if isinstance(value, str) else None


def decode_text(raw: bytes, *, path: str | None = None) -> str:
    """Strict UTF-8 without BOM or NUL bytes, LF line endings expected but not required."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise UnitFormatError("file starts with a UTF-8 byte order mark (BOM)", path=path,
                              code="encoding_invalid")
    if b"\x00" in raw:
        raise UnitFormatError("file contains NUL bytes", path=path, code="encoding_invalid")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnitFormatError(
            f"not valid UTF-8 (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})", path=path,
            code="encoding_invalid",
        ) from None


def split_front_matter(text: str, *, path: str | None = None) -> tuple[str, str]:
    """Split ``---\\n<yaml>---\\n<body>`` into its YAML and body texts."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip("\r\n") != DELIMITER:
        raise UnitFormatError("missing front matter: the file must start with a '---' line",
                              path=path, code="front_matter_missing")
    for i in range(1, len(lines)):
        if lines[i].rstrip("\r\n") == DELIMITER:
            return "".join(lines[1:i]), "".join(lines[i + 1:])
    raise UnitFormatError("front matter is not closed by a '---' line", path=path,
                          code="front_matter_missing")


def parse_curated(text: str, *, path: str | None = None) -> CuratedDocument:
    """Parse a curated file's text; :class:`UnitFormatError` for structural faults only."""
    yaml_text, body = split_front_matter(text, path=path)
    front = load_rt(yaml_text, path=path)
    if not isinstance(front, dict):
        raise UnitFormatError("front matter must be a YAML mapping", path=path,
                              code="front_matter_malformed")
    return CuratedDocument(front=front, body=body, path=path, front_text=yaml_text)


def read_curated(file: Path, *, display_path: str | None = None) -> CuratedDocument:
    """Read and parse one curated file from disk."""
    shown = display_path or str(file)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise UnitFormatError(f"cannot read file: {exc.strerror}", path=shown) from None
    return parse_curated(curated_text(raw, path=shown), path=shown)


def curated_text(raw: bytes, *, path: str | None = None) -> str:
    """The text of a curated file's bytes: at most :data:`MAX_CURATED_BYTES`, strict UTF-8
    (:func:`decode_text`); :class:`UnitFormatError` otherwise. The byte rules of a curated file,
    which validate applies on reading and authoring applies to a batch before writing it."""
    if len(raw) > MAX_CURATED_BYTES:
        raise UnitFormatError(f"file is larger than {MAX_CURATED_BYTES} bytes", path=path)
    return decode_text(raw, path=path)


def validation_messages(exc: ValidationError) -> list[tuple[str, str]]:
    """(field path, message) pairs of a pydantic error, with dotted field paths."""
    out: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err["loc"]]
        # the discriminated union adds the kind tag as the first element; drop it
        if len(loc) > 1 and loc[0] in _KINDS:
            loc = loc[1:]
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg.removeprefix("Value error, ")
        out.append((".".join(loc), msg))
    return out


_KINDS = frozenset(k.value for k in EvidenceKind)
