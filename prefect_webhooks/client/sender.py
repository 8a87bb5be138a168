"""The sender thread: waits for a batch in the queue, uploads it, and reports how it ended."""

from __future__ import annotations

import threading

from prefect_webhooks.client.batching import MessageQueue, QueuedMessage
from prefect_webhooks.client.connection import BatchPoster
from prefect_webhooks.client.errors import UploadError
from prefect_webhooks.client.logs import logger
from prefect_webhooks.client.reporter import Reporter
from prefect_webhooks.client.upload import RetryPolicy, upload_batch


class Sender(threading.Thread):
    """One sender thread with its own keep-alive connection: queue → batch → upload → counters and callbacks.

    Its connection (and the connection's TLS context) is made by the calling thread, before the sender starts: made in
    the new thread, an ``os.fork()`` landing mid-construction would leave OpenSSL's lock held in the child. A daemon,
    so a forgotten client cannot keep the process alive; the client's exit hook does the last flush.
    """

    def __init__(
        self,
        name: str,
        queue: MessageQueue,
        poster: BatchPoster,
        policy: RetryPolicy,
        flush_after: float,
        abort: threading.Event,
        reporter: Reporter,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.queue = queue
        self.poster = poster
        self.policy = policy
        self.flush_after = flush_after
        self.abort = abort
        self.reporter = reporter

    def run(self) -> None:
        """Upload batch after batch until the queue is closed and empty."""
        try:
            while (taken := self.queue.take(self.flush_after)) is not None:
                batch_id, batch = taken
                try:
                    self._upload(batch)
                finally:
                    self.queue.settle(batch_id)
        finally:
            self.poster.close()

    def _upload(self, batch: list[QueuedMessage]) -> None:
        try:
            upload_batch(self.poster, batch, self.policy, self.abort)
        except UploadError as error:
            self.reporter.batch_failed(batch, error)
        except Exception as exc:  # the thread must survive anything, and report the batch
            logger.exception("unexpected error sending a batch")
            self.reporter.batch_failed(batch, UploadError(f"unexpected error: {type(exc).__name__}: {exc}"))
        else:
            self.reporter.batch_uploaded(batch)
