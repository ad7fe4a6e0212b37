"""Plain helpers shared by the test modules: Git commits and edits, the CLI, workspace copies,
open-file checks and the fault-scenario tables. Fixtures and hooks live in ``conftest.py``."""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner, Result

from evidence_pipeline.cli import main
from evidence_pipeline.demo import create_demo_repo, git
from evidence_pipeline.state import ensure_state_dir
from evidence_pipeline.validation.unit_cache import CACHE_NAME
from evidence_pipeline.validation.validator import validate_workspace
from evidence_runtime.index.edge import copy_sparse
from evidence_runtime.registry import Registry
from evidence_runtime.workspace import STATE_DIR_NAME

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"

# A query no unit can answer: the expected unit is a reference, which never has the purpose
# sql_generation, so the mandatory purpose filter keeps it out of every result list.
FAILING_EVALUATION = """\
queries:
  - id: qx
    text: zorblat quintessa vrenk
    profile: lexical
    purpose: sql_generation
    expected: [evidence:icd10-oms]
"""

# Variables that would point a workspace's state, registry or index elsewhere, or run the CLI
# through Dagster: the suite's workspaces keep everything in their own .tht.
STATE_ENV = ("DAGSTER_HOME", "THT_STATE_DIR", "THT_REGISTRY_URL", "THT_QDRANT_URL",
             "THT_WORKSPACE")


# --------------------------------------------------------------------------- Git and files


def commit(ws: Path, message: str = "test change", *, allow_empty: bool = False) -> str:
    """Stage everything and commit it; the new HEAD. Without ``allow_empty`` a commit with no
    change fails (the edit the test meant to make did not happen)."""
    git(ws, "add", "-A")
    git(ws, "commit", "-q", *(["--allow-empty"] if allow_empty else []), "-m", message)
    return head(ws)


def new_workspace(ws: Path, files: Mapping[str, str] | None = None, *,
                  config: str = "workspace_id: test\nlanguage: italian\n",
                  message: str = "sources") -> Path:
    """A new Git workspace at ``ws``: ``thoth.yaml``, ``.tht`` ignored, ``evidence/source/`` and
    ``files`` (paths relative to ``evidence/``), all committed with ``message``."""
    (ws / "evidence" / "source").mkdir(parents=True)
    (ws / "thoth.yaml").write_text(config, encoding="utf-8")
    (ws / ".gitignore").write_text(".tht/\n", encoding="utf-8")
    for rel, text in (files or {}).items():
        f = ws / "evidence" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text, encoding="utf-8")
    git(ws, "init", "-q")
    commit(ws, message)
    return ws


def edit_demo(ws: Path) -> None:
    """A new revision of the demo: one source edited, one added, committed."""
    edited = sorted((ws / "evidence/source").rglob("*.md"))[0]
    edited.write_text(edited.read_text(encoding="utf-8") + "\nRiga aggiunta in revisione.\n",
                      encoding="utf-8")
    (ws / "evidence/source/99-nuova.md").write_text(
        "# Nota nuova\n\nIl codice reparto 999 indica i reparti dismessi.\n", encoding="utf-8")
    commit(ws, "edit")


def head(ws: Path) -> str:
    return git(ws, "rev-parse", "HEAD").strip()


def edit(file: Path, old: str, new: str) -> None:
    """Replace the one occurrence of ``old`` in ``file``."""
    text = file.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} not found once in {file}"
    file.write_text(text.replace(old, new), encoding="utf-8")


def curated_files(ws: Path, kind: str) -> list[Path]:
    return sorted((ws / "evidence" / "curated" / kind).glob("*.md"))


def cli(*args: str) -> Result:
    """``tht`` in process, stdout and stderr apart."""
    return CliRunner().invoke(main, list(args))


def dagster_home(tmp_path: Path) -> Path:
    """A DAGSTER_HOME under ``tmp_path`` with this repository's dagster.yaml (SQLite storage,
    no telemetry), as the UI's and the CLI's runs use it."""
    home = tmp_path / "dagster-home"
    home.mkdir()
    shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    return home


