"""The Analytics client against real HTTP servers on 127.0.0.1.

`Receiver` (tests/receivers.py) is a real aiohttp server whose script makes it misbehave: 5xx, 408, 429 with
Retry-After, 400, connection resets and answers slower than the client's timeout.
"""

from __future__ import annotations

import base64
import gzip
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import select

from prefect_webhooks import Alias, Analytics, AnalyticsError, Group, Identify, Page, Screen, Track
from prefect_webhooks.client import UploadError
from prefect_webhooks.messages.model import MAX_BATCH_BYTES, MAX_MESSAGE_BYTES
from prefect_webhooks.messages.timestamps import parse_timestamp
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.schema.tables import OutboxMessage
from tests.receivers import ReceivedRequest, Receiver

ROOT = Path(__file__).resolve().parents[2]
WRITE_KEY = "wk_test_secret_9f3a"
FAST = {"backoff_base": 0.05, "backoff_cap": 0.2}


def body_of(request: ReceivedRequest) -> dict[str, Any]:
    # aiohttp has already inflated a gzip body; decompress only what is still compressed.
    raw = request.body
    return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def messages_of(requests: list[ReceivedRequest]) -> list[dict[str, Any]]:
    return [message for request in requests for message in body_of(request)["batch"]]


def client_for(receiver: Receiver, **kwargs: Any) -> Analytics:
    options = {"flush_after": 0.2, **FAST, **kwargs}
    return Analytics(WRITE_KEY, endpoint=f"http://127.0.0.1:{receiver.port}", **options)


class Recorder:
    """Collects on_error / on_success calls from the sender thread."""

    def __init__(self) -> None:
        self.errors: list[tuple[Exception, list[dict]]] = []
        self.successes: list[list[dict]] = []
        self.lock = threading.Lock()

    def on_error(self, error: Exception, messages: list[dict]) -> None:
        with self.lock:
            self.errors.append((error, messages))

    def on_success(self, messages: list[dict]) -> None:
        with self.lock:
            self.successes.append(messages)

    def error_ids(self) -> list[str]:
        return [message["messageId"] for _, messages in self.errors for message in messages]


# -- validation ---------------------------------------------------------------------------------------------------


class Unserialisable:
    pass


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda a: a.identify(traits={"a": 1}), "user_id"),
        (lambda a: a.track("u1"), "event"),
        (lambda a: a.track(event="Signed Up"), "user_id"),
        (lambda a: a.track("u1", ""), "event"),
        (lambda a: a.page(name="Home"), "user_id"),
        (lambda a: a.screen(name="Home"), "user_id"),
        (lambda a: a.group("u1"), "group_id"),
        (lambda a: a.group(group_id="g1"), "user_id"),
        (lambda a: a.alias(user_id="u1"), "previous_id"),
        (lambda a: a.alias("anon-1"), "user_id"),
        (lambda a: a.track("u1", "E", timestamp="yesterday"), "timestamp"),
        (lambda a: a.track("u1", "E", properties=[1, 2]), "properties"),
        (lambda a: a.track("u1", "E", context="web"), "context"),
        (lambda a: a.track("u1", "E", properties={"when": Unserialisable()}), "properties.when"),
        (lambda a: a.identify("u1", traits={"tags": [1, {2, 3}]}), "traits.tags[1]"),
        (lambda a: a.identify("u1", traits={"nested": {1: "int key"}}), "traits.nested"),
        (lambda a: a.track("u1", "E", properties={"blob": "x" * MAX_MESSAGE_BYTES}), "message"),
        (lambda a: a.enqueue(Track.model_construct(user_id="u1")), "event"),
        (lambda a: a.enqueue({"type": "purchase", "userId": "u1"}), "type"),
        (lambda a: a.enqueue(42), "message"),
    ],
)
def test_invalid_calls_raise_one_error_type_naming_the_field_and_queue_nothing(
    receiver: Receiver, call: Any, field: str
) -> None:
    with client_for(receiver) as analytics:
        with pytest.raises(AnalyticsError) as caught:
            call(analytics)
        assert caught.value.field == field
        assert str(caught.value).startswith(f"{field}:")
        assert isinstance(caught.value, ValueError)
        assert analytics.queued == 0
        assert analytics.flush(5)
    assert receiver.requests == []


