"""Prefect's suspension watch is entered and left beside the delivering loop, never in its way."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from prefect_webhooks.serving.suspension_watch import beside_the_loop, watch_beside_the_loop

RUN_NAME: contextvars.ContextVar[str] = contextvars.ContextVar("run_name", default="none")


class SlowWatch:
    """A watch whose start and end each wait until the test lets them go, as Prefect's waits for its websocket."""

    def __init__(self) -> None:
        self.may_start, self.may_end = threading.Event(), threading.Event()
        self.started, self.ended = threading.Event(), threading.Event()
        self.seen_run: str | None = None

    @contextlib.contextmanager
    def observe(self, flow_run_id: str) -> Iterator[None]:
        self.seen_run = f"{flow_run_id} in {RUN_NAME.get()}"
        assert self.may_start.wait(10)
        self.started.set()
        try:
            yield
        finally:
            assert self.may_end.wait(10)
            self.ended.set()


def test_entering_and_leaving_the_watch_never_wait_for_it() -> None:
    slow = SlowWatch()
    observe = beside_the_loop(slow.observe)
    RUN_NAME.set("shift 7")
    with observe("run-1"):
        # Entered while the watch still waits to start: the loop goes on at once.
        assert not slow.started.is_set()
        slow.may_start.set()
        assert slow.started.wait(10)
    # Left while the watch still waits to end; it ends on its own thread once it may.
    assert not slow.ended.is_set()
    slow.may_end.set()
    assert slow.ended.wait(10)
    assert slow.seen_run == "run-1 in shift 7"  # the engine's context, where the watch reads its client


def test_a_watch_that_fails_leaves_the_run_going(caplog: pytest.LogCaptureFixture) -> None:
    failed = threading.Event()

    @contextlib.contextmanager
    def broken(_flow_run_id: str) -> Iterator[None]:
        failed.set()
        raise ConnectionError("events API unreachable")
        yield  # pragma: no cover

    with caplog.at_level(logging.DEBUG, logger="prefect_webhooks.serving.suspension_watch"):
        with beside_the_loop(broken)("run-2"):
            assert failed.wait(10)
        for _ in range(100):  # the watch's thread logs once it has left
            if "the suspension watch ended with an error" in caplog.text:
                break
            time.sleep(0.05)
    assert "the suspension watch ended with an error" in caplog.text
    assert "ConnectionError: events API unreachable" in caplog.text


def test_the_flow_engine_is_given_the_watch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect import flow_engine

    original = getattr(flow_engine, "observe_flow_run_suspension", None)
    if original is None:  # the oldest supported Prefect has no such watch: it is left without one
        assert not watch_beside_the_loop()
        assert not hasattr(flow_engine, "observe_flow_run_suspension")
        return
    monkeypatch.setattr(flow_engine, "observe_flow_run_suspension", original)  # restored after the test
    assert watch_beside_the_loop()
    installed = flow_engine.observe_flow_run_suspension
    assert installed is not original and getattr(installed, "beside_the_loop", False)
    assert watch_beside_the_loop() and flow_engine.observe_flow_run_suspension is installed


def test_a_prefect_without_the_watch_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect import flow_engine

    monkeypatch.delattr(flow_engine, "observe_flow_run_suspension", raising=False)
    assert not watch_beside_the_loop()
    assert not hasattr(flow_engine, "observe_flow_run_suspension")
