"""scripts/ui.sh as a newcomer meets it (issue 17 item 11): it starts the UI without the community
dialog and without warnings about a superseded command or a dagster.yaml in the working directory,
and Ctrl-C stops it — Dagster and everything it started — in bounded time."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, STATE_ENV, free_port, print_at_end, wait_for_webserver

STOP_S = 10


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _processes_with(text: str) -> list[str]:
    """Command lines of the running processes that mention ``text`` (zombies have none)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found


@pytest.mark.slow
def test_ctrl_c_stops_the_ui_and_everything_it_started(tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / "ui"
    env = {k: v for k, v in os.environ.items() if k not in STATE_ENV}
    env.update(THT_UI_STATE=str(state), THT_UI_PORT=str(port), THT_UI_STOP_S=str(STOP_S))
    log = tmp_path / "ui.log"
    with log.open("wb") as out:
        # its own session and process group, as a terminal runs it: Ctrl-C is SIGINT to the group
        # with SIGINT at its default, as a terminal starts it: a shell that finds SIGINT ignored
        # (inherited from a test runner started with `&` by a non-interactive shell) can never
        # trap it, and ui.sh would sit through Ctrl-C
        ui = subprocess.Popen(["bash", str(ROOT / "scripts" / "ui.sh")], env=env, stdout=out,
                              stderr=subprocess.STDOUT, start_new_session=True,
                              preexec_fn=_default_sigint)
        try:
            wait_for_webserver(f"http://127.0.0.1:{port}", ui, log, 300)
            assert _processes_with(str(state / "dagster-home"))  # Dagster's code server runs
            started = time.monotonic()
            os.killpg(ui.pid, signal.SIGINT)
            try:
                status = ui.wait(timeout=STOP_S + 30)
            except subprocess.TimeoutExpired:
                pytest.fail(f"ui.sh still runs {STOP_S + 30} s after Ctrl-C: "
                            + log.read_text(errors="replace")[-3000:])
            stopped_in = time.monotonic() - started
        finally:
            if ui.poll() is None:
                os.killpg(ui.pid, signal.SIGKILL)
                ui.wait()
    output = log.read_text(errors="replace")
    print_at_end(f"scripts/ui.sh: stopped {stopped_in:.1f} s after Ctrl-C "
                 f"(THT_UI_STOP_S={STOP_S})")
    assert status == 0, output
    assert output.rstrip().endswith("Dagster stopped"), output[-2000:]
    deadline = time.monotonic() + 1  # a process killed last may still be exiting
    while _processes_with(str(state / "dagster-home")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(str(state / "dagster-home")) == []  # no code server left behind
    assert _processes_with(f"-p {port}") == []
    # no community dialog, no warning about the superseded command or a dagster.yaml in the cwd
    assert (state / "dagster-home" / ".nux" / "nux.yaml").read_text() == "seen: 1\n"
    assert "SupersessionWarning" not in output
    assert "Found a dagster instance configuration value" not in output