def test_a_message_just_under_32kb_is_accepted_and_one_over_is_not(receiver: Receiver) -> None:
    with client_for(receiver) as analytics:
        analytics.track("u1", "E", properties={"blob": "x" * (MAX_MESSAGE_BYTES - 400)})
        with pytest.raises(AnalyticsError, match="32768-byte limit"):
            analytics.track("u1", "E", properties={"blob": "x" * (MAX_MESSAGE_BYTES - 100)})
        assert analytics.flush(10)
    assert len(messages_of(receiver.requests)) == 1


def test_constructor_rejects_bad_options_without_echoing_the_key() -> None:
    with pytest.raises(AnalyticsError) as caught:
        Analytics("")
    assert caught.value.field == "write_key"
    with pytest.raises(ValueError) as bad:
        Analytics(WRITE_KEY, endpoint="http://127.0.0.1:9", flush_at=0)
    assert WRITE_KEY not in str(bad.value)
    with pytest.raises(AnalyticsError):
        Analytics(WRITE_KEY, endpoint="http://127.0.0.1:9", flush_at=5, size=6)
    assert WRITE_KEY not in repr(Analytics(WRITE_KEY, endpoint="http://127.0.0.1:9"))


# -- wire format --------------------------------------------------------------------------------------------------


def test_every_call_type_goes_out_as_one_batch_with_auth_agent_and_library(receiver: Receiver) -> None:
    historical = datetime(2021, 3, 4, 5, 6, 7, 890000, tzinfo=timezone.utc)
    with client_for(receiver, flush_after=30) as analytics:
        ids = [
            analytics.identify("u1", {"email": "a@example.com"}, context={"ip": "10.0.0.1"}),
            analytics.track("u1", "Order Completed", {"revenue": 9.5}, timestamp=historical),
            analytics.page(
                "u1", "Docs", "Install", {"url": "https://x.test/i"}, traits={"title": "Install", "path": "/i"}
            ),
            analytics.screen(anonymous_id="anon-7", name="Home", context={"os": {"name": "iOS"}}),
            analytics.group("u1", "acme", {"plan": "pro"}, integrations={"All": False, "Webhooks": True}),
            analytics.alias("anon-7", "u1", message_id="my-own-id"),
            analytics.enqueue(Identify(user_id=42, traits={"n": 1})),
            analytics.enqueue(Track(anonymous_id="anon-8", event="Viewed", properties={"at": historical})),
            analytics.enqueue(Page(user_id="u2", properties={"referrer": "https://r.test"})),
            analytics.enqueue(Screen(user_id="u2", name="Settings")),
            analytics.enqueue(Group(user_id="u2", group_id="g2")),
            analytics.enqueue(Alias(previous_id="u2", user_id="u3")),
        ]
        assert analytics.flush(10)
    [request] = receiver.requests
    assert request.method == "POST" and request.path == "/v1/batch"
    assert request.headers["Authorization"] == "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode()
    assert request.headers["User-Agent"].startswith("prefect-webhooks/")
    assert request.headers["Content-Type"] == "application/json"
    body = body_of(request)
    assert body["sentAt"].endswith("Z")
    batch = body["batch"]
    assert [m["messageId"] for m in batch] == ids
    assert ids[5] == "my-own-id"
    assert [m["type"] for m in batch] == ["identify", "track", "page", "screen", "group", "alias"] * 2
    for message in batch:
        assert message["context"]["library"]["name"] == "prefect-webhooks"
        assert message["timestamp"].endswith("Z")
    assert batch[0]["userId"] == "u1" and batch[0]["traits"] == {"email": "a@example.com"}
    assert batch[0]["context"]["ip"] == "10.0.0.1"
    assert batch[1]["timestamp"] == "2021-03-04T05:06:07.890Z"
    assert batch[2]["properties"]["url"] == "https://x.test/i" and batch[2]["traits"]["path"] == "/i"
    assert batch[2]["category"] == "Docs" and batch[2]["name"] == "Install"
    assert batch[3]["anonymousId"] == "anon-7" and "userId" not in batch[3]
    assert batch[4]["groupId"] == "acme" and batch[4]["integrations"] == {"All": False, "Webhooks": True}
    assert batch[5]["previousId"] == "anon-7" and batch[5]["userId"] == "u1"
    assert batch[6]["userId"] == "42"
    assert batch[7]["properties"]["at"].startswith("2021-03-04T05:06:07.89")
    assert len({m["messageId"] for m in batch}) == len(batch)
    uuid.UUID(batch[0]["messageId"])


