"""How long search stays down when a revision is activated during a backfill (issue 17 item 4).

    python bench/queue_outage.py                       # this checkout's dagster.yaml
    python bench/queue_outage.py --instance old.yaml --sources 10 --json

A real ``dagster-webserver`` and ``dagster-daemon`` (queue, pools, sensors, backfills) on the demo
workspace, its vectors seeded from tests/data/demo-vectors.npz. A backfill of ``source_file`` over
N unchanged sources is launched from the GraphQL API (one run per source, as the UI launches it);
once its first run has started, the demo's revision is activated (``tht workspace activate``).
From then on search answers ``revision_mismatch`` until a generation serves that revision: the
``activated_revision_sensor`` requests ``publish`` (within its 60 s interval) and the queue starts
it when the instance's configuration lets it. The outage window is activation → the publish run's
end; the table splits it into sensor latency, time queued and publish duration, and gives the
backfill's mean run time (what one more queued run costs before the change).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, arguments, log, machine, run_tht, table, write_json
from dagster_launches import serving

BIN = Path(sys.executable).parent
LAUNCH_BACKFILL = """mutation($p: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $p) {
    __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""


def _gql(base: str, query: str, variables: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        f"{base}/graphql", data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"})
    document = json.loads(urllib.request.urlopen(request, timeout=60).read())
    if "errors" in document:
        raise RuntimeError(document["errors"])
    return document["data"]


def _seed_vectors(ws: Path) -> None:
    sys.path.insert(0, str(REPO))
    from tests import demo_vectors

    shipped = demo_vectors.load()
    if shipped is not None:
        (ws / ".tht").mkdir(exist_ok=True)
        shipped.write_into(ws / ".tht" / "vectors.sqlite3")


def main() -> None:
    parser = arguments(__doc__, json_help="the figures as one JSON document on stdout")
    parser.add_argument("--instance", type=Path, default=REPO / "dagster.yaml",
                        help="the dagster.yaml to measure (default: this checkout's)")
    parser.add_argument("--sources", type=int, default=10, help="sources in the backfill")
    parser.add_argument("--keep", action="store_true",
                        help="keep the workspace, instance and logs (path on stderr)")
    args = parser.parse_args()
    import dagster as dg

    from evidence_pipeline.demo import create_demo_repo
    from evidence_pipeline.orchestration.partitions import sync_source_partitions

    info = machine()
    tmp = Path(tempfile.mkdtemp(prefix="tht-outage-"))
    ws = create_demo_repo(tmp / "ws")
    _seed_vectors(ws)
    home = tmp / "home"
    home.mkdir()
    shutil.copy(args.instance, home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "THT_WORKSPACE": str(ws)}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        keys = sync_source_partitions(instance, ws / "evidence")[0][:args.sources]
    with serving(home, ws, tmp, daemon=True) as port:
        base = f"http://127.0.0.1:{port}"
        backfill = _gql(base, LAUNCH_BACKFILL, {"p": {
            "partitionNames": keys, "assetSelection": [{"path": ["source_file"]}]}})
        backfill_id = backfill["launchPartitionBackfill"]["backfillId"]
        log(f"backfill {backfill_id} over {len(keys)} source(s)")
        with dg.DagsterInstance.from_config(str(home)) as instance:
            while not any(r.status != dg.DagsterRunStatus.QUEUED for r in instance.get_runs(
                    dg.RunsFilter(tags={"dagster/backfill": backfill_id}))):
                time.sleep(0.5)
            log("first backfill run started: activating the revision")
            activated = time.time()
            run_tht("workspace", "activate", str(ws), env=env)
            while True:
                publish = instance.get_runs(dg.RunsFilter(job_name="publish"))
                if publish and publish[0].is_finished:
                    break
                time.sleep(1)
            record = instance.get_run_record_by_id(publish[0].run_id)
            assert record is not None and record.start_time and record.end_time
            events = {e.dagster_event.event_type_value: e.timestamp
                      for e in instance.all_logs(publish[0].run_id) if e.dagster_event}
            backfill_runs = [instance.get_run_record_by_id(r.run_id) for r in instance.get_runs(
                dg.RunsFilter(tags={"dagster/backfill": backfill_id}))]
            durations = [r.end_time - r.start_time for r in backfill_runs
                         if r and r.start_time and r.end_time]
            backfill_end = max((r.end_time for r in backfill_runs if r and r.end_time),
                               default=None)
    created = record.create_timestamp.timestamp()
    figures = {
        "instance": str(args.instance), "sources": len(keys),
        "publish_status": publish[0].status.value,
        "sensor_latency_s": round(created - activated, 1),
        # in the queue until the daemon hands it to the launcher, then the run worker's start
        "queued_s": round(events["PIPELINE_STARTING"] - created, 1),
        "run_worker_start_s": round(record.start_time - events["PIPELINE_STARTING"], 1),
        "publish_s": round(record.end_time - record.start_time, 1),
        "outage_s": round(record.end_time - activated, 1),
        "backfill_run_mean_s": round(statistics.mean(durations), 1) if durations else None,
        "backfill_runs_done_when_publish_started": sum(
            1 for r in backfill_runs if r and r.end_time and r.end_time <= record.start_time),
        "backfill_end_after_activation_s": round(backfill_end - activated, 1)
        if backfill_end else None,
    }
    write_json("queue_outage.json", {"machine": info, **figures})
    if args.json:
        print(json.dumps(figures))
    else:
        print(table(("figure", "value"), list(figures.items()),
                    title=f"load at start {info['load_avg_1m_at_start']}"))
    if args.keep:
        log(f"kept: {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
