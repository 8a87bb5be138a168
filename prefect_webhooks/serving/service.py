"""The one-machine service behind ``prefect-webhooks serve``: the ingest API plus the served deployments.

It supervises its child processes, each in its own process group:

- the ingest API: uvicorn running ``create_service_app`` (the ingest app with ``/metrics``, ``/health/backlog``, the
  admin API and the console), one process or ``ingest_workers`` processes sharing the port;
- the delivery worker(s): ``python -m prefect_webhooks.serving.delivery_worker``, each running the runs of the
  ``deliver/continuous`` deployment in its own warm process (see that module); started together with the API, so
  what is due is delivered within seconds of the start; the first also starts deletions runs when a request waits;
- the other deployments: ``python -m prefect_webhooks.deployments.serve --no-deliver``, a Prefect runner serving the
  rest of ``deployments/prefect.yaml`` and the audience syncs against the Prefect server in ``PREFECT_API_URL``;
- the pruner: ``python -m prefect_webhooks.serving.pruner``, a retention pass (the ``prune`` flow, in-process) every
  ``PREFECT_WEBHOOKS_RETENTION_INTERVAL``.

Shutdown on SIGTERM or SIGINT is ordered so that no claimed message is lost: the API stops accepting first and
finishes the requests it has (a message is only acknowledged after its commit), then the delivery workers stop
claiming, finish their batches and complete their runs, then the runner is told to stop and stops its flow-run
processes. Rows a stopped delivery process had claimed are released at once (their lease owner, a process of this
host, is gone), so they are pending again; if the supervisor itself is killed, the leases expire after
``lease_seconds`` and the rows return to pending all the same.

If the ingest API or a delivery worker dies, the others are stopped too and the service exits non-zero, so a process
manager restarts them. The runner is started again instead (``serving.restarts``): on some Prefect releases it exits
when the Prefect API cannot be reached, and ingest and delivery must go on meanwhile. Stopped while the API is down,
the runner and the pruner get ``OUTAGE_STOP_SECONDS``: their stop would only wait on calls to it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prefect_webhooks.serving.api_watch import ApiWatcher, restart_runner
from prefect_webhooks.serving.processes import dead_local_owners, descendant_pids, terminate_and_wait
from prefect_webhooks.serving.pruner import pruner_command
from prefect_webhooks.serving.restarts import Restarts

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

# The store and HTTP client are imported where they are used: ``serve`` starts its parts first, so what is due is
# delivered within seconds of the start.

INGEST_READY_TIMEOUT = 60.0
RUNNER_NICENESS = 10
DEFAULT_GRACE_SECONDS = 30.0
# While the Prefect API is down, the runner and the pruner spend a stop retrying calls that cannot succeed (21 s of
# a 30 s grace, measured), and their runs could not report their end anyway.
OUTAGE_STOP_SECONDS = 5.0


def create_service_app() -> Any:
    """The ingest API app (its monitoring and admin routes included) with the console's pages, in a process tuned
    for serving (a uvicorn ``--factory`` target)."""
    from prefect_webhooks.console import add_console_routes
    from prefect_webhooks.inbound.api import create_app
    from prefect_webhooks.settings import get_settings
    from prefect_webhooks.store.dedupe.seen_ids import hold_seen_filters
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.log.filters import hold_filters
    from prefect_webhooks.utilities.runtime import tune_gc_for_serving

    engine = get_engine()
    hold_seen_filters(engine)  # before the first call, not in it: seconds with a long dedupe window kept
    app = create_app(engine=engine)
    add_console_routes(app, engine)
    if get_settings().active_admin_token() is not None:  # lookups are served: their filters are read before the first
        threading.Thread(target=hold_filters, args=(engine,), name="hold-filters", daemon=True).start()
    tune_gc_for_serving()
    return app


def ingest_command(host: str, port: int, workers: int = 1) -> list[str]:
    """The command line that runs the ingest API on ``host:port`` (``workers`` processes sharing the port)."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "prefect_webhooks.serving.service:create_service_app",
        "--factory",
        "--host",
        host,
        "--port",
        str(port),
        "--no-access-log",
        # Clients (SDKs) keep connections open between flushes.
        "--timeout-keep-alive",
        "30",
        # Let in-flight requests finish on SIGTERM, but not forever.
        "--timeout-graceful-shutdown",
        "20",
        *(["--workers", str(workers)] if workers > 1 else []),
    ]