def test_endpoint_defaults_to_the_setting(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_ENDPOINT", f"http://127.0.0.1:{receiver.port}/")
    get_settings.cache_clear()
    try:
        with Analytics(WRITE_KEY, flush_at=1) as analytics:
            analytics.track("u1", "E")
            assert analytics.flush(10)
    finally:
        get_settings.cache_clear()
    assert [r.path for r in receiver.requests] == ["/v1/batch"]


def test_gzip_bodies(receiver: Receiver) -> None:
    with client_for(receiver, gzip=True) as analytics:
        for index in range(50):
            analytics.track("u1", "E", {"i": index})
        assert analytics.flush(10)
    assert receiver.requests and all(r.headers["Content-Encoding"] == "gzip" for r in receiver.requests)
    # What went over the wire is smaller than the JSON the receiver inflated.
    assert all(int(r.headers["Content-Length"]) < len(r.body) / 3 for r in receiver.requests)
    assert [m["properties"]["i"] for m in messages_of(receiver.requests)] == list(range(50))


def test_requests_never_exceed_500kb(receiver: Receiver) -> None:
    blob = "y" * 20_000
    with client_for(receiver, flush_at=100, flush_after=30) as analytics:
        ids = [analytics.track("u1", "Big", {"blob": blob, "i": i}) for i in range(100)]
        assert analytics.flush(20)
    total = sum(len(r.body) for r in receiver.requests)
    assert len(receiver.requests) == -(-total // MAX_BATCH_BYTES)
    assert all(len(r.body) <= MAX_BATCH_BYTES for r in receiver.requests)
    # Filled close to the limit, not split needlessly small.
    assert max(len(r.body) for r in receiver.requests) > MAX_BATCH_BYTES - 25_000
    assert [m["messageId"] for m in messages_of(receiver.requests)] == ids


# -- flush triggers -----------------------------------------------------------------------------------------------


def test_flush_at_triggers_a_send_without_waiting_for_the_timer(receiver: Receiver) -> None:
    with client_for(receiver, flush_at=5, flush_after=60) as analytics:
        for index in range(4):
            analytics.track("u1", "E", {"i": index})
        time.sleep(0.5)
        assert receiver.requests == []
        analytics.track("u1", "E", {"i": 4})
        [request] = receiver.wait_for(1, timeout=5)
        assert len(body_of(request)["batch"]) == 5


def test_a_batch_never_carries_more_than_flush_at(receiver: Receiver) -> None:
    # Defaults (flush_at=20), and a flush_after long enough that only the count triggers a send.
    with Analytics(WRITE_KEY, endpoint=f"http://127.0.0.1:{receiver.port}", flush_after=60) as analytics:
        ids = [analytics.track("u1", "E", {"i": index}) for index in range(45)]
        receiver.wait_for(2, timeout=10)
        time.sleep(0.5)
        assert [len(body_of(request)["batch"]) for request in receiver.requests] == [20, 20]
        assert analytics.queued == 5  # the remainder waits for the next trigger
        assert analytics.flush(10)
    assert [len(body_of(request)["batch"]) for request in receiver.requests] == [20, 20, 5]
    assert [message["messageId"] for message in messages_of(receiver.requests)] == ids


def test_an_unknown_option_is_refused_not_ignored() -> None:
    with pytest.raises(AnalyticsError) as caught:
        Analytics(WRITE_KEY, endpoint="http://127.0.0.1:9", max_batch_size=100)
    assert (caught.value.field, caught.value.reason) == ("max_batch_size", "not an option of Analytics")


def test_size_is_the_same_as_flush_at(receiver: Receiver) -> None:
    with client_for(receiver, size=3, flush_after=60) as analytics:
        assert analytics.options.flush_at == 3
        for index in range(3):
            analytics.track("u1", "E", {"i": index})
        receiver.wait_for(1, timeout=5)


def test_flush_after_triggers_a_send_of_a_partial_batch(receiver: Receiver) -> None:
    with client_for(receiver, flush_at=100, flush_after=0.3) as analytics:
        started = time.time()
        analytics.track("u1", "E")
        analytics.track("u1", "E")
        [request] = receiver.wait_for(1, timeout=5)
        assert request.at - started < 3
        assert len(body_of(request)["batch"]) == 2


def test_flush_at_one_sends_every_call_on_its_own(receiver: Receiver) -> None:
    with client_for(receiver, flush_at=1, flush_after=60) as analytics:
        for index in range(10):
            analytics.track("u1", "E", {"i": index})
        receiver.wait_for(10, timeout=10)
    assert [len(body_of(r)["batch"]) for r in receiver.requests] == [1] * 10


# -- failures and retries -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [500, 502, 503, 408, {"reset": True}, {"status": 429, "headers": {"Retry-After": "0"}}],
    ids=["500", "502", "503", "408", "reset", "429"],
)
def test_transient_failures_are_retried_until_uploaded(failure: Any) -> None:
    recorder = Recorder()
    with Receiver(script=[failure, failure]) as receiver:
        with client_for(receiver, on_error=recorder.on_error, on_success=recorder.on_success) as analytics:
            ids = [analytics.track("u1", "E", {"i": i}) for i in range(3)]
            assert analytics.flush(20)
            assert (analytics.uploaded, analytics.failed, analytics.dropped) == (3, 0, 0)
        requests = receiver.requests
    assert len(requests) == 3
    assert [[m["messageId"] for m in body_of(r)["batch"]] for r in requests] == [ids] * 3
    # sentAt is set again for every attempt: each retry's sentAt is no earlier than the previous attempt's arrival
    # (1 ms for the millisecond resolution), which a reused value cannot be. Timing-free: a retry may follow in <1 ms.
    sent_at = [parse_timestamp(body_of(r)["sentAt"]).timestamp() for r in requests]
    for previous, request, sent in zip(requests, requests[1:], sent_at[1:], strict=False):
        assert previous.at - 0.001 <= sent <= request.at + 0.001, "sentAt is set again on every attempt"
    assert recorder.errors == []
    assert [[m["messageId"] for m in batch] for batch in recorder.successes] == [ids]


def test_429_waits_for_retry_after() -> None:
    with Receiver(script=[{"status": 429, "headers": {"Retry-After": "1"}}]) as receiver:
        with client_for(receiver) as analytics:
            analytics.track("u1", "E")
            assert analytics.flush(20)
        first, second = receiver.requests
    assert second.at - first.at >= 0.95


def test_an_answer_slower_than_the_timeout_is_retried() -> None:
    with Receiver(script=[{"status": 200, "delay": 1.5}]) as receiver:
        with client_for(receiver, timeout=0.3) as analytics:
            analytics.track("u1", "E")
            assert analytics.flush(20)
            assert analytics.uploaded == 1 and analytics.failed == 0
        assert len(receiver.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 413, 422])
