"""What operators do from the Dagster UI: activate a revision.

Every expected refusal (an :class:`EvidenceError`: nothing activated, a dirty tree, an unknown
revision, a busy publisher, a locked index, a refused batch …) leaves a step as a
:class:`Refusal` — a ``dg.Failure`` with a one-line description and the error's code, path and
problems as metadata — instead of a Python traceback (:func:`refusals`). The CLI, which runs the
same jobs in-process, gets the original error back (``Refusal.error``).
"""

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import dagster as dg
from pydantic import Field

from evidence_pipeline.orchestration.metadata import problems_table
from evidence_pipeline.orchestration.progress import tell
from evidence_pipeline.orchestration.resources import WorkspaceResource
from evidence_pipeline.publishing.publish import ActivationResult, activate
from evidence_runtime.errors import EvidenceError

F = TypeVar("F", bound=Callable[..., Any])


class Refusal(dg.Failure):
    """An expected refusal as Dagster shows it: one line, the code and where, no traceback."""

    def __init__(self, error: EvidenceError) -> None:
        metadata: dict[str, Any] = {"code": error.code}
        for name in ("path", "evidence_id", "field"):
            value = getattr(error, name, None)
            if value:
                metadata[name] = str(value)
        problems = getattr(error, "problems", None)
        if problems:
            metadata["problems"] = dg.MetadataValue.md(problems_table(problems))
        super().__init__(description=" ".join(f"{error.code}: {error}".split()),
                         metadata=metadata, allow_retries=False)
        self.error = error


def refusals(fn: F) -> F:
    """Decorate an op or asset body: an :class:`EvidenceError` it raises leaves the step as a
    :class:`Refusal` (goes under ``@dg.asset``/``@dg.op``; generators are kept generators)."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def generator(*args: Any, **kwargs: Any) -> Iterator[Any]:
            try:
                yield from fn(*args, **kwargs)
            except EvidenceError as exc:
                raise Refusal(exc) from None

        return generator  # type: ignore[return-value]

    @functools.wraps(fn)
    def plain(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EvidenceError as exc:
            raise Refusal(exc) from None

    return plain  # type: ignore[return-value]


# --- activate ------------------------------------------------------------------------------------


class ActivateConfig(dg.Config):
    """Options of an activation (``tht workspace activate``)."""

    revision: str | None = Field(
        default=None, description="The Git revision to activate (a commit, tag or branch). "
                                  "Default: HEAD, which needs a clean work tree.")


@dg.op(out=dg.Out(ActivationResult), pool="index")
@refusals
def activate_revision(context: dg.OpExecutionContext, config: ActivateConfig,
                      workspace: WorkspaceResource) -> dg.Output[ActivationResult]:
    """Record the revision to publish; a retained generation of it becomes active at once."""
    result = activate(workspace.load(), revision=config.revision)
    again = result.reactivated_generation
    tell(context, f"revision {result.revision[:12]} activated; " + (
        f"generation {again} is active again (no publishing needed)" if again is not None
        else "activated_revision_sensor publishes it (or run the publish job)"))
    return dg.Output(result, metadata={
        "revision": result.revision,
        "reactivated_generation": dg.MetadataValue.int(again) if again is not None else "none"})


@dg.job(name="activate",
        description="tht workspace activate: record the revision to publish (config: revision; "
                    "default HEAD of a clean tree). A retained generation of it is reactivated "
                    "at once; otherwise activated_revision_sensor launches publish.",
        tags={"tht/trigger": "operator"})
def activate_job() -> None:
    activate_revision()
