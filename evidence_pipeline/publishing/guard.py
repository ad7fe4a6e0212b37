"""What every publishing stage shares: :class:`PublishError`, the publish lock, the registry
opener and the fault-injection steps.

One publisher per workspace state at a time (:func:`publish_lock`: an ``flock`` on
``<state>/publish.lock``, released by the kernel when its process dies, so a dead publisher never
leaves a stale lock; the embedded shard's own lock works the same way).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

from evidence_pipeline.lock import exclusive_lock
from evidence_pipeline.publishing.registry_writer import RegistryWriter
from evidence_pipeline.state import ensure_state_dir
from evidence_pipeline.validation.problems import Problem
from evidence_runtime.errors import EvidenceError, RegistryError
from evidence_runtime.workspace import Workspace

# Fault injection (tests only): THT_FAULT_PUBLISH_STEP=<step> kills this process with SIGKILL
# when it reaches <step>, as an OOM kill or a power cut would. The steps, in order:
# upload_batch (between two batches of the upload: half of the points are in the index),
# after_upload, during_verification, after_evaluation (recorded, not yet active),
# after_activation (before retention), during_retention (a generation marked as no longer
# retained, its points not yet deleted).
FAULT_ENV = "THT_FAULT_PUBLISH_STEP"


class PublishError(EvidenceError):
    """Publication refused or failed; the previous generation stays active."""

    code = "publish_failed"

    def __init__(self, message: str, problems: list[Problem] | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.problems = problems or []


class PublishBusyError(PublishError):
    code = "publish_busy"


Progress = Callable[[str], None]


def named_problems(problems: list[Problem], shown: int = 3) -> str:
    """The first problems as ``code (path, unit, field)``: the error line names them."""
    parts = []
    for p in problems[:shown]:
        where = ", ".join(x for x in (p.path, p.evidence_id, p.field) if x)
        parts.append(f"{p.code} ({where})" if where else p.code)
    more = f" and {len(problems) - shown} more" if len(problems) > shown else ""
    return "; ".join(parts) + more


def fault_step(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def open_registry(ws: Workspace) -> RegistryWriter:
    try:
        ensure_state_dir(ws.state_dir)
    except OSError as exc:  # e.g. a read-only or full disk: one clear line, not a traceback
        raise RegistryError(f"cannot create the state directory: {exc.strerror}",
                            path=str(ws.state_dir)) from None
    return RegistryWriter.open(ws.registry_url)


@contextlib.contextmanager
def publish_lock(ws: Workspace) -> Iterator[None]:
    """Hold the workspace's publish lock, or refuse at once with :class:`PublishBusyError`.

    An ``flock`` on ``<state>/publish.lock`` (released by the kernel when the process dies),
    reentrant within a process so that ``preprocess`` can hold it around the stages that take
    it too. It keeps two publishers from interleaving on any engine (the embedded shard is
    exclusive anyway; a Qdrant server is not).
    """
    try:
        ensure_state_dir(ws.state_dir)
    except OSError as exc:
        raise PublishError(f"cannot create the state directory: {exc.strerror}",
                           path=str(ws.state_dir)) from None

    def busy(holder: str) -> PublishBusyError:
        return PublishBusyError(f"another publication is running on this workspace ({holder}); "
                                "refused, try again when it has finished", path=str(ws.root))

    with exclusive_lock(ws.state_dir / "publish.lock", holder="preprocess evidence", busy=busy,
                        reentrant=True):
        yield
