"""The events thread: emits in order, off the caller's thread, and emits nothing once the interpreter is exiting."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from prefect_webhooks.delivery.endpoints.events import in_background, wait_for_queued_events


def test_events_are_emitted_in_order_on_their_own_thread() -> None:
    seen: list[tuple[int, str]] = []

    def emit(number: int) -> None:
        seen.append((number, threading.current_thread().name))

    futures = [in_background(emit, number) for number in range(5)]
    for future in futures:
        future.result(timeout=10)
    assert [number for number, _ in seen] == list(range(5))
    assert {name for _, name in seen} == {"prefect-webhooks-events"}


def test_a_failed_emit_is_handed_to_its_future_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def emit() -> None:
        raise ConnectionError("no events endpoint")

    logged = threading.Event()
    with caplog.at_level(logging.WARNING, logger="prefect_webhooks.delivery"):
        future = in_background(emit)
        future.add_done_callback(lambda _future: logged.set())  # runs after the module's own callback, which logs
        assert logged.wait(10)
    assert isinstance(future.exception(), ConnectionError)
    assert "emitting an event failed: ConnectionError" in caplog.text


def test_what_is_still_queued_when_the_main_thread_ends_is_not_emitted(tmp_path: Path) -> None:
    """A process ends while an event is being emitted and another waits: the one that waits is dropped, not emitted
    in the interpreter's shutdown (where Prefect's clients are closing, and without a Prefect server an emit started
    a temporary server that nothing stopped), and the process does not wait for it."""
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from prefect_webhooks.delivery.endpoints.events import in_background

        def slow() -> None:
            Path({str(tmp_path / "slow")!r}).write_text("started")
            time.sleep(1.5)

        def queued() -> None:
            Path({str(tmp_path / "queued")!r}).write_text("emitted")

        in_background(slow)
        in_background(queued)
        while not Path({str(tmp_path / "slow")!r}).exists():
            time.sleep(0.01)
    """)
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert (tmp_path / "slow").exists()
    assert not (tmp_path / "queued").exists()
    assert time.monotonic() - started < 30


def test_waiting_for_queued_events_returns_once_they_are_emitted() -> None:
    release = threading.Event()
    emitted: list[str] = []
    in_background(release.wait, 10)
    in_background(emitted.append, "queued")
    assert not wait_for_queued_events(0.2)  # the first one still holds the thread
    release.set()
    assert wait_for_queued_events(10) and emitted == ["queued"]