def test_other_4xx_fail_at_once_and_reach_on_error(status: int) -> None:
    recorder = Recorder()
    with Receiver(script=[status]) as receiver:
        with client_for(receiver, on_error=recorder.on_error) as analytics:
            ids = [analytics.track("u1", "E", {"i": i}) for i in range(4)]
            assert analytics.flush(20)
            assert (analytics.uploaded, analytics.failed) == (0, 4)
        assert len(receiver.requests) == 1
    [(error, messages)] = recorder.errors
    assert isinstance(error, UploadError) and error.status == status
    assert [m["messageId"] for m in messages] == ids
    assert WRITE_KEY not in str(error)


def test_retries_stop_at_max_retries_and_report_every_message() -> None:
    recorder = Recorder()
    with Receiver(default=503) as receiver:
        with client_for(receiver, max_retries=2, on_error=recorder.on_error) as analytics:
            ids = [analytics.track("u1", "E", {"i": i}) for i in range(3)]
            assert analytics.flush(20)
            assert analytics.failed == 3
        assert len(receiver.requests) == 3
    [(error, _)] = recorder.errors
    assert error.status == 503 and "3 attempts" in str(error)
    assert recorder.error_ids() == ids


def test_retries_stop_when_retry_after_is_beyond_the_retry_budget() -> None:
    recorder = Recorder()
    with Receiver(default={"status": 429, "headers": {"Retry-After": "3600"}}) as receiver:
        with client_for(receiver, max_retry_time=5, on_error=recorder.on_error) as analytics:
            analytics.track("u1", "E")
            assert analytics.flush(10)
        assert len(receiver.requests) == 1
    assert recorder.errors[0][0].status == 429


