"""The Prefect task that delivers one claimed batch (``deliver-batch`` in the UI), its retries taken from settings.

A task retry is the short-term policy: the messages a try could not deliver stay leased by this process and are sent
again after Prefect's wait, ``exponential_backoff`` from ``retry_base_delay`` capped at ``retry_max_delay`` (the first
steps of the outbox's own backoff). On the final try whatever is left goes back to the outbox at its backoff time.
"""

from __future__ import annotations

from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext
from prefect.logging import get_run_logger
from prefect.tasks import exponential_backoff

from prefect_webhooks.delivery.batch import process_batch
from prefect_webhooks.delivery.context import ClaimedBatch, DeliveryContext
from prefect_webhooks.messages.retry import JITTER, RetryableDeliveryError, is_retryable_delivery_error
from prefect_webhooks.settings import WebhooksSettings


def task_retry_delays(settings: WebhooksSettings) -> list[float]:
    """The task's ``retry_delay_seconds``: ``retry_base_delay`` doubling per retry, at most ``retry_max_delay``."""
    delays = exponential_backoff(backoff_factor=settings.delivery.retry_base_delay)(settings.delivery.task_retries)
    return [min(delay, settings.delivery.retry_max_delay) for delay in delays]


@task(
    name="deliver-batch",
    cache_policy=NO_CACHE,
    retry_condition_fn=is_retryable_delivery_error,
    retry_jitter_factor=JITTER,
    persist_result=False,
)
async def deliver_batch(batch: ClaimedBatch, context: DeliveryContext) -> dict[str, int]:
    """Deliver one claimed batch; raise ``RetryableDeliveryError`` so Prefect retries what is left.

    The retries are those ``delivery_task`` configures from ``context.settings``; Prefect's jitter (factor 0.2)
    draws each wait from about 0.36x to 1.2x of it. On a retry only the rows still pending, leased by this process
    and due are sent. On the final try the task returns normally and whatever is left waits in the outbox for a later
    run, with the same deadline.
    """
    task_context = TaskRunContext.get()
    run_count = max(task_context.task_run.run_count, 1) if task_context is not None else 1
    delays = task_retry_delays(context.settings)
    next_delay = delays[run_count - 1] if run_count <= len(delays) else None
    result = await process_batch(batch, context, first_try=run_count == 1, hold_seconds=next_delay,
                                 log=get_run_logger())
    if result.held:
        # ``decide`` already extended the held rows' lease past the task's wait.
        raise RetryableDeliveryError(f"{len(result.held)} message(s) will be retried in about {next_delay:g} s")
    return result.counts()


def delivery_task(settings: WebhooksSettings) -> Task[Any, Any]:
    """``deliver_batch`` with the retries of ``settings`` (the ones its runs get as ``context.settings``)."""
    return deliver_batch.with_options(
        retries=settings.delivery.task_retries, retry_delay_seconds=task_retry_delays(settings)
    )
