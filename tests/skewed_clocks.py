"""Processes whose clock is off: Debian's libfaketime preloaded with ``FAKETIME="+60s"`` moves every clock the
process reads (wall and monotonic alike), as a host whose clock runs a minute ahead would.

``skewed_env(seconds)`` is the environment to start such a process with; ``faketime_library()`` where the library
is (``.ci/run`` installs Debian's ``libfaketime``; without it a test skips locally and fails in CI).
"""

from __future__ import annotations

import glob
import os

import pytest


def faketime_library() -> str:
    """The path of libfaketime; skips the test (fails it in CI) when it is not installed."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    if not found:
        if os.environ.get("CI"):
            pytest.fail("libfaketime is not installed; .ci/run installs Debian's libfaketime")
        pytest.skip("libfaketime is not installed (apt-get install libfaketime)")
    return found[0]


def skewed_env(seconds: float) -> dict[str, str]:
    """Environment entries that move a process's clocks ``seconds`` ahead (negative: behind)."""
    return {"LD_PRELOAD": faketime_library(), "FAKETIME": f"{seconds:+g}s"}
