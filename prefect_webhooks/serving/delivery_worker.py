"""The delivery worker: one warm process that runs the ``deliver/continuous`` deployment's runs back to back.

``prefect-webhooks serve`` starts one (or ``--delivery-workers N``) next to the ingest API. Each worker:

- registers ``deliver/continuous`` as ``deployments/prefect.yaml`` defines it (the one definition: its parameters and
  description) but without its schedule, and serves it instead of the runner: the worker paces the runs itself, so
  that a quiet minute needs no run of its own;
- runs the ``deliver`` flow **in its own process**, one flow run after another (a *shift* each), so no Python process
  with Prefect loaded is started per run (seconds of CPU each). Every run is a run of the deployment: it shows under
  it in the Prefect UI with its task runs and artifacts;
- starts the first shift once it has registered: what is due moves within seconds of ``serve`` starting;
- starts the next run every interval of the definition's schedule while messages flow; a run that has claimed
  nothing goes on instead, up to ``PREFECT_WEBHOOKS_QUIET_RUN_SECONDS`` (an hour), and hands over at the first
  interval after it has delivered something. A quiet service shows one run an hour in the Prefect UI, not one a
  minute;
- takes runs started by hand (``prefect deployment run deliver/continuous``, the UI's *Run* button) and any the
  deployment has scheduled as they fall due (it polls every ``PREFECT_RUNNER_POLL_FREQUENCY`` seconds, like a
  Prefect runner): each becomes the next shift;
- hands over without a pause: a shift ends only once its successor has made its first claim; the predecessor then
  stops claiming, finishes the batches it holds, publishes its artifacts and completes. The two overlap by at least
  one claim (leases keep their rows apart);
- starts no run of its own while the deployment is paused in Prefect: delivery stops at the end of the current
  shift and resumes with the deployment; a run set to *Cancelling* stops claiming and ends after its batches;
- started with ``--start-deletion-runs`` (``serve``'s first worker), also starts a ``deletions/interval`` run when a
  deletion request waits (``serving.deletion_runs``);
- on SIGTERM/SIGINT stops claiming, finishes the batches in flight, completes its runs and exits 0 (while the
  Prefect API is down, without waiting for Prefect's engine to report the runs' ends: the run records do);
- never waits for the Prefect API: every call to it is bounded (``api_wait_seconds``) and skipped while it is known
  to be down. A run whose successor cannot start keeps delivering; a worker that cannot start any run (started
  during an outage, or its run ended in one) delivers without a flow run (``serving.shifts``) until one can start;
  it registers the deployment when it can; what Prefect could not record meanwhile (the offline delivery, runs that
  could not report their end, artifacts) is recorded when the API answers again (``serving.run_records``).

Every run of the process shares one HTTP session, one set of circuit breakers and one destination cache
(``delivery.Shift``). Several workers (on one machine or many, on PostgreSQL) each run their own shifts; their
claims are disjoint.

Run it alone with ``python -m prefect_webhooks.serving.delivery_worker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from datetime import datetime, timezone
from typing import Annotated, Any
from uuid import UUID

import typer
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.exceptions import Abort
from prefect.settings import PREFECT_RUNNER_POLL_FREQUENCY
from prefect.states import Pending
from prefect.utilities.engine import propose_state

from prefect_webhooks.blocks.api_status import prefect_api
from prefect_webhooks.delivery import Sender
from prefect_webhooks.delivery.sending.destinations import DestinationCache
from prefect_webhooks.deployments.serve import (
    DELETIONS_DEPLOYMENT,
    DELIVER_DEPLOYMENT,
    definition_named,
    deliver_definition,
    schedule_interval,
    served_deployment,
    without_schedule,
)
from prefect_webhooks.flows.catch_up import run_newest_only
from prefect_webhooks.serving.deletion_runs import start_deletion_runs
from prefect_webhooks.serving.processes import log_to_stderr
from prefect_webhooks.serving.run_records import RunRecords
from prefect_webhooks.serving.shifts import (
    RunningShift,
    end_shifts,
    offline_options,
    shift_seconds,
    start_flow_run_shift,
    start_offline_shift,
)
from prefect_webhooks.serving.suspension_watch import watch_beside_the_loop
from prefect_webhooks.settings import WebhooksSettings, get_settings
from prefect_webhooks.utilities.runtime import tune_gc_for_serving

logger = logging.getLogger("prefect_webhooks.serving.delivery_worker")

# How long a new shift may take to make its first claim before the predecessor stops waiting for it.
SUCCESSOR_START_TIMEOUT = 30.0
# Between two tries to start a shift when the Prefect API refused or could not be reached.
START_RETRY_SECONDS = 5.0
# How long the worker waits for its registration before delivering without a flow run.
REGISTRATION_WAIT_SECONDS = 10.0
# At exit, how long what waited for the Prefect API may take to be recorded.
RECORD_AT_EXIT_SECONDS = 10.0

# What the deployment's description adds in the Prefect UI, where it shows without a schedule.
PACED_BY_THE_WORKER = ("Served by prefect-webhooks serve's delivery worker, which starts its runs: one per schedule "
                       "interval while messages flow, one per PREFECT_WEBHOOKS_QUIET_RUN_SECONDS while none do.")


def register_deliver_deployment(definition: dict[str, Any]) -> UUID:
    """Create or update ``deliver/continuous`` from its definition, without its schedule (the worker starts the runs:
    a scheduled run each interval would make a run of every quiet minute); returns the deployment's id."""
    return served_deployment(without_schedule(definition, PACED_BY_THE_WORKER)).apply()


