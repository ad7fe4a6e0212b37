"""The Dagster UI as operators use it: ``dagster-webserver`` and ``dagster-daemon`` on the demo
workspace, a backfill launched through the UI's GraphQL API and run by the daemon's queue, and the
pages (asset graph, partitions, backfill) rendered by headless Chromium.

Apart from ``test_dagster.py`` so that another xdist worker runs it beside the rest of the Dagster
tests: the servers' start and the backfill take a while, most of it waiting.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from evidence_pipeline.demo import create_demo_repo
from evidence_pipeline.orchestration.partitions import sync_source_partitions
from tests.helpers import chromium, dagster_home, free_port, wait_for_webserver
from tests.test_dagster import UNCHANGED, partition_status

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ARTIFACTS = ROOT / "tests" / "artifacts"

# The daemon's backfill loop runs every 30 s (dagster._daemon.controller, not configurable): the
# backfill's runs are submitted on one pass and the backfill marked done on a later one, so the
# fixture waited out up to two of those intervals doing nothing. The test's daemon runs the same
# loop every 2 s; the queue is polled every second (run_queue.dequeue_interval_seconds).
DAEMON = ("import sys\n"
          "import dagster._daemon.controller as controller\n"
          "controller.DEFAULT_DAEMON_INTERVAL_SECONDS = 2\n"
          "from dagster._daemon.cli import main\n"
          "sys.argv[0] = 'dagster-daemon'\n"
          "sys.exit(main())\n")
POLLING = "\nrun_queue:\n  dequeue_interval_seconds: 1\n"


STAGES = ("source_file", "normalized_source", "restructured_units", "validated_units")
GROUPS = {
    "authoring": ["source_file", "normalized_source", "restructured_units", "validated_units",
                  "applied_batch", "curated_corpus"],
    "publishing": ["published_corpus", "evidence_fragments", "fragment_embeddings",
                   "candidate_generation", "generation_evaluation", "active_generation"],
    "monitoring": ["active_index_evaluation"],
}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1600,1000",
                  "--virtual-time-budget=30000"]


def _page_text(dom: str) -> str:
    dom = re.sub(r"<(style|script)[^>]*>.*?</\1>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


def _shown(name: str, text: str) -> bool:
    """The name is on the page, whole or middle-truncated by a narrow graph node (a…b)."""
    if name in text:
        return True
    return any(name.startswith(a) and name.endswith(b)
               for a, b in re.findall(r"(\w+)…(\w+)", text))


def _post(url: str, query: str) -> None:
    request = urllib.request.Request(url, data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).read()


def _gql(base: str, query: str, variables: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        f"{base}/graphql", data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"})
    document = json.loads(urllib.request.urlopen(request, timeout=60).read())
    assert "errors" not in document, document["errors"]
    return document["data"]


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)


def _stop(*processes: subprocess.Popen[bytes]) -> None:
    """Terminate all, then wait for each: they shut down side by side."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@dataclasses.dataclass(frozen=True)
class Ui:
    """A webserver and a daemon on one workspace; the backfill they ran and its status."""

    base: str
    home: Path
    tmp: Path
    backfill_id: str
    backfill_status: str
    keys: list[str]


