"""pytest plugin of ``bench/suite_cpu.py``: each test's CPU seconds (setup, call and teardown),
the worker's own and that of the processes it waited for, with the worker's name and when the
test ended, one JSON line a test in ``$SUITE_CPU_OUT`` (appended to by every worker)."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator
from typing import Any

import pytest


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + waited.ru_utime, own.ru_stime + waited.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, Any, Any]:
    user, system = _cpu()
    started = time.monotonic()
    try:
        return (yield)
    finally:
        user_after, system_after = _cpu()
        line = json.dumps({"id": item.nodeid, "user_s": user_after - user,
                           "sys_s": system_after - system,
                           "wall_s": time.monotonic() - started,
                           "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                           "ended": time.time()})
        with open(os.environ["SUITE_CPU_OUT"], "a", encoding="utf-8") as out:
            out.write(line + "\n")  # one short write: lines of the workers do not interleave
