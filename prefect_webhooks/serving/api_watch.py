"""The Prefect API watched from ``serve``'s supervisor, so the deployments runner starts afresh after each outage.

A Prefect runner that lives through an outage of its API does not come back from it on every release. On 3.4 it
exits, and ``serving.restarts`` starts it again. On 3.8 it stays up, but the runs it takes after the API's return
stay *Submitting* for good: its loops have passed their error threshold ("Service exceeded error threshold") and
its clients are bound to an event loop that is gone (``NoEventLoopError``). Seen with ``serve`` on PostgreSQL: 27–39
deletions runs Submitting after the return, and none completed. A runner started after the return has none of that
state. That is the depth of the fix: what breaks is Prefect's runner state, not ours, so we replace it rather than
try to repair it.

So the supervisor probes ``{PREFECT_API_URL}/health`` every ``PROBE_SECONDS``. Once the API answers again after
failing to answer for at least ``OUTAGE_SECONDS``, the runner is stopped (its flow-run processes first get SIGTERM,
so they report their runs as Crashed) and started again. One slow answer is no outage: it takes probes failing for
that long. Runs the old runner left *Pending* are crashed by the delivery worker's sweep (``run_records``); the next
scheduled runs cover their slots.
"""

from __future__ import annotations

import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Protocol

PROBE_SECONDS = 2.0
PROBE_TIMEOUT = 5.0
OUTAGE_SECONDS = 6.0


def api_answers(api_url: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the Prefect API at ``api_url`` answers its health check (any HTTP answer counts: it is up)."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


@dataclass
class OutageWatch:
    """Whether the API came back from an outage, from probe results in time order."""

    down_since: float | None = None
    outages: int = 0

    def observe(self, answered: bool, now: float | None = None) -> bool:
        """Record one probe; True when the API answers again after an outage of at least ``OUTAGE_SECONDS``."""
        now = time.monotonic() if now is None else now
        if not answered:
            if self.down_since is None:
                self.down_since = now
            return False
        was_down, self.down_since = self.down_since, None
        if was_down is not None and now - was_down >= OUTAGE_SECONDS:
            self.outages += 1
            return True
        return False


@dataclass
class ApiWatcher:
    """Probes the API in a daemon thread; ``returned`` is set each time it comes back from an outage."""

    api_url: str
    returned: threading.Event = field(default_factory=threading.Event)
    watch: OutageWatch = field(default_factory=OutageWatch)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> ApiWatcher:
        """Start probing."""
        threading.Thread(target=self._probe_until_stopped, name="prefect-api-watch", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop probing."""
        self._stop.set()

    def _probe_until_stopped(self) -> None:
        while not self._stop.wait(PROBE_SECONDS):
            if self.watch.observe(api_answers(self.api_url)):
                self.returned.set()


class Runner(Protocol):
    """What ``restart_runner`` needs of the supervised runner (``service.Child``)."""

    restarts: Any

    def terminate(self) -> None:
        """Send the stop signal (flow-run processes first)."""
        ...

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True when it exited."""
        ...

    def kill_group(self) -> None:
        """Stop what is left of its process group."""
        ...

    def start(self) -> object:
        """Start the process."""
        ...


def restart_runner(runner: Runner, grace_seconds: float) -> None:
    """Stop the deployments runner as ``serve`` stops it (its flow-run processes first) and start a new one."""
    print("prefect-webhooks serve: the Prefect API answers again after an outage; starting the deployments runner "
          "afresh (one that lived through the outage leaves the runs it takes Submitting)", file=sys.stderr, flush=True)
    runner.terminate()
    if not runner.wait(grace_seconds):
        runner.kill_group()
    runner.start()
    if runner.restarts is not None:
        runner.restarts.due_at = None
