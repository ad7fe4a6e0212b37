"""A UI backfill of every source partition against the CLI (issue 27 item 3).

    python bench/dagster_backfill.py                 # table + bench/results/dagster_backfill.json
    python bench/dagster_backfill.py --code /other/checkout   # the same against another checkout

On a fresh demo workspace (54 notes, all prepared: every partition unchanged) a
``dagster-webserver`` and a ``dagster-daemon`` serve the code location of ``--code`` (default:
this checkout) with the repository's ``dagster.yaml`` (the run queue and pools of a local
install). The backfill is launched as the UI launches it (GraphQL ``launchPartitionBackfill``:
the four per-source assets, every partition) and timed until its last run has ended (every
partition shown materialized) and until the daemon marks the backfill finished; the runs it
made and their own start→end are counted. The CLI figure is ``tht evidence prepare`` (no-op)
in a fresh process, as the issue compares them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, arguments, log, machine, table, write_json

sys.path.insert(0, str(REPO))
from dagster_launches import serving

BIN = Path(sys.executable).parent
STAGES = ("source_file", "normalized_source", "restructured_units", "validated_units")
LAUNCH = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}"""
DONE = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def backfill(port: int, home: Path, keys: list[str], timeout_s: float) -> dict[str, Any]:
    """Launch the backfill through GraphQL; wait for it and its runs; its figures."""
    import dagster as dg
    import requests

    params = {"assetSelection": [{"path": [s]} for s in STAGES], "partitionNames": keys,
              "fromFailure": False}
    t = time.perf_counter()
    launched_at = time.time()
    reply = requests.post(f"http://127.0.0.1:{port}/graphql", timeout=60,
                          json={"query": LAUNCH, "variables": {"params": params}}).json()
    answer = reply["data"]["launchPartitionBackfill"]
    if answer["__typename"] != "LaunchBackfillSuccess":
        raise RuntimeError(f"backfill refused: {answer}")
    backfill_id = answer["backfillId"]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        while True:
            if time.perf_counter() - t > timeout_s:
                raise RuntimeError(f"backfill {backfill_id} not done after {timeout_s} s")
            status = instance.get_backfill(backfill_id).status.value  # type: ignore[union-attr]
            runs = instance.get_run_records(
                dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
            if status in DONE and all(r.dagster_run.is_finished for r in runs):
                break
            time.sleep(0.5)
        wall = time.perf_counter() - t
        run_s = [r.end_time - r.start_time for r in runs if r.start_time and r.end_time]
        # what the UI shows as done: every partition materialized once the last run ended
        # (the backfill's own status follows at the daemon's next iteration)
        to_runs_end = max((r.end_time for r in runs if r.end_time), default=launched_at) \
            - launched_at
        ok = sum(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        filled = {s: len(instance.get_materialized_partitions(dg.AssetKey(s)) & set(keys))
                  for s in STAGES}
    return {"status": status, "wall_s": round(wall, 1),
            "launch_to_runs_end_s": round(to_runs_end, 1), "runs": len(runs),
            "runs_succeeded": ok, "run_s_total": round(sum(run_s), 1),
            "run_s_max": round(max(run_s, default=0.0), 1), "partitions": len(keys),
            "filled": filled}


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--code", type=Path, default=REPO,
                        help="checkout whose code location serves (default: this one)")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    import dagster as dg

    from evidence_pipeline.demo import create_demo_repo
    from evidence_pipeline.orchestration.partitions import sync_source_partitions

    code = args.code.resolve()
    info = machine()
    tmp = Path(tempfile.mkdtemp(prefix="tht-backfill-"))
    ws = create_demo_repo(tmp / "ws")
    home = tmp / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        sync_source_partitions(instance, ws / "evidence")
        keys = sorted(instance.get_dynamic_partitions("evidence_sources"))
    env = {**os.environ, "DAGSTER_HOME": str(home), "THT_WORKSPACE": str(ws),
           "PYTHONPATH": str(code)}
    t = time.perf_counter()
    subprocess.run([str(BIN / "tht"), "evidence", "prepare", str(ws)], check=True,
                   capture_output=True, env={k: v for k, v in env.items()
                                             if k != "DAGSTER_HOME"})
    cli_s = round(time.perf_counter() - t, 2)
    logs = tmp / "logs"
    logs.mkdir()
    with serving(home, ws, logs, daemon=True, code=code, wait_s=300) as port:
        log(f"backfill of {len(keys)} partitions ({code})")
        ui = backfill(port, home, keys, args.timeout)
    result = {"machine": info, "code": str(code), "cli_prepare_noop_s": cli_s, "ui": ui}
    write_json("dagster_backfill.json", result)
    if args.json:
        print(json.dumps(result))
    else:
        print(table(("what", "value"), [
            ("partitions", ui["partitions"]), ("backfill status", ui["status"]),
            ("UI backfill, launch → backfill finished (s)", ui["wall_s"]),
            ("UI backfill, launch → last run ended (s)", ui["launch_to_runs_end_s"]),
            ("runs (succeeded)", f"{ui['runs']} ({ui['runs_succeeded']})"),
            ("runs' own start→end, total (s)", ui["run_s_total"]),
            ("partitions filled per asset", json.dumps(ui["filled"])),
            ("CLI prepare, no-op (s)", cli_s)],
            title=f"code {code}; load at start {info['load_avg_1m_at_start']}"))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
