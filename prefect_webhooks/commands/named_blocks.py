"""A command's saved block that is missing or broken, answered in one line and exit code 1, never a traceback.

Every command that takes a block's name reads it inside ``named_block(command, block_type, name)``: a missing
document says which block type and name were looked for, an invalid one says which fields are wrong (without secret
values), and any other failure is left to rise as it is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer


@contextmanager
def named_block(command: str, block_type: str, name: str) -> Iterator[None]:
    """Run the body; a missing or invalid ``block_type`` block ``name`` ends ``command`` with one line on stderr."""
    # Imported here: the command line starts without Prefect (each command loads what it uses).
    from prefect_webhooks.blocks.saved import is_missing_block
    from prefect_webhooks.blocks.validated import InvalidBlockError

    try:
        yield
    except InvalidBlockError as exc:
        _refuse(command, str(exc))
    except Exception as exc:
        if not is_missing_block(exc):
            raise
        _refuse(command, f"no {block_type} block named {name!r} is saved")


def _refuse(command: str, reason: str) -> None:
    print(f"{command}: {reason}", file=sys.stderr)
    raise typer.Exit(1) from None