def test_calls_are_accepted_while_a_batch_backs_off() -> None:
    with (
        Receiver(script=[503, 503, 503]) as receiver,
        client_for(receiver, flush_at=2, backoff_base=0.3, backoff_cap=0.3) as analytics,
    ):
        first = [analytics.track("u1", "E", {"i": i}) for i in range(2)]
        receiver.wait_for(1, timeout=5)
        started = time.monotonic()
        later = [analytics.track("u1", "E", {"i": i}) for i in range(2, 200)]
        assert time.monotonic() - started < 0.5, "calls must not wait for the backing-off batch"
        assert analytics.flush(20)
        assert analytics.uploaded == 200
    ids = [m["messageId"] for m in messages_of(receiver.requests[3:])]
    assert sorted(ids) == sorted(first + later)


# -- a full queue -------------------------------------------------------------------------------------------------


def test_drop_mode_reports_every_dropped_message() -> None:
    recorder = Recorder()
    with (
        Receiver(script=[{"status": 200, "delay": 1.0}]) as receiver,
        client_for(receiver, flush_at=1, max_queue_size=3, on_full="drop", on_error=recorder.on_error) as analytics,
    ):
        analytics.track("u1", "E", {"i": 0})
        receiver.wait_for(1, timeout=5)  # the sender now holds message 0 in a slow request
        kept = [analytics.track("u1", "E", {"i": i}) for i in range(1, 4)]
        dropped = [analytics.track("u1", "E", {"i": i}) for i in range(4, 6)]
        assert analytics.dropped == 2
        assert recorder.error_ids() == dropped
        assert all("queue full" in str(error) for error, _ in recorder.errors)
        assert analytics.flush(20)
        assert (analytics.uploaded, analytics.failed, analytics.dropped) == (4, 0, 2)
    received = [m["messageId"] for m in messages_of(receiver.requests)]
    assert received[1:] == kept


def test_block_mode_waits_for_room_instead_of_dropping() -> None:
    with (
        Receiver(script=[{"status": 200, "delay": 0.8}]) as receiver,
        client_for(receiver, flush_at=1, max_queue_size=2, on_full="block", block_timeout=None) as analytics,
    ):
        analytics.track("u1", "E", {"i": 0})
        receiver.wait_for(1, timeout=5)
        started = time.monotonic()
        for index in range(1, 6):
            analytics.track("u1", "E", {"i": index})
        blocked_for = time.monotonic() - started
        assert analytics.flush(20)
        assert (analytics.uploaded, analytics.dropped) == (6, 0)
    assert blocked_for > 0.3
    assert sorted(m["properties"]["i"] for m in messages_of(receiver.requests)) == list(range(6))