def delivery_worker_command(*, start_deletion_runs: bool = False) -> list[str]:
    """The command line of one delivery worker (``prefect_webhooks.serving.delivery_worker``); the first one also
    starts the deletions runs when a request waits."""
    command = [sys.executable, "-m", "prefect_webhooks.serving.delivery_worker"]
    return [*command, "--start-deletion-runs"] if start_deletion_runs else command


def deployments_command(limit: int | None = None, *, deliver: bool = False) -> list[str]:
    """The command line that serves the deployments (``deployments/serve.py``); ``deliver/continuous`` only when
    ``deliver`` (``serve`` runs it in delivery workers instead, which then start the deletions runs on demand), never
    ``prune/retention`` (the pruner's job)."""
    command = [sys.executable, "-m", "prefect_webhooks.deployments.serve", "--no-prune"]
    if limit:
        command += ["--limit", str(limit)]
    if not deliver:
        command += ["--no-deliver", "--deletions-on-demand"]
    return command


_PR_SET_PDEATHSIG = 1


def stop_with_parent(signum: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send ``signum`` to the child when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork: the child only makes the call
    supervisor = os.getpid()

    def set_death_signal() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signum)
        if os.getppid() != supervisor:
            # The supervisor died between fork and prctl: nobody will send the signal, so do not start at all.
            os._exit(1)

    return set_death_signal


@dataclass
class Child:
    """A supervised child process, started in its own process group."""

    name: str
    command: list[str]
    env: dict[str, str] | None = None
    stop_signal: int = signal.SIGTERM
    # The runner kills its flow-run processes with SIGKILL when it stops, so their runs would stay "Running" in the
    # UI. Sent SIGTERM first, a flow-run process reports its run as Crashed and exits.
    terminate_descendants_first: bool = False
    # Added to the child's nice value: parts that are not on the path of a message yield the CPU to those that are.
    niceness: int = 0
    # Started again when it exits (the runner), instead of stopping the service.
    restarts: Restarts | None = None
    # Its grace while the Prefect API is down, when its stop only waits on calls to it (the runner, the pruner).
    outage_grace: float | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> Child:
        """Start the process in a new session so terminal signals reach only the supervisor.

        On Linux the child also gets its stop signal when the supervisor dies (``PR_SET_PDEATHSIG``): a killed
        ``serve`` must not leave an ingest API holding its port, or a runner still starting flow runs.
        """
        death_signal = stop_with_parent(self.stop_signal)
        niceness = self.niceness

        def prepare() -> None:
            if death_signal is not None:
                death_signal()
            if niceness:
                os.nice(niceness)

        self.process = subprocess.Popen(self.command, env=self.env, start_new_session=True, preexec_fn=prepare)
        return self

    def running(self) -> bool:
        """Whether the process is still alive."""
        return self.process is not None and self.process.poll() is None

    def terminate(self, descendants_grace: float = 10.0) -> None:
        """Send the stop signal to the process (not its group: it stops its own children in order).

        With ``terminate_descendants_first`` its descendants get SIGTERM first and up to ``descendants_grace``
        seconds to exit.
        """
        if not self.running():
            return
        assert self.process is not None
        if self.terminate_descendants_first:
            terminate_and_wait(descendant_pids(self.process.pid), descendants_grace)
        self.process.send_signal(self.stop_signal)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True when it exited."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill_group(self, timeout: float = 5.0, term_seconds: float = 10.0) -> None:
        """Stop what is left of the process group (the child and anything it left behind) and wait until it is gone.

        The group first gets SIGTERM and ``term_seconds`` to exit: a flow-run process left behind by the runner
        then reports its run as Crashed to Prefect (a SIGKILLed one would stay Running in the UI forever).
        Whatever is still there after that gets SIGKILL.
        """
        if self.process is None:
            return
        if self._signal_group(signal.SIGTERM):
            self.wait(term_seconds)
            self._wait_group_gone(term_seconds)
        if self._signal_group(signal.SIGKILL):
            self.wait(timeout)
            self._wait_group_gone(timeout)

    def _signal_group(self, signum: int) -> bool:
        """Send ``signum`` to the group; False when the group no longer exists."""
        assert self.process is not None
        try:
            os.killpg(self.process.pid, signum)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def _wait_group_gone(self, timeout: float) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        # Grandchildren (flow-run processes) are reaped by init a moment after they exit.
        while time.monotonic() < deadline:
            if not self._signal_group(0):
                return True
            time.sleep(0.05)
        return False


