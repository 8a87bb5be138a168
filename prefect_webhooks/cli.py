"""The ``prefect-webhooks`` console command (typer; tables printed with rich).

Each subcommand is a function decorated with ``@app.command()``: its parameters are the options, each with a help
text, and it ends with ``raise typer.Exit(status)`` when the status is not 0. Heavy modules (uvicorn, the API,
Prefect) are imported inside the command that needs them, so ``--help`` stays fast.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from prefect_webhooks.commands.endpoints import endpoint_app
from prefect_webhooks.commands.messages import messages_app
from prefect_webhooks.commands.named_blocks import named_block
from prefect_webhooks.commands.replay import replay
from prefect_webhooks.serving.service import DEFAULT_GRACE_SECONDS
from prefect_webhooks.utilities.prefect_api import exit_without_prefect_api

# Only light modules at the top: `prefect-webhooks serve` starts its delivery workers before anything heavy is read.
DEMO_TIMEOUT_SECONDS = 170.0
# How long `status` waits for the Prefect API to check the saved destinations.
STATUS_API_WAIT_SECONDS = 5.0

app = typer.Typer(
    name="prefect-webhooks",
    help="prefect-webhooks: a Segment-compatible ingest API and signed webhook delivery on Prefect.",
    no_args_is_help=True,
    add_completion=False,
    # A failing command prints its own message: typer's tracebacks show local variables, which may hold secrets.
    pretty_exceptions_enable=False,
)
app.add_typer(endpoint_app, name="endpoint")
app.add_typer(messages_app, name="messages")

HostOption = Annotated[
    str | None,
    typer.Option(help="Address the ingest API listens on (default: the ingest_host setting, 127.0.0.1)."),
]
PortOption = Annotated[
    int | None,
    typer.Option(help="Port of the ingest API (default: the ingest_port setting, 8088).", min=1, max=65535),
]


class LogLevel(str, Enum):
    """uvicorn's log levels."""

    critical = "critical"
    error = "error"
    warning = "warning"
    info = "info"
    debug = "debug"


@app.command()
def ingest(
    host: HostOption = None,
    port: PortOption = None,
    log_level: Annotated[LogLevel, typer.Option(help="uvicorn log level.")] = LogLevel.warning,
    access_log: Annotated[
        bool, typer.Option("--access-log", help="Log one line per request (paths, never bodies).")
    ] = False,
    workers: Annotated[
        int,
        typer.Option(
            help="API processes sharing the port; more than one is for PostgreSQL (on SQLite they take turns at the "
            "one write lock).",
            min=1,
        ),
    ] = 1,
) -> None:
    """Run the Segment-compatible ingest API (uvicorn)."""
    import uvicorn

    from prefect_webhooks.serving.service import create_service_app
    from prefect_webhooks.settings import get_settings

    settings = get_settings()
    if workers > 1:
        # Each process builds its own app (and store engine) from the factory; uvicorn shares the port among them.
        app_or_factory: Any = "prefect_webhooks.serving.service:create_service_app"
        options: dict[str, Any] = {"factory": True, "workers": workers}
    else:
        app_or_factory, options = create_service_app(), {}
    uvicorn.run(
        app_or_factory,
        host=host or settings.ingest.ingest_host,
        port=port or settings.ingest.ingest_port,
        log_level=log_level.value,
        access_log=access_log,
        # Clients (SDKs) keep connections open between flushes.
        timeout_keep_alive=30,
        **options,
    )


@app.command()
def serve(
    host: HostOption = None,
    port: PortOption = None,
    limit: Annotated[
        int | None,
        typer.Option(help="Most flow runs the served deployments execute at once (default: Prefect's).", min=1),
    ] = None,
    grace: Annotated[
        float,
        typer.Option(help="Seconds each part (API, delivery workers, runner) gets to stop before it is killed.", min=0),
    ] = DEFAULT_GRACE_SECONDS,
    ingest_workers: Annotated[
        int,
        typer.Option(help="Ingest API processes sharing the port; more than one is for PostgreSQL.", min=1),
    ] = 1,
    delivery_workers: Annotated[
        int,
        typer.Option(
            help="Delivery worker processes running deliver/continuous (their claims are disjoint); 0 leaves it to "
            "the runner, one process per scheduled run.",
            min=0,
        ),
    ] = 1,
) -> None:
    """Run the ingest API, the delivery workers and the served deployments (deployments/prefect.yaml) here.

    Needs PREFECT_API_URL (a running Prefect server) and refuses to start without one. Prints where the store is.
    Exits 1 when a part dies, so a process manager restarts it.
    """
    from prefect_webhooks.serving.service import serve as run_service

    raise typer.Exit(
        run_service(
            host,
            port,
            limit=limit,
            grace_seconds=grace,
            ingest_workers=ingest_workers,
            delivery_workers=delivery_workers,
        )
    )


