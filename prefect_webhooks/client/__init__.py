"""The Analytics client: record identify/track/page/screen/group/alias calls in memory and upload them in batches.

Every call is validated when it is made, with the same message models the ingest API uses, and queued already
serialised. A sender thread uploads batches to ``{endpoint}/v1/batch`` when ``flush_at`` messages are waiting or
``flush_after`` seconds have passed since the last flush; a batch carries at most ``flush_at`` messages (and 500 KB).
A message that cannot be queued or uploaded always reaches ``on_error`` and a counter; none is dropped silently.

| module | holds |
|---|---|
| ``analytics`` | the ``Analytics`` class: the calls, flush, close, fork and exit |
| ``calls`` | a call → its complete wire-form message, validated and serialised |
| ``options`` | ``ClientOptions``, every tunable, checked when a client is made |
| ``batching`` | the bounded in-memory queue and the framing of a batch body |
| ``sender`` | the sender thread: queue → batch → upload → counters and callbacks |
| ``upload`` | uploading one batch, with retries (the policy itself is ``prefect_webhooks.messages.retry``) |
| ``connection`` | one keep-alive HTTP connection to the ingest API |
| ``reporter`` | the counters and the ``on_error``/``on_success`` callbacks |
| ``message_ids``, ``errors``, ``logs`` | messageIds, the exception types, the logger and ``DEBUG=analytics`` |

Example:
    ```python
    from prefect_webhooks import Analytics

    with Analytics("WRITE_KEY", endpoint="http://127.0.0.1:8088") as analytics:
        analytics.identify("user-1", traits={"email": "ada@example.com"})
        analytics.track("user-1", "Signed Up", properties={"plan": "pro"})
    ```
"""

from prefect_webhooks.client.analytics import Analytics
from prefect_webhooks.client.errors import AnalyticsError, QueueFullError, UploadError

__all__ = ["Analytics", "AnalyticsError", "QueueFullError", "UploadError"]