@functools.cache
def _warm_demo_cache() -> bytes:
    """The demo's units-cache.json after a first validate (once per process)."""
    with tempfile.TemporaryDirectory(prefix="tht-warm-demo-") as tmp:
        seed = create_demo_repo(Path(tmp) / "ws")
        assert validate_workspace(seed).status.value == "publishable"
        return (seed / STATE_DIR_NAME / CACHE_NAME).read_bytes()


def warm_demo(ws: Path) -> Path:
    """Give ``ws``, a fresh demo workspace (``create_demo_repo``), the cache of parsed and
    checked curated files that a first ``validate`` of the demo fills (``units-cache.json`` in
    its .tht, which Git ignores): the tests then start as a curator's second run does.
    Validating the demo's 80 curated files cold (1.2 s against 0.13 s warm) parses their
    round-trip YAML and scans them for credentials again in every test. A file a test changes
    has other bytes, so it is parsed and checked afresh; the cold path keeps its own tests
    (``test_unit_cache``, ``test_hostile``'s changed files, the workspaces made with
    ``create_demo_repo`` alone)."""
    ensure_state_dir(ws / STATE_DIR_NAME)
    (ws / STATE_DIR_NAME / CACHE_NAME).write_bytes(_warm_demo_cache())
    return ws


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_webserver(base: str, process: subprocess.Popen[bytes], log: Path,
                       timeout_s: float) -> None:
    """Return once the Dagster webserver at ``base`` (``http://host:port``) answers
    ``/server_info``; RuntimeError with the tail of ``log`` (the output of ``process``, which
    starts it) if ``process`` exits first or no answer comes within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{base}/server_info", timeout=5).read()
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if process.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    why = (f"its process exited with {process.returncode}" if process.poll() is not None
           else f"no answer in {timeout_s:g} s")
    raise RuntimeError(f"the webserver at {base} did not start ({why}); {log}:\n"
                       + log.read_text(errors="replace")[-5000:])


def copy_workspace(src: Path, dest: Path) -> Path:
    """A private copy of a workspace: the same commits, and its .tht state (registry, Edge shard,
    vector cache, materialized revisions). Far cheaper than publishing again.

    The Edge shard's files are mostly holes (about 1.4 MB used of 250 MB apparent): the
    product's ``copy_sparse`` keeps them holes, as the evaluation's copy of a shard does (the
    published demo: 0.06 s and 4.5 MB a copy; GNU ``cp --sparse=always`` took 0.07 s, a plain
    ``shutil.copytree`` 0.61 s and 254 MB)."""
    return Path(shutil.copytree(src, dest, symlinks=True, copy_function=copy_sparse))


def held_open(root: Path) -> list[str]:
    """Files and directories under ``root`` that this process holds open (Linux ``/proc``).

    The embedded Qdrant Edge shard is locked per process, so a shard a test leaves open would not
    fail that test but a later one, in another process, that opens the same path."""
    fd_dir = Path("/proc/self/fd")
    if not fd_dir.is_dir():
        return []
    prefix = str(root.resolve()) + os.sep
    found = []
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith(prefix):
            found.append(target)
    return sorted(found)


class VectorStore:
    """The session's vector cache: the shipped demo vectors plus whatever the session embedded.

    ``seed`` gives a workspace a copy before it publishes, ``keep`` takes back what it added. The
    cache is content-keyed, so this only saves time: a cold cache gives the same results."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def seed(self, ws: Path) -> None:
        if self.path.is_file():
            (ws / ".tht").mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.path, ws / ".tht" / "vectors.sqlite3")

    def keep(self, ws: Path) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        shutil.copy2(ws / ".tht" / "vectors.sqlite3", tmp)
        tmp.replace(self.path)


@dataclass(frozen=True)
class PublishedDemo:
    """The demo activated and published through the CLI: generation 1 of its first revision.

    Shared by the whole session: read it, never change it; copy it to change state."""

    ws: Path
    revision: str
    activate_stdout: str
    preprocess_json: dict[str, Any]
    preprocess_stderr: str


# --------------------------------------------------------------------------- foreign records

FOREIGN_KINDS = ["schema_table", "schema_column", "memory", "solved_question"]