@app.command()
def status(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the JSON health document instead of a table.")
    ] = False,
    prometheus: Annotated[
        bool, typer.Option("--prometheus", help="Print the Prometheus text instead of a table.")
    ] = False,
) -> None:
    """Print backlog depth, oldest pending age and outcome counts per destination, and how many messages the
    message log keeps, read from the store.

    The store is PREFECT_WEBHOOKS_DATABASE_URL, or the SQLite file webhooks.db in PREFECT_WEBHOOKS_HOME
    (~/.prefect-webhooks by default); its location is printed first (to standard error with --json or --prometheus).
    A store that does not exist is an error: status never creates one. A store an earlier release wrote is upgraded
    first, as serve upgrades it (what was done is said on standard error).
    """
    from prefect_webhooks.commands.opened_store import opened_store
    from prefect_webhooks.settings import get_settings
    from prefect_webhooks.store.dedupe.seen_ids import remembered_ids
    from prefect_webhooks.store.figures.metrics import backlog_snapshot, health_document, prometheus_text, status_table
    from prefect_webhooks.store.log.partitions import kept_counts

    engine = opened_store("status")
    print(f"store: {get_settings().store.location()}",
          file=sys.stderr if as_json or prometheus else sys.stdout)
    snapshot = {**backlog_snapshot(engine), "kept": kept_counts(engine), "remembered": remembered_ids(engine)}
    if as_json:
        print(json.dumps(health_document(snapshot), indent=2))
    elif prometheus:
        print(prometheus_text(snapshot), end="")
    else:
        print(status_table(snapshot))
    _warn_about_saved_destinations()


def _warn_about_saved_destinations() -> None:
    """``status``'s warnings about saved destinations (a short shared secret), on standard error, when a Prefect API
    is set; status itself reads only the store, so an API that does not answer is said and skipped."""
    import asyncio

    from prefect_webhooks.blocks.secret_length import saved_short_secret_warnings
    from prefect_webhooks.utilities.prefect_api import prefect_api_url

    if not prefect_api_url():
        return
    try:
        warnings = asyncio.run(asyncio.wait_for(saved_short_secret_warnings(), STATUS_API_WAIT_SECONDS))
    except Exception as exc:
        print(f"status: destinations not checked (the Prefect API did not answer: {type(exc).__name__})",
              file=sys.stderr)
        return
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


