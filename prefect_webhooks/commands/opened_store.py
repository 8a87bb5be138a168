"""The store a command reads or writes: the configured one, upgraded first when an earlier release wrote it (as
``serve``'s processes upgrade it). A store that is missing, or that needs an upgrade this process cannot write, ends
the command in one line and exit code 1, never a traceback."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def opened_store(command: str) -> Engine:
    """The configured store for ``command``; a missing or un-upgradable one ends it with the reason on stderr."""
    # Imported here: the command line starts without the store's modules (each command loads what it uses).
    from prefect_webhooks.store.engine.engines import StoreNotFound, StoreNotUpgraded, open_existing_store

    try:
        return open_existing_store()
    except (StoreNotFound, StoreNotUpgraded) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
