"""What one event costs each ``serve`` process, on a fresh store and on a store aged before, at one steady rate.

    .venv/bin/python bench/bench_store_costs.py --aged-store sqlite:////tmp/aged50/history.db --rate 2500 \\
        --serve-env PREFECT_WEBHOOKS_RETENTION_DELIVERED 172800

For each store in turn (a fresh one first): ``serve``, an open-loop stream at ``--rate`` for ``--seconds`` (200),
and, over ``--window`` seconds (60) starting ``--skip`` seconds in (95: past the first shift handover and the first
pruning pass), each process's CPU per event (its kernel share) and bytes written per event, from the kernel's
per-process counters. The stream's delivery and ingest-answer p99 cover all of it. Where capacity steps disagree
between two stores, this says whether the difference is work per event (CPU, writes) or waiting.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_soak import Bench, ms  # noqa: E402
from cpu_accounting import cpu_reference, serve_parts  # noqa: E402


def counters(pid: int) -> tuple[float, float, int]:
    """(CPU seconds, of them in the kernel, bytes written to storage) of one process."""
    import psutil

    with suppress(psutil.NoSuchProcess):
        process = psutil.Process(pid)
        times = process.cpu_times()
        return times.user + times.system, times.system, process.io_counters().write_bytes
    return 0.0, 0.0, 0


def measure(bench: Bench, url: str, args: argparse.Namespace) -> None:
    with bench.serve(url) as serve:
        bench.wait_ready(serve)
        generator, step = bench.start_load(args.rate, args.seconds)
        time.sleep(args.skip)
        parts = {name: pids for name, pids in serve_parts(serve.pid).items() if pids}
        before = {pid: counters(pid) for pids in parts.values() for pid in pids}
        started = time.monotonic()
        time.sleep(args.window)
        after = {pid: counters(pid) for pid in before}
        spent = time.monotonic() - started
        figures = bench.finish_load(generator, step, args.seconds)
        stats = bench.arrived(figures)
    print(f"  the stream: {figures['accepted']:,} accepted, delivery p99 {ms(stats['p99'])} ms, ingest answer p99 "
          f"{ms(figures['ack_p99'])} ms, lost {figures['accepted'] - stats['distinct']}", flush=True)
    events = args.rate * spent
    for name, pids in parts.items():
        cpu = sum(after[pid][0] - before[pid][0] for pid in pids)
        kernel = sum(after[pid][1] - before[pid][1] for pid in pids)
        written = sum(after[pid][2] - before[pid][2] for pid in pids)
        print(f"  {name:>11}: {cpu / spent:5.0%} of a core, {cpu / events * 1e6:6.1f} µs CPU per event "
              f"({kernel / max(cpu, 1e-9):.0%} in the kernel), {written / events / 1e3:5.1f} KB written per event",
              flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aged-store", required=True, help="a store built before (bench_message_log.py --kept N)")
    parser.add_argument("--rate", type=int, default=2500)
    parser.add_argument("--seconds", type=float, default=200.0)
    parser.add_argument("--skip", type=float, default=95.0)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--serve-env", nargs=2, action="append", metavar=("NAME", "VALUE"))
    args = parser.parse_args()
    args.capacity_rates = [args.rate]
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"bench_store_costs: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
          f"{cpu_reference()}; {args.rate:,} events/s for {args.seconds:.0f} s, measured from {args.skip:.0f} s for "
          f"{args.window:.0f} s{''.join(f'; {name}={value}' for name, value in args.serve_env or ())}", flush=True)
    with ExitStack() as stack:
        bench: Any = Bench(stack, args)
        fresh = f"sqlite:///{bench.workdir / f'fresh-{uuid.uuid4().hex[:6]}.db'}"
        for label, url in (("fresh store", fresh), (f"aged store {args.aged_store}", args.aged_store)):
            print(f"\n{label}:", flush=True)
            measure(bench, url, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
