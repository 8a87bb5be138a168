"""The skewed clocks the tests give a process (``tests/skewed_clocks.py``): its wall clock is off by the skew, and
its threads' timed waits still end on time, so the process under test behaves as one on a host whose clock is off,
not as one whose every thread timeout is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.skewed_clocks import skewed_env

# Each wait below counts on its timeout (nothing notifies it).
WAITS = """
import json, queue, threading, time
started = time.monotonic()
time.sleep(0.2)
threading.Event().wait(0.2)
lock = threading.Lock()
lock.acquire()
lock.acquire(timeout=0.2)
try:
    queue.Queue().get(timeout=0.2)
except queue.Empty:
    pass
thread = threading.Thread(target=time.sleep, args=(30,), daemon=True)
thread.start()
thread.join(0.2)
print(json.dumps({"wall": time.time(), "waited": time.monotonic() - started}))
"""


@pytest.mark.parametrize("seconds", [60.0, -60.0])
def test_a_skewed_process_reads_a_wall_clock_off_and_its_timed_waits_end(seconds: float) -> None:
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", WAITS], env={**os.environ, **skewed_env(seconds)},
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("five waits of 0.2 s each did not end within 30 s under the skewed clock")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert abs(seen["wall"] - time.time() - seconds) < 5, seen
    assert 0.8 <= seen["waited"] < 5, seen  # five waits of 0.2 s, each ended by its timeout
    assert took < 15
