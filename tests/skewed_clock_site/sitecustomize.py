"""Loaded by every Python process that ``tests.skewed_clocks.skewed_env`` starts (its folder is first on PYTHONPATH).

libfaketime 0.9.10 with the monotonic clock left alone turns the absolute deadline of ``clock_nanosleep`` into an
invalid one: CPython 3.11's ``time.sleep`` (``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``) raises
``OSError: [Errno 22]``. A timed wait on an event nothing sets sleeps the same time through ``sem_clockwait``,
which works there.
"""

import threading
import time

_never_set = threading.Event()


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    _never_set.wait(seconds)


time.sleep = _sleep