def test_block_mode_drops_after_block_timeout_and_reports_it() -> None:
    recorder = Recorder()
    with (
        Receiver(script=[{"status": 200, "delay": 1.5}]) as receiver,
        client_for(receiver, flush_at=1, max_queue_size=1, block_timeout=0.2, on_error=recorder.on_error) as analytics,
    ):
        analytics.track("u1", "E", {"i": 0})
        receiver.wait_for(1, timeout=5)
        analytics.track("u1", "E", {"i": 1})
        started = time.monotonic()
        late = analytics.track("u1", "E", {"i": 2})
        assert 0.15 < time.monotonic() - started < 1.2
        assert analytics.dropped == 1 and recorder.error_ids() == [late]


# -- lifecycle ----------------------------------------------------------------------------------------------------


def test_close_out_of_time_reports_what_was_not_sent() -> None:
    recorder = Recorder()
    with Receiver(default=503) as receiver:
        analytics = client_for(
            receiver, max_retry_time=600, max_retries=1000, backoff_base=0.2, on_error=recorder.on_error
        )
        ids = [analytics.track("u1", "E", {"i": i}) for i in range(30)]
        receiver.wait_for(1, timeout=5)
        assert analytics.close(timeout=0.5) is False
    assert sorted(recorder.error_ids()) == sorted(ids)
    assert analytics.failed == 30
    with pytest.raises(AnalyticsError, match="closed"):
        analytics.track("u1", "E")