@app.command()
def deploy(
    pool: Annotated[
        str,
        typer.Option(help="Process work pool to deploy to; created when missing (names starting with 'prefect' are "
                     "Prefect's)."),
    ],
    run: Annotated[
        bool,
        typer.Option("--run/--no-run", help="Start a first deliver/continuous run at once instead of at the next "
                     "scheduled one."),
    ] = True,
) -> None:
    """Deploy the served deployments (deployments/prefect.yaml and the audiences file) to a work pool.

    The same deployments serve runs, from the installed package: no clone or prefect.yaml needed. Then start a worker
    on each host that delivers: prefect worker start --pool POOL.
    """
    exit_without_prefect_api("deploy")
    from prefect_webhooks.deployments.work_pool import deploy_to_work_pool

    try:
        done = deploy_to_work_pool(pool, start_delivery=run)
    except ValueError as exc:
        print(f"deploy: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    if done.pool_created:
        print(f"work pool {pool!r} created (type process)")
    print(f"deployed to work pool {pool!r}: {', '.join(done.deployments)}")
    if done.first_deliver_run:
        print(f"first deliver run {done.first_deliver_run} started: a worker picks it up at its next poll")
    print(f"start a worker on each host that delivers: prefect worker start --pool {pool}")


@app.command()
def prune(
    store_only: Annotated[
        bool,
        typer.Option("--store-only", help="Prune the store alone: no flow run in Prefect, old Prefect runs kept "
                     "(for a store whose Prefect server is away)."),
    ] = False,
) -> None:
    """Run one retention pass now: messages older than their retention (PREFECT_WEBHOOKS_RETENTION_DELIVERED,
    PREFECT_WEBHOOKS_RETENTION_FAILED) with their attempts, old messageIds, and prefect-webhooks' flow runs older
    than PREFECT_WEBHOOKS_RETENTION_RUNS."""
    from prefect_webhooks.utilities.tables import table_text

    if store_only:
        from prefect_webhooks.store.upkeep.retention import prune_store

        report = prune_store()
        if not report.skipped:
            print(table_text(tuple(report.table()[0]), [tuple(row.values()) for row in report.table()]))
        print(report.summary())
        return
    exit_without_prefect_api("prune", also="or prune the store alone with --store-only")
    from prefect_webhooks.flows.prune import prune as prune_flow
    from prefect_webhooks.flows.prune import result_text

    print(result_text(prune_flow()))  # its run carries the prefect-webhooks tag (a tagged flow)


@app.command()
def preview(
    destination: Annotated[str, typer.Argument(help="Name of the saved WebhookDestination block.")],
    message: Annotated[
        Path,
        typer.Option(help="JSON file with one outbound message, or a list of them ('-': standard input).",
                     allow_dash=True),
    ],
) -> None:
    """Print the exact requests (method, URL, headers, signatures, body) a destination would make for a message,
    without sending anything; secret header values are masked."""
    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.delivery.endpoints.preview import check_messages, preview_requests
    exit_without_prefect_api("preview")
    try:
        text = sys.stdin.read() if str(message) == "-" else message.read_text(encoding="utf-8")
        messages = check_messages(json.loads(text))
    except (OSError, ValueError) as exc:
        print(f"preview: {message}: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    with named_block("preview", "WebhookDestination", destination):
        block = WebhookDestination.load(destination)
    print("\n\n".join(request.text() for request in preview_requests(block, messages)))


@app.command()
def demo(
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Folder for this run: store, Prefect database, logs (default: a new temporary folder)."),
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds the traffic part may take before the demo gives up.", min=1)
    ] = DEMO_TIMEOUT_SECONDS,
    linger: Annotated[
        float, typer.Option(help="Seconds to keep everything up after the summary, to browse the Prefect UI.", min=0)
    ] = 0.0,
) -> None:
    """Run the end-to-end demo on embedded defaults: a local Prefect server, the service, a receiver; then stop."""
    from prefect_webhooks.demo.run import run_demo

    raise typer.Exit(run_demo(run_dir, timeout=timeout, linger=linger))


@app.command("rotate-secret")
def rotate_secret(
    block: Annotated[str, typer.Argument(help="Name of the saved WebhookDestination block.")],
    generate: Annotated[
        bool, typer.Option("--generate", help="Generate a new whsec_ secret and print it once.")
    ] = False,
    from_env: Annotated[
        str | None, typer.Option(metavar="VARIABLE", help="Read the new secret from this environment variable.")
    ] = None,
    from_stdin: Annotated[
        bool, typer.Option("--from-stdin", help="Read the new secret from the first line of standard input.")
    ] = False,
    window: Annotated[
        str,
        typer.Option(help="How long the old secret stays valid: seconds, or 90s, 30m, 24h, 7d; 0 switches at once."),
    ] = "24h",
    force: Annotated[
        bool,
        typer.Option("--force", help="Rotate even while a rotation is in progress (the oldest secret is dropped)."),
    ] = False,
) -> None:
    """Rotate a destination's shared secret with no downtime: the old one stays valid for a window.

    The secret is never a command-line argument (shell history, process lists): generate one, or read it from an
    environment variable or standard input.
    """
    from prefect_webhooks.blocks.destination import RotationInProgress
    from prefect_webhooks.blocks.rotation import describe_rotation, rotate_destination_secret
    from prefect_webhooks.utilities.durations import parse_duration
    exit_without_prefect_api("rotate-secret")
    if sum((generate, from_env is not None, from_stdin)) != 1:
        raise typer.BadParameter("give exactly one of --generate, --from-env or --from-stdin")
    try:
        window_length = parse_duration(window)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--window") from None
    new_secret: str | None = None
    if from_env is not None:
        new_secret = os.environ.get(from_env)
        if not new_secret:
            print(f"rotate-secret: environment variable {from_env} is not set or empty", file=sys.stderr)
            raise typer.Exit(1)
    elif from_stdin:
        new_secret = sys.stdin.readline().rstrip("\r\n")
    try:
        with named_block("rotate-secret", "WebhookDestination", block):
            outcome = rotate_destination_secret(block, new_secret, window_length, force)
    except RotationInProgress as exc:
        print(f"rotate-secret: a rotation of {exc.name!r} is in progress until {exc.until.isoformat()}; rotate again "
              "after it ends, or add --force to drop the older secret now", file=sys.stderr)
        raise typer.Exit(1) from None
    except ValueError as exc:
        print(f"rotate-secret: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    print(describe_rotation(outcome))


app.command()(replay)


class _NoDrainProgress(logging.Filter):
    """Drops Prefect's ``Still processing items: N items remaining...``: logged at exit whenever an event or a log
    line is still queued when its worker drains (it is sent all the same), it closed every short command that had
    saved or loaded a block and read as a failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Still processing items")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``prefect-webhooks`` console command; returns the exit status."""
    for worker in ("EventsWorker", "APILogWorker"):
        logging.getLogger(worker).addFilter(_NoDrainProgress())
    try:
        app(args=list(argv) if argv is not None else None, prog_name="prefect-webhooks")
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(exit_.code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
