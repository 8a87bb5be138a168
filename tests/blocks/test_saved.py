"""Saving and loading blocks on every supported Prefect release, and telling a missing block."""

from __future__ import annotations

import uuid

import pytest

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.saved import is_missing_block, load_block
from prefect_webhooks.blocks.source import Source


@pytest.mark.usefixtures("prefect_harness")
async def test_a_missing_block_is_told_by_prefects_not_found_error_not_by_its_text() -> None:
    with pytest.raises(Exception) as caught:
        await load_block(WebhookDestination, f"missing-{uuid.uuid4().hex[:8]}")
    assert is_missing_block(caught.value)
    with pytest.raises(Exception) as caught:
        Source.load(f"missing-{uuid.uuid4().hex[:8]}", _sync=True)
    assert is_missing_block(caught.value)
    assert not is_missing_block(ValueError("Unable to find block document named x for block type y"))
    assert not is_missing_block(RuntimeError("the Prefect API is unreachable"))
