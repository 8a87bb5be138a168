"""The runner child of ``serve`` is started again when it exits, after a growing pause; ingest and delivery stay."""

from __future__ import annotations

import subprocess
import sys
import time

from prefect_webhooks.serving.restarts import FIRST_DELAY, MAX_DELAY, STEADY_SECONDS, Restarts
from prefect_webhooks.serving.service import Child


def test_an_exited_child_starts_again_after_a_pause_that_doubles_and_resets_once_steady() -> None:
    restarts = Restarts()
    # A real process that exits at once, as a runner does when the Prefect API refuses its first call.
    child = Child("deployments", [sys.executable, "-c", "import sys; sys.exit(75)"], restarts=restarts).start()
    assert isinstance(child.process, subprocess.Popen)
    child.wait(30)
    now = time.monotonic()
    restarts.tend(child, now)  # scheduled, not started yet
    assert restarts.count == 0 and restarts.due_at == now + FIRST_DELAY
    first = child.process
    restarts.tend(child, now + FIRST_DELAY)
    assert restarts.count == 1 and child.process is not first
    child.wait(30)
    restarts.tend(child, now + FIRST_DELAY + 1)
    assert restarts.due_at == now + FIRST_DELAY + 1 + 2 * FIRST_DELAY
    assert restarts.delay <= MAX_DELAY
    # A child that ran steadily before it exited waits the first pause again.
    restarts.tend(child, restarts.due_at)
    child.wait(30)
    restarts.tend(child, restarts.started_at + STEADY_SECONDS)
    assert restarts.due_at == restarts.started_at + STEADY_SECONDS + FIRST_DELAY
