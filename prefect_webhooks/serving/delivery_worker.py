"""The delivery worker: one warm process that runs the ``deliver/continuous`` deployment's runs back to back.

``prefect-webhooks serve`` starts one (or ``--delivery-workers N``) next to the ingest API. Each worker:

- registers ``deliver/continuous`` exactly as ``deployments/prefect.yaml`` defines it (the one definition: its
  schedule, parameters and description), and serves it instead of the runner;
- runs the ``deliver`` flow **in its own process**, one flow run after another (a *shift* each), so no Python process
  with Prefect loaded is started per run (seconds of CPU each). Every run is a run of the deployment: it shows under
  it in the Prefect UI with its task runs and artifacts;
- starts the first shift as soon as it has registered, so what is due moves within seconds of ``serve`` starting,
  without waiting for the first scheduled run;
- takes the deployment's scheduled runs as they fall due (it polls every ``PREFECT_RUNNER_POLL_FREQUENCY`` seconds,
  like a Prefect runner), and runs started by hand (``prefect deployment run deliver/continuous``, the UI's *Run*
  button) the same way: each becomes the next shift;
- hands over without a pause: a shift ends only once its successor has made its first claim; the predecessor then
  stops claiming, finishes the batches it holds, publishes its artifacts and completes. The two overlap by at least
  one claim (leases keep their rows apart). Where no scheduled run came (another worker took it, or the schedule was
  removed), the worker starts a run itself one poll after the schedule's interval;
- starts no run of its own while the deployment is paused in Prefect (the scheduler makes none either), so delivery
  stops at the end of the current shift and resumes with the deployment; a run set to *Cancelling* stops claiming
  and ends after its batches;
- on SIGTERM/SIGINT stops claiming, finishes the batches in flight, completes its runs and exits 0.

Every run of the process shares one HTTP session, one set of circuit breakers and one destination cache
(``delivery.Shift``). Several workers (on one machine or many, on PostgreSQL) each run their own shifts; their
claims are disjoint.

Run it alone with ``python -m prefect_webhooks.serving.delivery_worker``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from datetime import datetime, timezone
from typing import Any
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
from prefect.flow_engine import run_flow
from prefect.settings import PREFECT_RUNNER_POLL_FREQUENCY
from prefect.states import Pending
from prefect.utilities.engine import propose_state

from prefect_webhooks.delivery import Sender, Shift, current_shift
from prefect_webhooks.delivery.destinations import DestinationCache
from prefect_webhooks.deployments.serve import DELIVER_DEPLOYMENT, deliver_definition, served_deployment
from prefect_webhooks.flows.deliver import deliver
from prefect_webhooks.settings import WebhooksSettings, get_settings
from prefect_webhooks.utilities.runtime import tune_gc_for_serving

logger = logging.getLogger("prefect_webhooks.serving.delivery_worker")

# How long a new shift may take to make its first claim before the predecessor stops waiting for it.
SUCCESSOR_START_TIMEOUT = 30.0
# Between two tries to start a shift when the Prefect API refused or could not be reached.
START_RETRY_SECONDS = 5.0


def shift_seconds(definition: dict[str, Any], poll_seconds: float) -> float:
    """How long a shift lasts when no scheduled run takes over: one poll after the schedule's interval, so a
    scheduled run normally comes first; without an interval schedule, four fifths of the run's ``run_for_seconds``."""
    intervals = [float(schedule["interval"]) for schedule in definition.get("schedules") or []
                 if schedule.get("interval") and schedule.get("active", True)]
    if intervals:
        return min(intervals) + poll_seconds
    run_for = (definition.get("parameters") or {}).get("run_for_seconds")
    if not run_for:
        raise ValueError(f"deliver/{DELIVER_DEPLOYMENT} needs an interval schedule or run_for_seconds to run in a "
                         "delivery worker (a run without run_for_seconds stops once nothing is due)")
    return float(run_for) * 0.8


def register_deliver_deployment(definition: dict[str, Any]) -> UUID:
    """Create or update ``deliver/continuous`` from its definition; returns the deployment's id."""
    return served_deployment(definition).apply()


