"""Saving and loading blocks from async code on every supported Prefect release, telling a missing block, and
writing a list of models with secrets the way Prefect's own serialiser cannot."""

from __future__ import annotations

from typing import Any, TypeVar
from uuid import UUID

from prefect.blocks.core import Block
from prefect.exceptions import ObjectNotFound
from pydantic import BaseModel

BlockT = TypeVar("BlockT", bound=Block)


async def save_block(block: Block, name: str, *, overwrite: bool = False) -> UUID:
    """Save ``block`` as ``name`` from async code, on every Prefect 3 release.

    ``Block.asave`` exists from Prefect 3.7; before, ``save`` is the coroutine in async code. ``_sync=False`` asks
    both forms for the coroutine, also inside a sync flow run.
    """
    return await block.save(name, overwrite=overwrite, _sync=False)  # type: ignore[call-arg,misc]


async def load_block(block_type: type[BlockT], name: str) -> BlockT:
    """Load the saved block ``name`` from async code, on every Prefect 3 release (``aload`` exists from 3.5)."""
    return await block_type.load(name, _sync=False)  # type: ignore[call-arg,misc]


def is_missing_block(exc: BaseException) -> bool:
    """Whether ``exc``, raised while loading a block, means no block document of that name is saved.

    Prefect reports a missing document as an ``ObjectNotFound`` from its API client, re-raised by ``Block.load`` as
    a ``ValueError`` chained to it; the chain is checked, never the message text.
    """
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ObjectNotFound):
            return True
        cause = cause.__cause__
    return False


def revealed(value: Any) -> Any:
    """``value`` as plain data with every secret in the clear, for the block document a save writes.

    Prefect's block serialiser walks a field holding secrets with a visitor that caches its results by ``id()`` of
    temporaries it lets go: in a list of three or more models with secrets, a later item can be written as a copy
    of an earlier one (a destination's third endpoint saved as its first). A block serialises such fields itself
    with this instead.
    """
    if hasattr(value, "get_secret_value"):
        return revealed(value.get_secret_value())
    if isinstance(value, BaseModel):
        return {name: revealed(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, (list, tuple)):
        return [revealed(item) for item in value]
    if isinstance(value, dict):
        return {key: revealed(item) for key, item in value.items()}
    return value
