"""Saving and loading blocks from async code on every supported Prefect release, and telling a missing block."""

from __future__ import annotations

from typing import Any, TypeVar
from uuid import UUID

from prefect import get_client
from prefect.blocks.core import Block
from prefect.exceptions import ObjectNotFound

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