class DeliveryWorker:
    """Runs the runs of ``deliver/continuous`` one after another, overlapping at each handover, in this process."""

    def __init__(self, settings: WebhooksSettings | None = None, *, poll_seconds: float | None = None,
                 start_deletion_runs: bool = False) -> None:
        """``start_deletion_runs``: also start ``deletions/interval``'s runs when a request waits (``serve``'s first
        worker; ``serving.deletion_runs``), every interval of that deployment's schedule."""
        self.settings = settings or get_settings()
        deletions = definition_named(DELETIONS_DEPLOYMENT, self.settings) if start_deletion_runs else {}
        self.deletion_checks_every = schedule_interval(deletions)
        self.poll_seconds = poll_seconds if poll_seconds is not None else float(PREFECT_RUNNER_POLL_FREQUENCY.value())
        self.definition = deliver_definition(self.settings)
        self.shift_seconds = shift_seconds(self.definition)
        self.stopping = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.deployment_id: UUID | None = None
        self.paused = False
        """Whether the deployment was paused when last read: then no shift runs, offline ones included."""
        self.runs: dict[UUID, RunningShift] = {}
        self.offline: RunningShift | None = None
        self.shifts_started = 0
        self.runs_ended = threading.Event()

    async def run(self) -> None:
        """Deliver until ``stop`` is called; then end every run cleanly."""
        async with Sender(self.settings) as sender, get_client() as client:
            self.sender, self.destinations, self.client = sender, DestinationCache(), client
            self.api = prefect_api()
            self.records = RunRecords(self.api, dict(self.definition.get("parameters") or {}),
                                      stuck_run_seconds=self.settings.outage.stuck_run_seconds)
            self.api.on_back(self._settle_records)
            registering = self._register()
            settling: asyncio.Future[None] = asyncio.ensure_future(asyncio.sleep(0))
            if self.deletion_checks_every:
                checking = asyncio.ensure_future(start_deletion_runs(client, self.api, self.deletion_checks_every,
                                                                     self.stopping))
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(registering), REGISTRATION_WAIT_SECONDS)
            # Everything loaded so far lives as long as the process: out of the collector's way (a third of the CPU
            # per delivered message went to collections scanning Prefect's heap).
            tune_gc_for_serving()
            current: RunningShift | None = None
            next_shift = time.monotonic()
            next_poll = time.monotonic() + self.poll_seconds
            while not self.stopping.is_set():
                now = time.monotonic()
                if registering.done() and self.deployment_id is None:
                    registering = self._register()
                if self.records.waiting and self.api.reachable and self.deployment_id and settling.done():
                    settling = asyncio.ensure_future(self._settle_records())
                if current is not None and current.task.done():
                    # The run ended on its own (an error, a cancellation): start the next now.
                    current, next_shift = None, now
                due: list[Any] = []
                if now >= next_poll:
                    due = await self._poll()
                    next_poll = now + self.poll_seconds
                if not due and now >= next_shift:
                    if current is not None and current.goes_on_quietly(self.settings.serve.quiet_run_seconds,
                                                                       time.time()):
                        next_shift = now + self.shift_seconds
                    else:
                        due = [None]  # the next run of the worker's own
                for flow_run in due:
                    successor = await self._start_shift(current, flow_run)
                    if successor is not None:
                        current, next_shift = successor, time.monotonic() + self.shift_seconds
                    elif flow_run is None:
                        next_shift = time.monotonic() + START_RETRY_SECONDS
                if current is None and not self.paused:
                    current = self._deliver_offline()
                    next_shift = time.monotonic() + START_RETRY_SECONDS
                waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(self.stopping.wait())}
                if current is not None:
                    waits.add(current.task)
                timeout = max(min(next_shift, next_poll) - time.monotonic(), 0.0)
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for waiting in waits:
                    if waiting is not (current.task if current else None):
                        waiting.cancel()
            registering.cancel()
            settling.cancel()
            if self.deletion_checks_every:
                checking.cancel()
            self.records.cancel_sweeps()
            # A batch in flight needs at most one request timeout, its record and the run's artifacts.
            await end_shifts([*self.runs.values(), *([self.offline] if self.offline else [])], self.api,
                             self.settings.delivery.request_timeout * 2 + 10)
            if self.records.waiting and self.api.reachable:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._settle_records(), RECORD_AT_EXIT_SECONDS)
            self.records.log_unrecorded()
            self.runs_ended.set()

    def stop(self) -> None:
        """Ask the worker to stop claiming and end its runs (safe from a signal handler)."""
        self.stopping.set()

    def _register(self) -> asyncio.Future[None]:
        """Register the deployment in the background (retried by the loop until it succeeds)."""

        async def register() -> None:
            if not self.api.reachable:
                await asyncio.sleep(START_RETRY_SECONDS)
                return
            try:
                # In a thread: ``Flow.to_deployment`` and ``RunnerDeployment.apply`` are sync-compatible on older
                # Prefect releases (called from a coroutine they return coroutines), plain functions on newer ones.
                self.deployment_id = await self.api.call(
                    lambda: asyncio.to_thread(register_deliver_deployment, self.definition),
                    wait=REGISTRATION_WAIT_SECONDS)
            except Exception as exc:
                logger.warning("registering deliver/%s failed (%s); delivering meanwhile, retrying",
                               DELIVER_DEPLOYMENT, type(exc).__name__)
                await asyncio.sleep(START_RETRY_SECONDS)
                return
            logger.info("deliver/%s registered (%.1f s of CPU used by this process)", DELIVER_DEPLOYMENT,
                        time.process_time())

        return asyncio.ensure_future(register())

    async def _settle_records(self) -> None:
        await self.records.settle(self.client, self.deployment_id)
        self.records.sweep_after_outage(self.client)

    def _deliver_offline(self) -> RunningShift:
        """Deliver without a flow run until one can start (the Prefect API is down or the deployment unknown)."""
        self.offline = start_offline_shift(self.sender, self.destinations,
                                           offline_options(self.definition.get("parameters") or {}))
        offline = self.offline
        logger.warning("no run of deliver/%s can be started now: delivering without one until the Prefect API "
                       "answers (recorded then)", DELIVER_DEPLOYMENT)

        def ended(task: asyncio.Task[Any]) -> None:
            stats = None if task.cancelled() else task.result()
            self.records.offline_shift_ended(stats, offline.started_at, time.time())
            if self.offline is offline:
                self.offline = None

        offline.task.add_done_callback(ended)
        return offline

    async def _start_shift(self, current: RunningShift | None, flow_run: Any = None) -> RunningShift | None:
        """Start a shift (a taken scheduled run, or a new run) and hand over to it once it claims.

        Returns None when it could not be started; the current shift then keeps delivering.
        """
        if flow_run is None:
            if self.deployment_id is None or not self.api.reachable:
                return None
            try:
                deployment = await self.api.call(lambda: self.client.read_deployment(self.deployment_id))
                self.paused = bool(deployment.paused)
                if self.paused:
                    if current is not None:
                        current.shift.handed_over.set()
                    logger.info("deliver/%s is paused: no new run", DELIVER_DEPLOYMENT)
                    return None
                flow_run = await self.api.call(lambda: self.client.create_flow_run_from_deployment(
                    self.deployment_id, state=Pending()))
            except Exception as exc:
                logger.warning("starting a deliver run failed (%s); the current one keeps delivering",
                               type(exc).__name__)
                return None
        successor = start_flow_run_shift(self.sender, self.destinations, flow_run)
        self._track(successor)
        claimed = asyncio.ensure_future(successor.shift.claiming.wait())
        try:
            await asyncio.wait({claimed, successor.task}, timeout=SUCCESSOR_START_TIMEOUT,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            claimed.cancel()
        if not successor.shift.claiming.is_set():
            logger.warning("deliver run %s did not start claiming; the current one keeps delivering", flow_run.id)
            successor.shift.handed_over.set()
            self.records.never_started(flow_run.id)
            return None
        if current is not None:
            current.shift.handed_over.set()
            logger.info("deliver run %s claiming; the previous %s finishes its batches and ends", flow_run.id,
                        "offline delivery" if current.offline else "run")
        elif not self.shifts_started:
            logger.info("first deliver run %s claiming (%.1f s of CPU used by this process)", flow_run.id,
                        time.process_time())
        self.shifts_started += 1
        return successor

    def _track(self, running: RunningShift) -> None:
        flow_run_id = running.flow_run_id
        assert flow_run_id is not None
        self.runs[flow_run_id] = running

        def ended(task: asyncio.Task[Any]) -> None:
            self.runs.pop(flow_run_id, None)
            state = None if task.cancelled() else task.result()
            self.records.run_ended(flow_run_id, state, running.shift.unrecorded)

        running.task.add_done_callback(ended)

    async def _poll(self) -> list[Any]:
        """The deployment's due runs, taken by this worker; runs set to Cancelling are told to stop.

        Of the runs due at once (the slots missed while the Prefect API was down) only the newest becomes a shift;
        the older ones are cancelled as superseded by it.
        """
        if self.deployment_id is None or not self.api.reachable:
            return []
        try:
            due = await self.api.call(lambda: self.client.get_scheduled_flow_runs_for_deployments(
                [self.deployment_id], scheduled_before=datetime.now(timezone.utc)))
            cancelling = []
            if self.runs:
                cancelling = await self.api.call(lambda: self.client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    id=FlowRunFilterId(any_=list(self.runs)),
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.CANCELLING])))))
            due = await self.api.call(lambda: run_newest_only(self.client, due))
        except Exception as exc:
            logger.warning("polling deliver/%s failed: %s", DELIVER_DEPLOYMENT, type(exc).__name__)
            return []
        for flow_run in cancelling:
            running = self.runs.get(flow_run.id)
            if running is not None:
                running.shift.handed_over.set()
        taken = []
        for flow_run in due:
            try:
                state = await self.api.call(lambda run=flow_run: propose_state(self.client, Pending(),
                                                                               flow_run_id=run.id))
            except Abort:
                continue  # another worker took it
            except Exception as exc:
                logger.warning("taking deliver run %s failed: %s", flow_run.id, type(exc).__name__)
                continue
            if state.is_pending():
                taken.append(flow_run)
        return taken


