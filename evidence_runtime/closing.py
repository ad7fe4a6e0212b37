"""A base for the runtime's objects that hold a connection or a file: ``with obj:`` closes it."""

from __future__ import annotations

from typing import Self

__all__ = ["Closeable"]


class Closeable:
    """``with obj:`` returns ``obj`` and calls its :meth:`close` on the way out."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError
