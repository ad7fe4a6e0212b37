"""Short maintenance windows of the embedded engine are invisible to searchers (issue 17 item 8).

A Qdrant Edge shard is open in one process at a time. An open now waits up to
``index.lock_wait_s`` (default 5 s) while another process holds the shard, and says how long it
waited when it gives up; the nightly evaluation (and ``tht evidence evaluate``) query a private
copy of the shard, so they hold it only while it is copied. Measured with
bench/maintenance_window.py: searches in another process while the evaluate_active job runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evidence_pipeline.publishing.evaluate import evaluation_index
from evidence_runtime.errors import IndexLockedError
from evidence_runtime.index import EdgeIndex, IndexConfig
from evidence_runtime.index.edge import DEFAULT_LOCK_WAIT_S, copy_sparse
from evidence_runtime.search import EvidenceSearcher, index_config
from evidence_runtime.workspace import load_workspace
from tests.helpers import ROOT, PublishedDemo, copy_workspace, edit
from tests.index_fixtures import create_dense_only_shard

HOLD = """import sys, time
from evidence_runtime.index import EdgeIndex
with EdgeIndex.open(sys.argv[1]):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold(shard: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process that holds the shard for ``seconds`` (returns once it holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(shard), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    path = tmp_path / "index"
    create_dense_only_shard(path, dense_dim=4)
    return path


def test_an_open_waits_while_another_process_holds_the_shard(shard: Path) -> None:
    holder = hold(shard, 1.0)
    started = time.monotonic()
    with EdgeIndex.open(shard, lock_wait_s=DEFAULT_LOCK_WAIT_S) as index:
        waited = time.monotonic() - started
        assert index.count({}) == 0
    holder.wait(timeout=30)
    assert 0.3 < waited < DEFAULT_LOCK_WAIT_S  # it waited for the holder, not for the maximum


def test_the_wait_has_a_stated_maximum(shard: Path) -> None:
    holder = hold(shard, 20.0)
    try:
        started = time.monotonic()
        with pytest.raises(IndexLockedError) as raised:
            EdgeIndex.open(shard, lock_wait_s=0.5)
        waited = time.monotonic() - started
        assert "still after waiting 0.5 s (index.lock_wait_s)" in raised.value.message
        assert 0.5 <= waited < 5
        started = time.monotonic()
        with pytest.raises(IndexLockedError) as at_once:
            EdgeIndex.open(shard)  # 0: refused at once, as before
        assert time.monotonic() - started < 0.5
        assert "waiting" not in at_once.value.message
    finally:
        holder.kill()
        holder.wait()


def test_thoth_yaml_sets_the_wait(demo_ws: Path) -> None:
    assert index_config(load_workspace(demo_ws)).lock_wait_s == DEFAULT_LOCK_WAIT_S == 5.0
    edit(demo_ws / "thoth.yaml", "  engine: edge\n", "  engine: edge\n  lock_wait_s: 0.25\n")
    assert index_config(load_workspace(demo_ws)).lock_wait_s == 0.25
    assert IndexConfig.of({"engine": "edge", "path": "x", "lock_wait_s": 2}).lock_wait_s == 2


@pytest.fixture
def published(published_demo: PublishedDemo, tmp_path: Path) -> Path:
    return copy_workspace(published_demo.ws, tmp_path / "ws")


def test_a_search_waits_out_a_short_hold_and_answers(published: Path, e5: object) -> None:
    ws = load_workspace(published)
    holder = hold(ws.index_path, 1.0)
    with EvidenceSearcher.for_workspace(ws, embedder=e5) as searcher:  # type: ignore[arg-type]
        outcome = searcher.search("Quali pazienti sono minorenni?", "sql_generation")
    holder.wait(timeout=30)
    assert outcome.status == "available" and outcome.results


def test_the_evaluation_reads_a_copy_and_leaves_the_shard_free(published: Path) -> None:
    ws = load_workspace(published)
    cfg = index_config(ws)
    with evaluation_index(ws, cfg) as where:
        assert where.path != cfg.path and Path(where.path or "").is_dir()
        # while the evaluation reads its copy, another process opens the shard at once
        other = subprocess.run([sys.executable, "-c", HOLD, str(ws.index_path), "0"],
                               capture_output=True, text=True, timeout=60, check=False)
        assert other.returncode == 0, other.stderr
        copy = Path(where.path or "")
        # the same bytes, and the shard's holes stay holes (250 MB apparent, 1.4 MB written)
        files = sorted(p.relative_to(ws.index_path) for p in ws.index_path.rglob("*")
                       if p.is_file())
        assert files and files == sorted(p.relative_to(copy) for p in copy.rglob("*")
                                         if p.is_file())
        assert all((copy / f).read_bytes() == (ws.index_path / f).read_bytes() for f in files)
        apparent, written = (sum(getattr((root / f).stat(), attr) for f in files)
                             for root, attr in ((copy, "st_size"), (copy, "st_blocks")))
        assert written * 512 < apparent / 20, (written * 512, apparent)
    assert not copy.exists()  # the copy is removed


def test_a_sparse_copy_writes_only_the_data_of_a_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    paged = src / "page_0.dat"
    with paged.open("wb") as fh:  # data, a hole, data, a trailing hole
        fh.write(b"head")
        fh.seek(8 << 20)
        fh.write(b"middle")
        fh.truncate(32 << 20)
    (src / "small").write_bytes(b"x" * 10)
    (src / "sub" / "empty").write_bytes(b"")
    assert paged.stat().st_blocks * 512 < 1 << 20  # this file system keeps holes
    shutil.copytree(src, tmp_path / "dst", copy_function=copy_sparse)
    for rel in ("page_0.dat", "small", "sub/empty"):
        assert (tmp_path / "dst" / rel).read_bytes() == (src / rel).read_bytes(), rel
    copied = (tmp_path / "dst" / "page_0.dat").stat()
    assert copied.st_size == 32 << 20 and copied.st_blocks * 512 < 1 << 20


@pytest.mark.slow
def test_no_search_fails_during_the_nightly_evaluation(published: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))  # bench/ is not a package
    import maintenance_window

    figures = maintenance_window.run(published, searches=12, pause=0.05, evaluations=1)
    assert figures["searches"] == 12 and figures["searches_during_evaluations"] >= 1
    assert (figures["failed_searches"], figures["failures"]) == (0, [])
    assert (figures["failed_evaluations"], figures["evaluation_failures"]) == (0, [])
