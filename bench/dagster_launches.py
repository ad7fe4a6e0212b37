"""Dagster launches as the UI makes them, against the CLI (issue 17 item 3).

    python bench/dagster_launches.py             # table + bench/results/dagster_launches.json
    python bench/dagster_launches.py --repeat 3 --json

On a fresh demo workspace: a no-op ``prepare`` and a one-source ``source_preview`` (a new note,
structural backend) are (a) launched through the GraphQL API of a ``dagster-webserver`` (the
UI's own path: launchRun, the default run launcher starts a run worker, the job's executor runs
the steps), timed from the launch until the run is finished, with the run's own start→end; and
(b) run as the CLI runs them: ``tht evidence prepare`` with ``DAGSTER_HOME`` set
(``execute_in_process``, process start included) and without it (no Dagster), and the preview
job executed in-process in a fresh Python process. The instance has no run queue (the
webserver launches at once, no daemon), so queueing is not part of these figures.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, arguments, log, machine, table, write_json

sys.path.insert(0, str(REPO))
from tests.helpers import free_port, wait_for_webserver

BIN = Path(sys.executable).parent
NOTE = "source/90-prove/codice-asl.md"
NOTE_TEXT = ("# Codice ASL\n\nIl codice ASL identifica l'azienda sanitaria locale di residenza "
             "del paziente.\n")
DAEMONLESS = ("run_coordinator:\n  module: dagster._core.run_coordinator\n"
              "  class: DefaultRunCoordinator\ntelemetry:\n  enabled: false\n")


@contextmanager
def serving(home: Path, ws: Path, logs: Path, *, daemon: bool = False, code: Path = REPO,
            wait_s: float = 180) -> Iterator[int]:
    """``dagster-webserver`` (and with ``daemon`` ``dagster-daemon``) on the code location of
    the checkout ``code`` (default: this one) for ``ws``, instance ``home``; yields the port
    once the webserver answers (within ``wait_s``)."""
    env = {**os.environ, "DAGSTER_HOME": str(home), "THT_WORKSPACE": str(ws)}
    if code != REPO:
        env["PYTHONPATH"] = str(code)
    port = free_port()
    commands = [[str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1",
                 "-p", str(port)]]
    if daemon:
        commands.append([str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"])
    procs = [subprocess.Popen(cmd, cwd=code, env=env, stderr=subprocess.STDOUT,
                              stdout=(logs / f"{Path(cmd[0]).name}.log").open("wb"))
             for cmd in commands]
    try:
        wait_for_webserver(f"http://127.0.0.1:{port}", procs[0], logs / "dagster-webserver.log",
                           wait_s)
        yield port
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _run_seconds(home: Path, run_id: str) -> float:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        record = instance.get_run_record_by_id(run_id)
        assert record is not None and record.start_time and record.end_time
        return record.end_time - record.start_time


def ui_launch(client: Any, home: Path, job: str, tags: dict[str, str]) -> dict[str, float]:
    """launchRun through GraphQL, then poll until the run is finished."""
    from dagster_graphql import DagsterGraphQLClientError

    t = time.perf_counter()
    run_id = client.submit_job_execution(job, repository_location_name="thoth_evidence",
                                         tags=tags)
    while True:
        try:
            status = client.get_run_status(run_id)
        except DagsterGraphQLClientError:
            status = None
        if status is not None and status.value in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(0.2)
    wall = time.perf_counter() - t
    if status.value != "SUCCESS":
        raise RuntimeError(f"{job} run {run_id} ended {status.value}")
    return {"wall_s": round(wall, 2), "run_s": round(_run_seconds(home, run_id), 2)}


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return round(time.perf_counter() - t, 2)


PREVIEW_IN_PROCESS = """
import sys, dagster as dg
from evidence_pipeline.definitions import defs
from evidence_pipeline.orchestration.runs import _resources
with dg.DagsterInstance.get() as instance:
    r = defs.resolve_job_def("source_preview").execute_in_process(
        instance=instance, resources=_resources(sys.argv[1]), partition_key=sys.argv[2])
    assert r.success
"""


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from dagster_graphql import DagsterGraphQLClient

    from evidence_pipeline.demo import create_demo_repo
    from evidence_pipeline.orchestration.partitions import sync_source_partitions

    info = machine()
    tmp = Path(tempfile.mkdtemp(prefix="tht-launch-"))
    ws = create_demo_repo(tmp / "ws")
    note = ws / "evidence" / NOTE
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(NOTE_TEXT, encoding="utf-8")  # a changed source; prepare is not run on it
    home = tmp / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAEMONLESS, encoding="utf-8")
    env = {**os.environ, "DAGSTER_HOME": str(home), "THT_WORKSPACE": str(ws)}
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        sync_source_partitions(instance, ws / "evidence")
    # the note is a change for prepare: the no-op prepare runs on a copy without it, with its
    # own instance (prepare brings the partitions in step with its workspace)
    noop = create_demo_repo(tmp / "noop")
    home_noop = tmp / "home-noop"
    home_noop.mkdir()
    (home_noop / "dagster.yaml").write_text(DAEMONLESS, encoding="utf-8")
    rows: dict[str, list[dict[str, float]]] = {}
    with serving(home, ws, tmp) as port:
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        for i in range(args.repeat):
            log(f"round {i + 1}/{args.repeat}")
            env_noop = {**env, "THT_WORKSPACE": str(noop), "DAGSTER_HOME": str(home_noop)}
            rows.setdefault("prepare (no-op): CLI, DAGSTER_HOME set", []).append(
                {"wall_s": timed([str(BIN / "tht"), "evidence", "prepare", str(noop)],
                                 env_noop)})
            rows.setdefault("prepare (no-op): CLI, no Dagster", []).append(
                {"wall_s": timed([str(BIN / "tht"), "evidence", "prepare", str(noop)],
                                 {k: v for k, v in env_noop.items() if k != "DAGSTER_HOME"})})
            rows.setdefault("source_preview (1 new note): UI launch", []).append(
                ui_launch(client, home, "source_preview", {"dagster/partition": NOTE}))
            rows.setdefault("source_preview (1 new note): in-process, new process", []).append(
                {"wall_s": timed([sys.executable, "-c", PREVIEW_IN_PROCESS, str(ws), NOTE],
                                 env)})
    (tmp / "noop-logs").mkdir()
    with serving(home_noop, noop, tmp / "noop-logs") as port:
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        for _ in range(args.repeat):
            rows.setdefault("prepare (no-op): UI launch", []).append(
                ui_launch(client, home_noop, "prepare", {}))
    summary = {name: {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
               for name, runs in rows.items()}
    write_json("dagster_launches.json", {"machine": info, "runs": rows, "median": summary})
    if args.json:
        print(json.dumps(summary))
    else:
        print(table(("launch", "wall s (median)", "run start→end s"),
                    [(n, s["wall_s"], s.get("run_s", "–")) for n, s in summary.items()],
                    title=f"{args.repeat} round(s); load at start {info['load_avg_1m_at_start']}"))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
