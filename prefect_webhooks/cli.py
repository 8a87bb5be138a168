"""The ``prefect-webhooks`` console command.

Each subcommand is a ``Command``: a name, a help line, a function adding its options to an argparse parser and a
function running it. To add one, write those two functions and append a ``Command`` to ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prefect_webhooks.settings import get_settings


@dataclass(frozen=True)
class Command:
    """One subcommand of ``prefect-webhooks``."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _configure_ingest(parser: argparse.ArgumentParser) -> None:
    settings = get_settings()
    parser.add_argument("--host", default=settings.ingest_host, help="Address to listen on (default: %(default)s).")
    parser.add_argument("--port", type=int, default=settings.ingest_port, help="Port (default: %(default)s).")
    parser.add_argument(
        "--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn log level (default: %(default)s).",
    )
    parser.add_argument("--access-log", action="store_true", help="Log one line per request (paths, no bodies).")
    parser.add_argument(
        "--workers", type=int, default=1,
        help="Processes sharing the port (default: %(default)s); more than one is for PostgreSQL: on SQLite they "
        "take turns at the one write lock.",
    )


def _run_ingest(args: argparse.Namespace) -> int:
    import uvicorn

    from prefect_webhooks.api import create_app
    from prefect_webhooks.runtime import tune_gc_for_serving

    if args.workers > 1:
        # Each worker process builds its own app (and store engine) from the factory.
        app: object = "prefect_webhooks.service:create_service_app"
        options: dict[str, object] = {"factory": True, "workers": args.workers}
    else:
        app, options = create_app(), {}
        tune_gc_for_serving()
    uvicorn.run(
        app,  # type: ignore[arg-type]
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        # Clients (SDKs) keep connections open between flushes.
        timeout_keep_alive=30,
        **options,  # type: ignore[arg-type]
    )
    return 0


def _lazy(module: str, configure_name: str, run_name: str) -> tuple[Callable[..., None], Callable[..., int]]:
    """A command's two functions from ``prefect_webhooks.<module>``, imported only when the command is used."""
    import importlib

    def configure(parser: argparse.ArgumentParser) -> None:
        getattr(importlib.import_module(f"prefect_webhooks.{module}"), configure_name)(parser)

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(f"prefect_webhooks.{module}"), run_name)(args)

    return configure, run


COMMANDS: list[Command] = [
    Command("ingest", "Run the Segment-compatible ingest API (uvicorn).", _configure_ingest, _run_ingest),
    Command(
        "serve",
        "Run the ingest API and the served deployments on this machine.",
        *_lazy("service", "configure_serve", "run_serve"),
    ),
    Command(
        "status",
        "Print backlog depth, oldest pending age and outcome counts.",
        *_lazy("metrics", "configure_status", "run_status"),
    ),
    Command("demo", "Run the end-to-end demo on embedded defaults.", *_lazy("demo", "configure_demo", "run_demo_cli")),
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="prefect-webhooks", description="prefect-webhooks command line.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        command.configure(sub)
        sub.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``prefect-webhooks`` console command; returns the exit status."""
    args = build_parser().parse_args(argv)
    return args._run(args)


if __name__ == "__main__":
    sys.exit(main())
