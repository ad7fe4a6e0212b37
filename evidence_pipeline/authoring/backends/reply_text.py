"""A model's reply is text that round-trips: strict UTF-8 in, and no character that stands for
bytes lost on the way (issue 14, item 11).

Invalid UTF-8 is refused rather than decoded with U+FFFD; a U+FFFD that the source does not hold
(a server or the Pi CLI replaced invalid bytes before us) and a lone surrogate (a ``\\udc80``
JSON escape, which no file can hold) are refused too. Both backends use these checks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from evidence_pipeline.authoring.backends.base import (
    ModelBackendError,
    ModelReply,
    ModelRequest,
    parse_reply,
)
from evidence_pipeline.validation.credentials import walk_strings

REPLACEMENT = "\ufffd"
MAX_REPLY_BYTES = 8_000_000  # the most either backend reads of one model answer
_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_reply(data: bytes, *, path: str, what: str) -> str:
    """``data`` as UTF-8, or :class:`ModelBackendError` (``model_invalid_output``) naming the
    first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start:exc.end].hex(" ")
        raise ModelBackendError(
            f"{what} is not valid UTF-8 (byte(s) {bad} at offset {exc.start}); refused rather "
            "than written with replacement characters", code="model_invalid_output",
            path=path) from None


def check_reply_size(size: int, what: str, *, path: str) -> None:
    """Refuse an answer (or the part read so far) of more than :data:`MAX_REPLY_BYTES`;
    ``what`` says who sent it."""
    if size > MAX_REPLY_BYTES:
        raise ModelBackendError(f"{what} more than {MAX_REPLY_BYTES} bytes",
                                code="model_invalid_output", path=path)


def read_reply(text: str, request: ModelRequest) -> ModelReply:
    """A model's answer text as a checked reply: :func:`parse_reply`, then
    :func:`check_reply_text`."""
    return check_reply_text(parse_reply(text, request), request)


def check_reply_text(reply: ModelReply, request: ModelRequest) -> ModelReply:
    """The reply, if none of its strings holds a lone surrogate, or a U+FFFD the source lacks."""
    source_has_replacement = REPLACEMENT in request.normalized_text
    for field, text in _reply_strings(reply):
        if _SURROGATE.search(text):
            raise ModelBackendError(
                f"{field} holds a lone UTF-16 surrogate (an escape of invalid text); refused",
                code="model_invalid_output", path=request.source_file, field=field)
        if REPLACEMENT in text and not source_has_replacement:
            raise ModelBackendError(
                f"{field} holds U+FFFD, the replacement character for bytes that were not valid "
                "UTF-8 somewhere between the model and here, and the source has none; refused",
                code="model_invalid_output", path=request.source_file, field=field)
    return reply


def _reply_strings(reply: ModelReply) -> Iterator[tuple[str, str]]:
    for i, unit in enumerate(reply.units):
        for field, text in walk_strings(unit.data):
            yield f"units[{i}].{field}", text
        yield f"units[{i}].body", unit.body
    for i, cand in enumerate(reply.retirement_candidates):
        yield f"retirement_candidates[{i}].message", cand.message