BACKFILLED = [UNCHANGED, "source/20-enum/esito-ps.md", "source/00-glossario/drg.md"]
LAUNCH_BACKFILL = """mutation($p: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $p) {
    __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
BACKFILL_STATUS = """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
  ... on PartitionBackfill { status } } }"""


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    """``dagster-webserver`` and ``dagster-daemon`` (this repository's dagster.yaml: the queue and
    its pools) on the demo workspace cut down to three sources, all unchanged; the daemon has
    run a backfill of the four per-source stages over the three, as the UI launches it (one run
    for all three: the stages' single-run backfill policy).
    """
    tmp = tmp_path_factory.mktemp("ui")
    ws = create_demo_repo(tmp / "ws")
    for note in (ws / "evidence" / "source").rglob("*"):
        if note.is_file() and note.relative_to(ws / "evidence").as_posix() not in BACKFILLED:
            note.unlink()  # not committed: the three left are unchanged against the manifest
    home = dagster_home(tmp)
    with (home / "dagster.yaml").open("a", encoding="utf-8") as f:
        f.write(POLLING)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        sync_source_partitions(instance, ws / "evidence")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DAGSTER_HOME": str(home), "THT_WORKSPACE": str(ws)}
    server = _start([str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1",
                     "-p", str(port)], env, tmp / "webserver.log")
    daemon = _start([sys.executable, "-c", DAEMON, "run", "-w", "workspace.yaml"], env,
                    tmp / "daemon.log")
    try:
        wait_for_webserver(base, server, tmp / "webserver.log", 120)
        _post(f"{base}/graphql", "mutation { setNuxSeen }")  # no welcome dialog over the graph
        launched = _gql(base, LAUNCH_BACKFILL, {"p": {
            "partitionNames": BACKFILLED,
            "assetSelection": [{"path": [stage]} for stage in STAGES]}})
        backfill_id = launched["launchPartitionBackfill"]["backfillId"]
        deadline = time.monotonic() + 420
        while True:
            status = _gql(base, BACKFILL_STATUS, {"id": backfill_id})[
                "partitionBackfillOrError"]["status"]
            if status not in ("REQUESTED", "CANCELING", "FAILING"):
                break
            assert daemon.poll() is None, (tmp / "daemon.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"the backfill is still {status} after 420 s"
            time.sleep(1)
        yield Ui(base, home, tmp, backfill_id, status, BACKFILLED)
    finally:
        _stop(daemon, server)


@pytest.mark.slow
def test_a_backfill_of_unchanged_sources_ends_green(ui: Ui) -> None:
    # before: no materialization, and the backfill ended COMPLETED_FAILED ("3/3 failed")
    assert ui.backfill_status == "COMPLETED_SUCCESS"
    with dg.DagsterInstance.from_config(str(ui.home)) as instance:
        # every stage filled (before: source_file only, the others "1% filled")
        for stage in STAGES:
            assert partition_status(instance, stage) == dict.fromkeys(ui.keys,
                                                                      "MATERIALIZED"), stage
        # one run for the three sources (before: one run each, ~5.6 s of overhead apiece)
        (run,) = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": ui.backfill_id}))
        assert run.status == dg.DagsterRunStatus.SUCCESS
        steps = {e.step_key for e in instance.all_logs(run.run_id)
                 if e.is_dagster_event and e.dagster_event.is_step_success}
        assert steps == {"source_stages"}


def _render(ui: Ui, path: str, name: str) -> str:
    """The page's text as headless Chromium renders it (a screenshot under tests/artifacts)."""
    try:
        ARTIFACTS.mkdir(exist_ok=True)
        shots = ARTIFACTS
    except OSError:
        shots = ui.tmp
    shot = shots / f"dagster-{name}.png"
    proc = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={ui.tmp / f'chromium-{name}'}",
         f"--screenshot={shot}", "--dump-dom", f"{ui.base}{path}"],
        capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.is_file() and shot.stat().st_size > 10_000
    return _page_text(proc.stdout)


@pytest.mark.browser
@pytest.mark.slow
def test_an_unchanged_backfill_shows_materialized_partitions_in_chromium(ui: Ui) -> None:
    text = _render(ui, "/assets/source_file?view=partitions", "source-file-partitions")
    assert "3 Partitions" in text, text[:2000]
    # before: "Materialized (0) Materializing (0) Missing (3)"
    assert "Failed (0) Materialized (3) Materializing (0) Missing (0)" in text, text[:2000]
    for key in ui.keys:
        assert key in text
    backfill = _render(ui, f"/runs/b/{ui.backfill_id}?tab=partitions", "unchanged-backfill")
    assert "Status Succeeded" in backfill, backfill[:2000]


@pytest.mark.browser
@pytest.mark.slow
def test_the_asset_graph_renders_in_headless_chromium(ui: Ui) -> None:
    for group, names in GROUPS.items():
        text = _render(ui, f"/locations/thoth_evidence/asset-groups/{group}",
                       f"asset-graph-{group}")
        assert f"Asset groups | {group}" in text
        missing = [n for n in names if not _shown(n, text)]
        assert not missing, f"{group}: {missing} not on the page: {text[:2000]}"