async def _main(worker: DeliveryWorker, stop_requested: threading.Event) -> None:
    worker.loop = asyncio.get_running_loop()
    if stop_requested.is_set():  # a signal came before the loop existed
        worker.stop()
    await worker.run()


def main(start_deletion_runs: Annotated[bool, typer.Option(
        help="Also start deletions/interval's runs when a deletion request waits.")] = False) -> None:
    """Run the deliver/continuous deployment's runs in this process until SIGTERM/SIGINT."""
    # Prefect configures logging when imported (its root handler shows warnings only); the package's lines, from
    # INFO (an endpoint failing and answering again, a paused deployment), go to stderr beside the runs' own.
    log_to_stderr(logging.getLogger("prefect_webhooks"))
    # A few task runs a second each logging "Finished in state Completed()" to the console and to the Prefect API
    # (one more record for the server to store per task run): their states show in the UI already. Warnings and
    # errors of the batches (timeouts, failures) are still logged.
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    watch_beside_the_loop()  # each handover would hold every send of the process meanwhile
    worker = DeliveryWorker(start_deletion_runs=start_deletion_runs)
    stop_requested = threading.Event()
    try:
        import uvloop

        # uvloop's transports cost the sending loop less CPU per request than asyncio's selector loop.
        run: Any = uvloop.run
    except ImportError:  # Windows: the standard event loop
        run = asyncio.run
    # The runs execute on a thread of their own: Prefect's flow engine replaces the SIGTERM handler of the main
    # thread while a flow runs (to raise inside it), which would turn a stop into a crash of the running shifts.
    # Here the main thread keeps the signals and asks the worker to stop cleanly.
    errors: list[BaseException] = []

    def deliver_until_stopped() -> None:
        try:
            run(_main(worker, stop_requested))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def request_stop(_signum: int, _frame: Any) -> None:
        stop_requested.set()
        if worker.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                worker.loop.call_soon_threadsafe(worker.stop)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    thread = threading.Thread(target=deliver_until_stopped, name="delivery")
    thread.start()
    # Once the runs have ended while the API is down, the event loop's own shutdown would still wait for the tasks
    # Prefect's engine left reporting their runs' states to it (retried for about a minute): not waited for.
    while thread.is_alive() and not (worker.runs_ended.is_set() and not worker.api.reachable):
        thread.join(0.5)
    if errors:
        raise errors[0]
    if worker.runs_ended.is_set() and not worker.api.reachable:
        # Prefect's client would spend minutes at exit trying to send the events it holds (task-run states, failure
        # events) to an API that does not answer: everything of ours is committed, so exit now.
        logger.warning("exiting while the Prefect API cannot be reached: the events Prefect's client still holds "
                       "(task-run states, delivery failure events) are not sent; the store has every outcome")
        logging.shutdown()
        os._exit(0)


if __name__ == "__main__":
    typer.run(main)
