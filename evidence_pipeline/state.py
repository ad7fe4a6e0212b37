"""The local state directory (``.tht/`` or ``$THT_STATE_DIR``): created ignored by Git, and a
typed error naming it when it cannot be written.

Its ``.gitignore`` holds ``*``, as pytest and ruff do for their caches: a workspace without a
``.gitignore`` of its own then never shows the state as uncommitted changes, which ``activate``
and ``prepare --upgrade`` would refuse.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from evidence_runtime.errors import ErrorCode, EvidenceError
from evidence_runtime.workspace import STATE_DIR_NAME

GITIGNORE = "# Created by thoth-evidence: local state, never committed.\n*\n"


def ensure_state_dir(path: Path) -> None:
    """Create the state directory (and its parents) if missing, with a ``.gitignore`` of ``*``;
    :class:`EvidenceError` ``state_dir_unwritable`` naming it when that fails
    (read-only, a file in its place, …).

    The ``.gitignore`` is written in a directory created here, or in one named ``.tht`` (made by
    an older version); never in an existing directory that ``THT_STATE_DIR`` names, whose other
    files are not ours.
    """
    try:
        created = not path.is_dir()
        path.mkdir(parents=True, exist_ok=True)
        ignore = path / ".gitignore"
        if (created or path.name == STATE_DIR_NAME) and not os.path.lexists(ignore):
            # written under a private name, then renamed: a kill never leaves an empty
            # .gitignore (which would ignore nothing, and be kept)
            tmp = path / f".gitignore.{os.getpid()}.tmp"
            tmp.write_text(GITIGNORE, encoding="utf-8")
            os.replace(tmp, ignore)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise EvidenceError(f"cannot write the local state directory ({why}); make it a "
                            "writable directory, or set THT_STATE_DIR", path=str(path),
                            code=ErrorCode.state_dir_unwritable) from None


def require_writable_state_dir(path: Path) -> None:
    """:func:`ensure_state_dir`, then prove a file can be created in it (a read-only ``.tht/``
    exists and looks fine until something is written there): ``state_dir_unwritable`` naming
    it otherwise, before any work starts."""
    ensure_state_dir(path)
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise EvidenceError(f"cannot write the local state directory ({why}); make it a "
                            "writable directory, or set THT_STATE_DIR", path=str(path),
                            code=ErrorCode.state_dir_unwritable) from None
