"""The private shard copies an evaluation reads (``<state>/.evaluation-*``, issue 17 item 8),
and what is left of them when their process died (issue 28 item 7).

Each copy names its owner in ``owner.json`` (process id and start time): a copy whose owner is
gone is swept by the next evaluation and reported (and removed with ``--repair``) by ``tht
workspace check``. SIGTERM, like SIGINT, unwinds the evaluation so that its copy is removed on
the way out (Python's default for SIGTERM ends the process without running ``finally``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

PREFIX = ".evaluation-"
OWNER_FILE = "owner.json"
# A copy without owner.json is written by its owner within milliseconds of its creation (or
# was left by a version that wrote none): older than this, nobody will claim it.
UNOWNED_GRACE_S = 60.0


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc``), which
    tells a live owner from a new process that got its id; None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the command name may hold spaces
    return fields[19] if len(fields) > 19 else None


def _alive(owner: dict[str, Any]) -> bool:
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    started = owner.get("started")
    return started is None or _start_time(pid) in (None, started)


def stale_copies(state_dir: Path) -> list[Path]:
    """The evaluation copies under ``state_dir`` whose owner is no longer running."""
    stale: list[Path] = []
    for copy in sorted(state_dir.glob(f"{PREFIX}*")):
        if not copy.is_dir() or copy.is_symlink():
            continue
        try:
            owner = json.loads((copy / OWNER_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                if time.time() - copy.stat().st_mtime > UNOWNED_GRACE_S:
                    stale.append(copy)
            continue
        if not isinstance(owner, dict) or not _alive(owner):  # pyright: ignore[reportUnknownArgumentType]
            stale.append(copy)
    return stale


def sweep(state_dir: Path) -> list[Path]:
    """Remove the stale evaluation copies under ``state_dir``; those removed."""
    removed: list[Path] = []
    for copy in stale_copies(state_dir):
        shutil.rmtree(copy, ignore_errors=True)
        if not copy.exists():
            removed.append(copy)
    return removed


@contextlib.contextmanager
def terminate_unwinds() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`SystemExit` (143) in the main thread, so that
    ``finally`` blocks and context managers run, as they do for SIGINT; elsewhere (another
    thread, a handler of the application's own) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        yield  # the application handles SIGTERM itself
        return

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def evaluation_copy(state_dir: Path) -> Iterator[Path]:
    """A new directory for one evaluation's shard copy, owned by this process and removed on
    the way out (SIGTERM and SIGINT included); stale copies of dead owners are swept first."""
    state_dir.mkdir(parents=True, exist_ok=True)
    sweep(state_dir)
    with terminate_unwinds():
        tmp = Path(tempfile.mkdtemp(prefix=PREFIX, dir=state_dir))
        try:
            owner = {"pid": os.getpid(), "started": _start_time(os.getpid())}
            (tmp / OWNER_FILE).write_text(json.dumps(owner), encoding="utf-8")
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
