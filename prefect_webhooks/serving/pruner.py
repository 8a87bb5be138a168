"""The pruner of ``prefect-webhooks serve``: a retention pass every ``PREFECT_WEBHOOKS_RETENTION_INTERVAL``.

``serve`` starts it as a child of its own, niced like the runner, so a pass takes its CPU from idle time rather
than from ingest and delivery. Each pass is a run of the ``prune`` flow executed in this process (no process is
started per pass), tagged ``prefect-webhooks`` so that a later pass removes it from Prefect after
``PREFECT_WEBHOOKS_RETENTION_RUNS``. When the flow cannot run (the Prefect API cannot be reached), the store is
pruned all the same, without a flow run, and the log says so: the store stays bounded during an outage.

The first pass comes one interval after the start (at most a minute), out of the way of ``serve``'s start-up.
Prefect is imported only then. Run it alone with ``python -m prefect_webhooks.serving.pruner``.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import Any

from prefect_webhooks.serving.processes import log_to_stderr

logger = logging.getLogger("prefect_webhooks.pruner")

FIRST_PASS_AFTER_AT_MOST = 60.0
# On a stop, how long a pass under way gets to finish (its flow run then completes instead of staying Running).
STOP_GRACE_SECONDS = 10.0


def pruner_command() -> list[str]:
    """The command line of the pruner (this module)."""
    return [sys.executable, "-m", "prefect_webhooks.serving.pruner"]


def run_one_pass() -> None:
    """One pass: the ``prune`` flow, or the store pass alone when the flow cannot run. Never raises."""

    from prefect import tags

    from prefect_webhooks.flows.old_runs import OUR_TAG
    from prefect_webhooks.flows.prune import prune

    try:
        with tags(OUR_TAG):
            prune()  # sync_compatible: runs the flow here (no event loop in this thread) and returns its result
        return
    except Exception as exc:
        logger.warning("the prune flow could not run (%s: %s); pruning the store without a flow run",
                       type(exc).__name__, exc)
    try:
        from prefect_webhooks.store.upkeep.retention import prune_store

        logger.info("%s", prune_store().summary())
    except Exception as exc:
        logger.error("pruning the store failed: %s: %s; the next pass tries again", type(exc).__name__, exc)


def prune_every(interval: float, stop: threading.Event) -> None:
    """Run a pass every ``interval`` seconds (from one start to the next) until ``stop`` is set."""
    if stop.wait(min(interval, FIRST_PASS_AFTER_AT_MOST)):
        return
    while True:
        started = time.monotonic()
        # The pass runs on a thread of its own: Prefect's flow engine takes over SIGTERM in the thread running a
        # flow; this one keeps the signals and can stop between passes.
        worker = threading.Thread(target=run_one_pass, name="prune", daemon=True)
        worker.start()
        while worker.is_alive() and not stop.is_set():
            worker.join(0.5)
        if stop.is_set():
            worker.join(STOP_GRACE_SECONDS)
            return
        if stop.wait(max(interval - (time.monotonic() - started), 1.0)):
            return


def main() -> None:
    """Prune every ``PREFECT_WEBHOOKS_RETENTION_INTERVAL`` until SIGTERM/SIGINT."""
    log_to_stderr(logger)
    from prefect_webhooks.settings import get_settings

    stop = threading.Event()

    def request_stop(_signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    interval = get_settings().retention.retention_interval
    logger.info("pruning the store every %g s", interval)
    prune_every(interval, stop)


if __name__ == "__main__":
    main()
