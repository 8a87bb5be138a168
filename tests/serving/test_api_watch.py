"""The supervisor's watch on the Prefect API: when an outage ends, and what counts as one."""

from __future__ import annotations

import time

import pytest

from prefect_webhooks.serving.api_watch import OUTAGE_SECONDS, ApiWatcher, OutageWatch, api_answers
from tests.receivers import Receiver
from tests.servers import free_port


def test_the_api_is_back_once_it_answers_after_failing_for_the_outage_time() -> None:
    watch = OutageWatch()
    assert not watch.observe(True, now=0.0)
    assert not watch.observe(False, now=2.0)
    assert not watch.observe(False, now=4.0)
    assert watch.observe(True, now=2.0 + OUTAGE_SECONDS)
    assert watch.outages == 1
    # Answering on: nothing more to do until the next outage.
    assert not watch.observe(True, now=20.0)
    assert watch.outages == 1


def test_one_slow_or_failed_probe_is_no_outage() -> None:
    watch = OutageWatch()
    assert not watch.observe(False, now=10.0)
    assert not watch.observe(True, now=10.0 + OUTAGE_SECONDS - 1)
    assert watch.outages == 0


def test_api_answers_with_any_http_answer_and_not_without_a_server() -> None:
    with Receiver(default={"status": 503}) as receiver:
        assert api_answers(receiver.url)
    assert not api_answers(f"http://127.0.0.1:{free_port()}/api", timeout=1)


@pytest.mark.timeout(60)
def test_the_watcher_signals_the_return_of_a_server_that_went_away(monkeypatch: pytest.MonkeyPatch) -> None:
    import prefect_webhooks.serving.api_watch as api_watch

    monkeypatch.setattr(api_watch, "PROBE_SECONDS", 0.1)
    monkeypatch.setattr(api_watch, "OUTAGE_SECONDS", 0.5)
    port = free_port()
    watcher = ApiWatcher(f"http://127.0.0.1:{port}/api").start()
    try:
        time.sleep(1.0)  # nothing listens: an outage
        assert not watcher.returned.is_set()
        with Receiver(port=port) as receiver:
            assert watcher.returned.wait(10), "the watcher did not see the server come back"
            assert any(request.path == "/api/health" for request in receiver.requests)
    finally:
        watcher.stop()
    assert watcher.watch.outages == 1
