"""The benchmarks in ``bench/`` still start and finish: nothing else runs them, so a refactor could break one silently.

Every benchmark module is imported (what broke ``bench_soak.py`` once: a name it imported from ``bench_capacity``
was gone), and the ones that finish in seconds at a tiny size run end to end and must print their figures. The rest
run at full size by hand (``bench/README.md``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_every_benchmark_module_imports() -> None:
    modules = sorted(path.stem for path in BENCH.glob("*.py"))
    assert "bench_soak" in modules and "bench_capacity" in modules
    code = f"import sys; sys.path.insert(0, {str(BENCH)!r})\n" + "\n".join(f"import {name}" for name in modules)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=BENCH)
    assert done.returncode == 0, done.stderr[-3000:]


# A benchmark, tiny arguments, and a line of figures its output must hold.
TINY_RUNS = {
    "bench_audience": (["--members", "200", "--churn", "0.1", "--destinations", "1"],
                       r"incremental worst: [\d.]+ s, \d+ MB peak RSS"),
    "bench_delivery": (["--messages", "200"],
                       r"raw aiohttp POST loop \(ceiling\)\s+\d+ msg/s(.|\n)*deliver_due \(outbox\)\s+\d+ msg/s"),
    "bench_client": (["--messages", "200", "--endpoints", "sink"],
                     r"delivered throughput ratio \(ours / Segment\): [\d.]+x"),
    "bench_message_log": (["--kept", "3000", "--hot-messages", "1000", "--rounds", "1", "--probes", "20"],
                          r"log size: \d+ B per kept message(.|\n)*lookup by messageId: p50 [\d.]+ ms"
                          r"(.|\n)*hot path .* nothing kept, same newest partition [\d,]+/s; with 3,000 kept "
                          r"[\d,]+/s"),
}


@pytest.mark.parametrize("name", sorted(TINY_RUNS))
def test_a_quick_benchmark_runs_at_a_tiny_size_and_prints_its_figures(name: str) -> None:
    arguments, figures = TINY_RUNS[name]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PYTEST_"))}
    done = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *arguments], capture_output=True, text=True,
                          timeout=240, env=env, cwd=BENCH.parent)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert re.search(figures, done.stdout), done.stdout[-3000:]
