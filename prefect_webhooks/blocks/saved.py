"""Saving and loading blocks from async code on every supported Prefect release, telling a missing block, and
writing a list of models with secrets the way Prefect's own serialiser cannot."""

from __future__ import annotations

import time
from typing import Any, Generic, TypeVar
from uuid import UUID

from prefect import get_client
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


class RecentBlocks(Generic[BlockT]):
    """Blocks of one type by name, each reused while it is younger than ``ttl`` seconds and the caller's count of
    its changes has not moved: a page shown again and again loads the block once, not each time.

    The count is read before the block is loaded, so a change that lands in between is loaded again next time.
    """

    def __init__(self, block_type: type[BlockT], ttl: float) -> None:
        self.block_type = block_type
        self.ttl = ttl
        self._entries: dict[str, tuple[float, int | None, BlockT]] = {}

    async def get(self, name: str, generation: int | None) -> BlockT:
        """The block ``name``: the one kept while fresh and loaded at ``generation``, else loaded again."""
        entry = self._entries.get(name)
        if entry is not None and entry[1] == generation and time.monotonic() - entry[0] < self.ttl:
            return entry[2]
        self._entries.pop(name, None)
        block = await load_block(self.block_type, name)
        self._entries[name] = (time.monotonic(), generation, block)
        return block


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


PAGE = 200


async def saved_documents(block_type_slug: str, *, include_secrets: bool = False) -> list[Any]:
    """Every named block document of one type, read page by page (none when the type was never registered)."""
    found: list[Any] = []
    async with get_client() as client:
        offset = 0
        while True:
            try:
                documents = await client.read_block_documents_by_type(
                    block_type_slug=block_type_slug, offset=offset, limit=PAGE, include_secrets=include_secrets
                )
            except ObjectNotFound:
                # No block of this type was ever saved on this server: the type is not registered.
                return found
            found += [document for document in documents if document.name and not document.is_anonymous]
            if len(documents) < PAGE:
                return found
            offset += PAGE


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