def foreign_records(count: int = 24, *, dim: int = 384, seed: int = 7,
                    tag: Mapping[str, Any] | None = None,
                    ) -> list[tuple[Any, list[float], dict[str, Any]]]:
    """Schema/Memory records as another system wrote them: dense only, int and UUID ids; every
    third one also carries ``tag`` (e.g. this workspace and a generation number)."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    records: list[tuple[Any, list[float], dict[str, Any]]] = []
    for i in range(count):
        kind = FOREIGN_KINDS[i % len(FOREIGN_KINDS)]
        rid: Any = i + 1 if i % 2 else str(uuid.uuid5(uuid.NAMESPACE_URL, f"foreign-{i}"))
        payload: dict[str, Any] = {"record_kind": kind, "name": f"t{i}"}
        if tag and i % 3 == 0:
            payload |= tag
        records.append((rid, vectors[i].tolist(), payload))
    return records


# --------------------------------------------------------------------------- fault summaries


@dataclass
class Outcome:
    """One fault scenario of a suite: did it pass, and how many bytes of data did it lose."""

    group: str
    name: str
    passed: bool = False
    bytes_lost: int = 0


@dataclass
class FaultSummary:
    """The scenarios of one suite, printed at the end of the run by ``conftest.py``'s
    ``pytest_terminal_summary``; bytes lost in any of them fail the whole run."""

    title: str
    outcomes: list[Outcome]

    @property
    def bytes_lost(self) -> int:
        return sum(o.bytes_lost for o in self.outcomes)

    def lines(self) -> list[str]:
        """Scenarios tried / passed / bytes lost per group, and the total."""
        groups: dict[str, list[Outcome]] = {}
        for o in self.outcomes:
            groups.setdefault(o.group, []).append(o)
        rows = [(g, len(os_), sum(o.passed for o in os_), sum(o.bytes_lost for o in os_))
                for g, os_ in sorted(groups.items())]
        total = ("total", len(self.outcomes), sum(o.passed for o in self.outcomes),
                 self.bytes_lost)
        width = max([len(r[0]) for r in rows] + [len("scenario group"), len(total[0])])
        header = f"{'scenario group':<{width}}  {'tried':>6}  {'passed':>6}  {'bytes lost':>10}"
        lines = [self.title, header, "-" * len(header)]
        lines += [f"{g:<{width}}  {t:>6}  {p:>6}  {lost:>10}" for g, t, p, lost in rows]
        lines += ["-" * len(header), f"{total[0]:<{width}}  {total[1]:>6}  {total[2]:>6}  "
                  f"{total[3]:>10}"]
        if self.bytes_lost:
            lines.append("data lost in: " + ", ".join(o.name for o in self.outcomes
                                                      if o.bytes_lost))
        return lines


SUMMARIES: list[FaultSummary] = []
FIGURES: list[str] = []  # one-line figures a test measured, printed after the run


def print_at_end(line: str) -> None:
    """Show ``line`` in the terminal summary (``conftest.py``), whatever the test order."""
    FIGURES.append(line)


def fault_outcomes(title: str) -> list[Outcome]:
    """The list a fault suite records its scenarios in; its table is printed after the run."""
    summary = FaultSummary(title, [])
    SUMMARIES.append(summary)
    return summary.outcomes


# --------------------------------------------------------------------------- index wrappers


class Delegating:
    """An index that forwards everything to a real one (fault injection overrides a method)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class KeepOpen(Delegating):
    """Keeps an in-process qdrant-client collection alive after ``preprocess`` closes it."""

    def close(self) -> None:
        pass


def chromium() -> str:
    """Debian's Chromium for the browser tests: waits while scripts/test.sh installs it
    (THT_CHROMIUM_PENDING), skips the test where it is not installed."""
    pending = os.environ.get("THT_CHROMIUM_PENDING")  # scripts/test.sh installs it meanwhile
    if pending:
        deadline = time.monotonic() + 600
        while not Path(pending).exists() and time.monotonic() < deadline:
            time.sleep(1)
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        import pytest  # only the tests that need a browser import it through here
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium)")
    return found


def pointers(ws: Path, workspace_id: str = "psd") -> tuple[str | None, int | None]:
    """(activated revision, active generation) as the registry of ``ws``'s own state holds them
    (the demo's workspace id by default)."""
    with Registry.open(ws / STATE_DIR_NAME / "registry.sqlite3") as reg:
        revision, active = reg.active_state(workspace_id)
    return revision, None if active is None else active.number