def test_many_threads_each_message_exactly_once(receiver: Receiver) -> None:
    per_thread = 2_000
    with client_for(receiver, max_queue_size=100_000) as analytics:

        def produce(thread: int) -> list[str]:
            return [analytics.track(f"u{thread}", "E", {"i": i}) for i in range(per_thread)]

        results: list[list[str]] = [[] for _ in range(8)]
        threads = [threading.Thread(target=lambda t=t: results.__setitem__(t, produce(t))) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert analytics.flush(60)
        assert (analytics.uploaded, analytics.dropped, analytics.failed) == (8 * per_thread, 0, 0)
    received = [m["messageId"] for m in messages_of(receiver.requests)]
    assert len(received) == len(set(received)) == 8 * per_thread
    assert set(received) == {i for ids in results for i in ids}


def run_script(code: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_forked_child_sends_its_own_messages(receiver: Receiver) -> None:
    result = run_script(
        f"""
        import os
        from prefect_webhooks import Analytics
        analytics = Analytics("{WRITE_KEY}", endpoint="http://127.0.0.1:{receiver.port}", flush_after=60)
        analytics.track("u1", "Before fork")
        pid = os.fork()
        if pid == 0:
            # The child must not resend the parent's queued message, and must have a live sender of its own.
            assert analytics.queued == 0, analytics.queued
            analytics.track("u1", "In child", {{"pid": os.getpid()}})
            ok = analytics.flush(20)
            os._exit(0 if ok and analytics.uploaded == 1 else 3)
        _, status = os.waitpid(pid, 0)
        analytics.track("u1", "After fork")
        assert analytics.flush(20) and analytics.uploaded == 2, analytics.uploaded
        print("child", os.waitstatus_to_exitcode(status))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["child", "0"]
    events = sorted(m["event"] for m in messages_of(receiver.requests))
    assert events == ["After fork", "Before fork", "In child"]


def test_importing_the_client_does_not_import_prefect() -> None:
    # An application that only sends events pays for the client alone (importing Prefect costs seconds).
    result = run_script(
        """
        import sys
        from prefect_webhooks import Analytics, AnalyticsError
        from prefect_webhooks.client import UploadError
        Analytics("wk", endpoint="http://127.0.0.1:9").close()
        print(sorted(name for name in sys.modules if name == "prefect" or name.startswith("prefect.")))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_debug_env_logs_without_the_write_key(receiver: Receiver) -> None:
    # One interpreter for both cases (the variable is read when a client is made): importing Prefect costs seconds.
    result = run_script(
        f"""
        import os, sys
        from prefect_webhooks import Analytics
        os.environ.pop("DEBUG", None)
        with Analytics("{WRITE_KEY}", endpoint="http://127.0.0.1:{receiver.port}") as analytics:
            analytics.track("u1", "Quiet")
        print("--- DEBUG=analytics from here ---", file=sys.stderr, flush=True)
        os.environ["DEBUG"] = "analytics"
        with Analytics("{WRITE_KEY}", endpoint="http://127.0.0.1:{receiver.port}") as analytics:
            analytics.track("u1", "Loud")
        """
    )
    assert result.returncode == 0, result.stderr
    quiet, loud = result.stderr.split("--- DEBUG=analytics from here ---\n")
    assert quiet == ""
    assert "prefect_webhooks.client DEBUG" in loud and "/v1/batch" in loud
    encoded = base64.b64encode(f"{WRITE_KEY}:".encode()).decode()
    assert WRITE_KEY not in loud and encoded not in loud
    assert sorted(m["event"] for m in messages_of(receiver.requests)) == ["Loud", "Quiet"]


def test_from_source_uses_the_blocks_write_key(prefect_harness: None, receiver: Receiver) -> None:
    from prefect_webhooks.blocks.source import Source

    name = f"client-test-{uuid.uuid4().hex[:8]}"
    Source(write_key="wk_from_block", destinations=[]).save(name)
    with Analytics.from_source(name, endpoint=f"http://127.0.0.1:{receiver.port}", flush_at=1) as analytics:
        analytics.track("u1", "E")
        assert analytics.flush(10)
    [request] = receiver.requests
    assert request.headers["Authorization"] == "Basic " + base64.b64encode(b"wk_from_block:").decode()


# -- against the project's own ingest API (real uvicorn, real store) -----------------------------------------------


@dataclass
class IngestApi:
    """The ingest API shared by this module's tests, and one source of this test's own."""

    url: str
    store_url: str
    write_key: str
    source: str

    def stored_message_ids(self) -> list[str]:
        """messageIds of this source's outbox rows (one destination: one row per accepted message)."""
        table = OutboxMessage.__table__
        with get_engine(self.store_url).connect() as connection:
            return list(connection.execute(select(table.c.message_id).where(table.c.source == self.source)).scalars())


@pytest.fixture(scope="module")
def ingest_server(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """One ingest API process (real uvicorn, own SQLite store) for the module: starting one costs ~10 s."""
    from prefect.settings import PREFECT_API_URL

    from tests.servers import ingest_api_process

    store_url = f"sqlite:///{tmp_path_factory.mktemp('client-api') / 'store.db'}"
    with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value()) as server:
        yield server.url, store_url


@pytest.fixture
def ingest_api(ingest_server: tuple[str, str]) -> IngestApi:
    """A fresh source (with one destination) on the shared ingest API."""
    from tests.servers import save_destination, save_source

    suffix = uuid.uuid4().hex[:8]
    write_key = f"wk_client_{suffix}"
    save_destination(f"client-dest-{suffix}", ["http://127.0.0.1:9/never-called"])
    save_source(f"client-src-{suffix}", write_key, [f"client-dest-{suffix}"])
    return IngestApi(*ingest_server, write_key=write_key, source=f"client-src-{suffix}")


def test_every_call_type_lands_in_the_store(ingest_api: IngestApi) -> None:
    url, write_key = ingest_api.url, ingest_api.write_key
    recorder = Recorder()
    with Analytics(write_key, endpoint=url, on_error=recorder.on_error) as analytics:
        ids = [
            analytics.identify("u1", {"email": "a@example.com"}),
            analytics.track("u1", "Signed Up", {"plan": "pro"}),
            analytics.page("u1", "Docs", "Install", {"url": "https://x.test/install", "title": "Install"}),
            analytics.screen("u1", name="Home"),
            analytics.group("u1", "acme", {"name": "Acme"}),
            analytics.alias("anon-1", "u1"),
            analytics.enqueue(Track(user_id="u2", event="Viewed", timestamp="2020-01-02T03:04:05Z")),
        ]
        assert analytics.flush(30)
        assert (analytics.uploaded, analytics.failed) == (7, 0)
    assert recorder.errors == []
    assert sorted(ingest_api.stored_message_ids()) == sorted(ids)


def test_integrations_at_the_top_or_in_context_keep_a_call_from_the_webhooks(ingest_api: IngestApi) -> None:
    recorder = Recorder()
    with Analytics(ingest_api.write_key, endpoint=ingest_api.url, on_error=recorder.on_error) as analytics:
        kept = analytics.track("u1", "Kept")
        analytics.track("u1", "Off at the top", integrations={"All": False})
        analytics.track("u1", "Off in context", context={"integrations": {"All": False}})
        analytics.identify("u1", {"plan": "pro"}, context={"integrations": {"Webhooks": False}})
        on_again = analytics.track("u1", "On again", context={"integrations": {"All": False, "Webhooks": True}})
        assert analytics.flush(30)
        assert (analytics.uploaded, analytics.failed) == (5, 0)
    assert recorder.errors == []
    assert sorted(ingest_api.stored_message_ids()) == sorted([kept, on_again])


def test_an_unknown_write_key_reaches_on_error(ingest_api: IngestApi) -> None:
    url = ingest_api.url
    recorder = Recorder()
    with Analytics("wk_nobody_has_this", endpoint=url, on_error=recorder.on_error) as analytics:
        message_id = analytics.track("u1", "E")
        assert analytics.flush(30)
    [(error, messages)] = recorder.errors
    assert error.status == 401 and [m["messageId"] for m in messages] == [message_id]


@pytest.mark.slow
@pytest.mark.shares_machine  # counts what arrived; its timeouts and retry budget are made for a loaded machine
def test_100k_calls_from_8_threads_arrive_exactly_once(ingest_api: IngestApi) -> None:
    url, write_key = ingest_api.url, ingest_api.write_key
    recorder = Recorder()
    per_thread = 12_500
    # A retry budget for a loaded CI machine: a batch whose requests keep timing out must be retried rather than
    # given up after the default 2 minutes; what is checked is that every call arrives exactly once.
    with Analytics(
        write_key, endpoint=url, on_error=recorder.on_error, timeout=30, max_retry_time=600, max_retries=50
    ) as analytics:
        results: list[list[str]] = [[] for _ in range(8)]

        def produce(thread: int) -> None:
            results[thread] = [analytics.track(f"user-{thread}", "Load", {"i": i}) for i in range(per_thread)]

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert analytics.flush(300)
        # The reasons first, so a failure says why a batch did not arrive.
        assert [repr(error) for error, _ in recorder.errors] == []
        assert (analytics.uploaded, analytics.failed, analytics.dropped) == (100_000, 0, 0)
    stored = ingest_api.stored_message_ids()
    assert len(stored) == len(set(stored)) == 100_000
    assert set(stored) == {message_id for ids in results for message_id in ids}


def test_process_exit_without_flush_delivers_to_the_api(ingest_api: IngestApi) -> None:
    url, write_key = ingest_api.url, ingest_api.write_key
    result = run_script(
        f"""
        from prefect_webhooks import Analytics
        # Nothing would be sent before exit: neither flush_at nor flush_after is reached.
        analytics = Analytics("{write_key}", endpoint="{url}", flush_at=5000, flush_after=60)
        for i in range(2000):
            analytics.track("u1", "Exit", {{"i": i}}, message_id=f"exit-{{i}}")
        print("queued", analytics.queued)
        """
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) == 2000, "every message is still queued when the script ends"
    assert sorted(ingest_api.stored_message_ids()) == sorted(f"exit-{i}" for i in range(2000))