def release_dead_local_leases(engine: Engine | None = None) -> int:
    """Return to pending, at once, the rows leased by delivery processes of this host that no longer exist.

    A flow run stopped mid-batch cannot record outcomes; its rows would come back anyway when the lease expires.
    Releasing them now lets the next run (after a restart) take them without waiting ``lease_seconds``.

    Returns:
        How many rows were released.
    """
    from sqlalchemy import select, update

    from prefect_webhooks.messages.outcomes import PENDING
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.schema.tables import OutboxMessage

    engine = engine or get_engine()
    table = OutboxMessage.__table__
    with engine.begin() as connection:
        owners = connection.execute(
            select(table.c.lease_owner).where(table.c.state == PENDING, table.c.lease_owner.is_not(None)).distinct()
        ).scalars()
        dead = dead_local_owners(list(owners))
        if not dead:
            return 0
        released = connection.execute(
            update(table)
            .where(table.c.state == PENDING, table.c.lease_owner.in_(dead))
            .values(lease_owner=None, lease_expires_at=None)
        )
        return released.rowcount


def wait_for_ingest(base_url: str, child: Child, timeout: float = INGEST_READY_TIMEOUT) -> None:
    """Block until the ingest API answers ``/health/backlog``; raise if the child dies or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.running():
            raise RuntimeError(f"{child.name} exited before it was ready")
        try:
            if httpx.get(f"{base_url}/health/backlog", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{child.name} not ready after {timeout:.0f} s")


def stop_children(children: Sequence[Child | Sequence[Child]], grace_seconds: float, *, api_down: bool = False) -> None:
    """Stop children in order (a list of children stops together): each gets its stop signal and
    ``grace_seconds`` (its ``outage_grace`` when ``api_down``), then its group is killed."""
    for stage in children:
        together = [stage] if isinstance(stage, Child) else list(stage)
        asked = time.monotonic()
        for child in together:
            child.terminate()
        grace = min([grace_seconds, *(child.outage_grace for child in together if api_down and child.outage_grace)])
        deadline = asked + grace
        for child in together:
            if not child.wait(max(deadline - time.monotonic(), 0.0)):
                print(f"prefect-webhooks serve: {child.name} did not stop in {grace:.0f} s; killing it",
                      file=sys.stderr)
            else:
                # Where a stop's time goes (a rolling restart waits for it), said for each stage.
                print(f"prefect-webhooks serve: {child.name} stopped in {time.monotonic() - asked:.1f} s", flush=True)
        for child in together:
            # Anything left in the group (a flow-run process) goes too, reporting its run as Crashed; ``serve``
            # then releases what it had claimed.
            child.kill_group()


def _install_stop_handlers(stop: threading.Event) -> None:
    def request_stop(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)


def serve(
    host: str | None = None,
    port: int | None = None,
    *,
    limit: int | None = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    ingest_workers: int = 1,
    delivery_workers: int = 1,
) -> int:
    """Run the ingest API, the delivery workers and the served deployments until SIGTERM/SIGINT or until one dies.

    Args:
        host: Address for the ingest API; ``settings.ingest.ingest_host`` by default.
        port: Port for the ingest API; ``settings.ingest.ingest_port`` by default.
        limit: Most flow runs the runner executes at once (None: Prefect's default).
        grace_seconds: How long each child gets to stop before its process group is killed.
        ingest_workers: Ingest API processes sharing the port (more than one is for PostgreSQL: on SQLite they
            take turns at the one write lock).
        delivery_workers: Delivery worker processes (their claims are disjoint); 0 leaves ``deliver/continuous``
            to the runner, which starts a process per scheduled run as a work pool would.

    Returns:
        0 after a requested shutdown, 1 when a child exited on its own, 2 when no Prefect server is set.
    """
    from prefect_webhooks.utilities.prefect_api import require_prefect_api

    try:
        api_url = require_prefect_api(export=True)  # before any child: none may start a temporary server
    except LookupError as exc:
        print(f"prefect-webhooks serve: {exc}", file=sys.stderr, flush=True)
        return 2
    stop = threading.Event()
    _install_stop_handlers(stop)
    # The delivery workers start first, before this process reads its settings (a third of a second of imports):
    # what is already due is delivered while the API starts. The stop order: stop accepting, then stop delivering,
    # then the other deployments.
    workers = [Child(f"delivery worker {number}", delivery_worker_command(start_deletion_runs=number == 1)).start()
               for number in range(1, delivery_workers + 1)]
    try:
        from prefect_webhooks.settings import get_settings

        settings = get_settings()
        host = host or settings.ingest.ingest_host
        port = port or settings.ingest.ingest_port
        api = Child("ingest API", ingest_command(host, port, ingest_workers)).start()
        print(f"prefect-webhooks serve: store {settings.store.location()}, Prefect API {api_url}", flush=True)
    except BaseException:
        stop_children([workers], grace_seconds)
        raise
    children: list[Child] = [api, *workers]
    stages: list[Child | list[Child]] = [api, workers]
    watcher = ApiWatcher(api_url)
    exit_code = 0
    try:
        wait_for_ingest(f"http://{host}:{port}", api)
        # The runner handles SIGINT as a clean stop (SIGTERM makes it exit from inside its signal handler).
        # The other deployments (deletions, audience syncs, replays) run niced: an audience sync of a million members
        # takes seconds of CPU that must not come out of ingest and delivery on a small machine.
        runner = Child(
            "deployments",
            deployments_command(limit, deliver=not delivery_workers),
            stop_signal=signal.SIGINT,
            terminate_descendants_first=True,
            niceness=RUNNER_NICENESS,
            restarts=Restarts(),
            outage_grace=OUTAGE_STOP_SECONDS,
        ).start()
        # Retention passes, niced too, every PREFECT_WEBHOOKS_RETENTION_INTERVAL (serving/pruner.py).
        pruner = Child("pruner", pruner_command(), niceness=RUNNER_NICENESS, outage_grace=OUTAGE_STOP_SECONDS).start()
        children += [runner, pruner]
        stages += [runner, pruner]
        print(f"prefect-webhooks serve: ingest API on http://{host}:{port}, {delivery_workers} delivery worker(s), "
              "deployments served", flush=True)
        # A runner that lived through an outage of the Prefect API is replaced once it answers again (api_watch).
        watcher.start()
        while not stop.wait(0.5):
            if watcher.returned.is_set():
                watcher.returned.clear()
                restart_runner(runner, grace_seconds)
            dead = [child for child in children if not child.running()]
            for child in dead:
                if child.restarts is not None:
                    child.restarts.tend(child)
            dead = [child for child in dead if child.restarts is None]
            if dead:
                print(f"prefect-webhooks serve: {dead[0].name} exited; stopping", file=sys.stderr, flush=True)
                exit_code = 1
                break
    except (RuntimeError, TimeoutError) as exc:
        print(f"prefect-webhooks serve: {exc}", file=sys.stderr, flush=True)
        exit_code = 1
    finally:
        watcher.stop()
        stop_children(stages, grace_seconds, api_down=watcher.watch.down_since is not None)
        released = release_dead_local_leases()
        if released:
            print(f"prefect-webhooks serve: {released} interrupted deliveries returned to pending", flush=True)
    return exit_code
