"""The Prefect-outage fault step of ``bench_capacity.py`` (``--prefect-outage SECONDS``).

During one load step the bench's Prefect server is SIGKILLed (with everything it started) ``--outage-at`` seconds
into the step and started again on the same port, with the same database, ``SECONDS`` later. Reported for the step:
messages/s delivered before the kill, while the server was down and after its return; how long after its return
delivery was back to normal (the first second from which the backlog built meanwhile is gone: delivered/s back at
the offered rate and staying there); and, once the step has drained, the flow runs Prefect shows for the step: by
deployment and state, and how many are not in a final state (the run delivering now aside).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class PrefectServerProcess:
    """``prefect server start`` on a fixed port that can be killed and started again (its database survives)."""

    def __init__(self, workdir: Path, env: dict[str, str], port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/api"
        self.env = {**env, "PREFECT_HOME": str(workdir / "prefect-server"),
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_URL": self.url}
        self.log = workdir / "prefect-server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def poll(self) -> int | None:
        return self.process.poll() if self.process else 0

    def start(self) -> PrefectServerProcess:
        with self.log.open("ab") as handle:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                env=self.env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(60)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def __enter__(self) -> PrefectServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Outage:
    """One kill and restart of the Prefect server during a step, run in a thread."""

    server: PrefectServerProcess
    at: float
    seconds: float
    wait_healthy: Any
    killed: float = 0.0
    restarting: float = 0.0
    healthy: float = 0.0
    thread: threading.Thread | None = field(default=None, repr=False)

    def begin(self, step_started: float) -> None:
        """Start the fault ``at`` seconds after ``step_started``, in a thread (``finish`` waits for it)."""
        def run() -> None:
            time.sleep(max(step_started + self.at - time.time(), 0))
            self.inject()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def inject(self) -> None:
        self.server.kill()
        self.killed = time.time()
        time.sleep(self.seconds)
        self.restarting = time.time()
        self.server.start()
        self.wait_healthy(f"{self.server.url}/health", self.server, 180, "Prefect server (restarted)")
        self.healthy = time.time()

    def finish(self) -> None:
        if self.thread is not None:
            self.thread.join()

    def describe(self, stats: dict[str, Any], offered: float, started_at: float, ended_at: float) -> str:
        return report(self, {int(second): count for second, count in stats["per_second"].items()}, offered,
                      ended_at, started_at)


def rate_between(per_second: dict[int, int], start: float, end: float) -> float:
    seconds = range(int(start) + 1, int(end))
    return sum(per_second.get(second, 0) for second in seconds) / max(len(seconds), 1)


def back_to_normal(per_second: dict[int, int], healthy: float, offered: float, ended: float) -> float | None:
    """Seconds from the server's return to the first second after which every second delivered at least 80 % of the
    offered rate until the step's end; None when that never happened."""
    seconds = range(int(healthy), int(ended))
    for index, second in enumerate(seconds):
        if all(per_second.get(later, 0) >= 0.8 * offered for later in seconds[index:]):
            return max(second - healthy, 0.0)
    return None


def flow_runs_since(since: float) -> dict[str, Any]:
    """The flow runs Prefect shows whose slot came after ``since``: counts by deployment and state."""
    from datetime import datetime, timezone

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterExpectedStartTime

    now = datetime.now(timezone.utc)
    window = FlowRunFilterExpectedStartTime(after_=datetime.fromtimestamp(since, timezone.utc), before_=now)
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(expected_start_time=window), limit=200)
        names = {deployment.id: deployment.name for deployment in client.read_deployments()}
    counts: dict[str, int] = {}
    for run in runs:
        key = f"{names.get(run.deployment_id, '-')} {run.state.name if run.state else '?'}"
        counts[key] = counts.get(key, 0) + 1
    running_deliver = sum(1 for run in runs if run.state and run.state.is_running()
                          and names.get(run.deployment_id) == "continuous")
    unfinished = sum(1 for run in runs if run.state and not run.state.is_final()) - min(running_deliver, 1)
    return {"by state": dict(sorted(counts.items())), "not final": unfinished}


def report(outage: Outage, per_second: dict[int, int], offered: float, step_ended: float, since: float) -> str:
    """The outage's figures, one paragraph."""
    before = rate_between(per_second, outage.killed - 10, outage.killed)
    during = rate_between(per_second, outage.killed, outage.restarting)
    after = rate_between(per_second, outage.healthy, step_ended)
    normal = back_to_normal(per_second, outage.healthy, offered, step_ended)
    runs = flow_runs_since(since)
    return (f"  Prefect server SIGKILLed {outage.killed - since:.0f} s into the step, started again "
            f"{outage.seconds:.0f} s later, healthy {outage.healthy - outage.restarting:.1f} s after that: delivered "
            f"{before:,.0f}/s before, {during:,.0f}/s while down ({during / max(before, 1e-9):.0%} of before), "
            f"{after:,.0f}/s after; "
            f"normal delivery {'never' if normal is None else f'{normal:.0f} s'} after its return\n"
            f"          flow runs of the step once drained: {runs['by state']}; not final (the delivering run "
            f"aside): {runs['not final']}")