class DeliveryWorker:
    """Runs the runs of ``deliver/continuous`` one after another, overlapping at each handover, in this process."""

    def __init__(self, settings: WebhooksSettings | None = None, *, poll_seconds: float | None = None) -> None:
        self.settings = settings or get_settings()
        self.poll_seconds = poll_seconds if poll_seconds is not None else float(PREFECT_RUNNER_POLL_FREQUENCY.value())
        self.definition = deliver_definition(self.settings)
        self.shift_seconds = shift_seconds(self.definition, self.poll_seconds)
        self.stopping = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.deployment_id: UUID | None = None
        self.runs: dict[UUID, tuple[Shift, asyncio.Task[Any]]] = {}
        self.shifts_started = 0

    async def run(self) -> None:
        """Deliver until ``stop`` is called; then end every run cleanly."""
        async with Sender(self.settings) as sender, get_client() as client:
            self.sender, self.destinations, self.client = sender, DestinationCache(), client
            self.deployment_id = await self._register()
            # Everything loaded so far lives as long as the process: out of the collector's way (a third of the CPU
            # per delivered message went to collections scanning Prefect's heap).
            tune_gc_for_serving()
            logger.info("deliver/%s registered (%.1f s of CPU used by this process)", DELIVER_DEPLOYMENT,
                        time.process_time())
            current: tuple[Shift, asyncio.Task[Any]] | None = None
            next_shift = time.monotonic()
            next_poll = time.monotonic() + self.poll_seconds
            while not self.stopping.is_set():
                now = time.monotonic()
                if current is not None and current[1].done():
                    # The run ended on its own (its run_for_seconds, an error, a cancellation): start the next now.
                    current, next_shift = None, now
                due: list[Any] = []
                if now >= next_poll:
                    due = await self._poll()
                    next_poll = now + self.poll_seconds
                if not due and now >= next_shift:
                    due = [None]  # no scheduled run came: a run of the worker's own
                for flow_run in due:
                    successor = await self._start_shift(current[0] if current else None, flow_run)
                    if successor is not None:
                        current, next_shift = successor, time.monotonic() + self.shift_seconds
                    elif flow_run is None:
                        next_shift = time.monotonic() + START_RETRY_SECONDS
                waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(self.stopping.wait())}
                if current is not None:
                    waits.add(current[1])
                timeout = max(min(next_shift, next_poll) - time.monotonic(), 0.0)
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for waiting in waits:
                    if waiting is not (current[1] if current else None):
                        waiting.cancel()
            await self._end_all()

    def stop(self) -> None:
        """Ask the worker to stop claiming and end its runs (safe from a signal handler)."""
        self.stopping.set()

    async def _register(self) -> UUID:
        while True:
            try:
                # In a thread: ``Flow.to_deployment`` and ``RunnerDeployment.apply`` are sync-compatible on older
                # Prefect releases (called from a coroutine they return coroutines), plain functions on newer ones.
                return await asyncio.to_thread(register_deliver_deployment, self.definition)
            except Exception as exc:
                if self.stopping.is_set():
                    raise
                logger.warning("registering deliver/%s failed (%s: %s); retrying", DELIVER_DEPLOYMENT,
                               type(exc).__name__, exc)
                await asyncio.sleep(START_RETRY_SECONDS)

    async def _start_shift(self, current: Shift | None, flow_run: Any = None) -> tuple[Shift, asyncio.Task[Any]] | None:
        """Start a shift (a taken scheduled run, or a new run) and hand over to it once it claims.

        Returns None when it could not be started; the current shift then keeps delivering.
        """
        if flow_run is None:
            try:
                deployment = await self.client.read_deployment(self.deployment_id)
                if deployment.paused:
                    if current is not None:
                        current.handed_over.set()
                    logger.info("deliver/%s is paused: no new run", DELIVER_DEPLOYMENT)
                    return None
                flow_run = await self.client.create_flow_run_from_deployment(self.deployment_id, state=Pending())
            except Exception as exc:
                logger.warning("starting a deliver run failed (%s); the current one keeps delivering",
                               type(exc).__name__)
                return None
        successor = Shift(self.sender, self.destinations)
        task = self._execute(successor, flow_run)
        claimed = asyncio.ensure_future(successor.claiming.wait())
        try:
            await asyncio.wait({claimed, task}, timeout=SUCCESSOR_START_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        finally:
            claimed.cancel()
        if not successor.claiming.is_set():
            logger.warning("deliver run %s did not start claiming; the current one keeps delivering", flow_run.id)
            successor.handed_over.set()
            return None
        if current is not None:
            current.handed_over.set()
            logger.info("deliver run %s claiming; the previous run finishes its batches and ends", flow_run.id)
        elif not self.shifts_started:
            logger.info("first deliver run %s claiming (%.1f s of CPU used by this process)", flow_run.id,
                        time.process_time())
        self.shifts_started += 1
        return successor, task

    def _execute(self, shift: Shift, flow_run: Any) -> asyncio.Task[Any]:
        async def execute() -> Any:
            current_shift.set(shift)  # this task's own context: the flow and its batches see the shift
            try:
                return await run_flow(deliver, flow_run=flow_run, return_type="state")
            except Exception as exc:
                logger.error("deliver run %s ended with %s: %s", flow_run.id, type(exc).__name__, exc)
                return None
            finally:
                shift.claiming.set()

        task = asyncio.ensure_future(execute())
        self.runs[flow_run.id] = (shift, task)
        task.add_done_callback(lambda _task: self.runs.pop(flow_run.id, None))
        return task

    async def _poll(self) -> list[Any]:
        """The deployment's due runs, taken by this worker; runs set to Cancelling are told to stop."""
        try:
            due = await self.client.get_scheduled_flow_runs_for_deployments(
                [self.deployment_id], scheduled_before=datetime.now(timezone.utc))
            cancelling = []
            if self.runs:
                cancelling = await self.client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    id=FlowRunFilterId(any_=list(self.runs)),
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.CANCELLING]))))
        except Exception as exc:
            logger.warning("polling deliver/%s failed: %s", DELIVER_DEPLOYMENT, type(exc).__name__)
            return []
        for flow_run in cancelling:
            shift, _task = self.runs.get(flow_run.id, (None, None))
            if shift is not None:
                shift.handed_over.set()
        taken = []
        for flow_run in sorted(due, key=lambda run: run.expected_start_time or run.created):
            try:
                state = await propose_state(self.client, Pending(), flow_run_id=flow_run.id)
            except Abort:
                continue  # another worker took it
            except Exception as exc:
                logger.warning("taking deliver run %s failed: %s", flow_run.id, type(exc).__name__)
                continue
            if state.is_pending():
                taken.append(flow_run)
        return taken

    async def _end_all(self, grace: float | None = None) -> None:
        """Stop every run claiming and wait for them to finish their batches and complete."""
        for shift, _task in list(self.runs.values()):
            shift.handed_over.set()
        tasks = [task for _shift, task in self.runs.values()]
        if tasks:
            # A batch in flight needs at most one request timeout, its record and the run's artifacts.
            grace = grace if grace is not None else self.settings.delivery.request_timeout * 2 + 10
            _done, late = await asyncio.wait(tasks, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=5)


async def _main(worker: DeliveryWorker, stop_requested: threading.Event) -> None:
    worker.loop = asyncio.get_running_loop()
    if stop_requested.is_set():  # a signal came before the loop existed
        worker.stop()
    await worker.run()


def main() -> None:
    """Run the deliver/continuous deployment's runs in this process until SIGTERM/SIGINT."""
    # Prefect configures logging when imported; this module's lines go to stderr beside the runs' own.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)-7s | %(name)s - %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    # A few task runs a second each logging "Finished in state Completed()" to the console and to the Prefect API
    # (one more record for the server to store per task run): their states show in the UI already. Warnings and
    # errors of the batches (timeouts, failures) are still logged.
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    worker = DeliveryWorker()
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
            worker.loop.call_soon_threadsafe(worker.stop)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    thread = threading.Thread(target=deliver_until_stopped, name="delivery")
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
    if errors:
        raise errors[0]


if __name__ == "__main__":
    typer.run(main)
