"""Processes whose clock is off: Debian's libfaketime preloaded with ``FAKETIME="+60s"`` moves the wall clock the
process reads (``time.time``, ``datetime.now``), as a host whose clock runs a minute ahead would.

The monotonic clock is left alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``). A host's wall clock being off says nothing
of its monotonic clock, whose origin is arbitrary anyway; and with it faked, libfaketime 0.9.10 (Debian's) hands
glibc's ``sem_clockwait``/``pthread_cond_clockwait`` a deadline on the wrong clock, so every timed wait of a Python
thread (``Event.wait(t)``, ``Lock.acquire(timeout=t)``, ``Queue.get(timeout=t)``, ``Thread.join(t)``) waits until it
is notified, never for ``t``: a wait that counts on its timeout waits for ever (wolfcw/libfaketime#390, #469). The
skewed hosts of ``tests/hosts`` then ran with no timeout in any thread of theirs, even at ``FAKETIME="+0s"``. With
the monotonic clock left alone, the same release breaks ``time.sleep`` instead (``clock_nanosleep`` with an absolute
deadline fails with EINVAL): ``skewed_clock_site/sitecustomize.py``, first on the process's PYTHONPATH, sleeps with a
timed wait.

``skewed_env(seconds)`` is the environment to start such a process with; ``faketime_library()`` where the library
is (``.ci/run`` installs Debian's ``libfaketime``; without it a test skips locally and fails in CI).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(__file__).resolve().parent / "skewed_clock_site"


def faketime_library() -> str:
    """The path of libfaketime; skips the test (fails it in CI) when it is not installed."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    if not found:
        if os.environ.get("CI"):
            pytest.fail("libfaketime is not installed; .ci/run installs Debian's libfaketime")
        pytest.skip("libfaketime is not installed (apt-get install libfaketime)")
    return found[0]


def skewed_env(seconds: float) -> dict[str, str]:
    """Environment entries that move a process's wall clock ``seconds`` ahead (negative: behind); its PYTHONPATH
    holds the repository and the sleep of ``skewed_clock_site``, before the caller's own."""
    path = os.pathsep.join(filter(None, [str(SITE), str(ROOT), os.environ.get("PYTHONPATH")]))
    return {"LD_PRELOAD": faketime_library(), "FAKETIME": f"{seconds:+g}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": path}
