"""A store that ages: ``prefect-webhooks serve`` for hours compressed into minutes, and on a store with history.

    .venv/bin/python bench/bench_soak.py                          # every phase, SQLite (about 30 minutes)
    .venv/bin/python bench/bench_soak.py --phases soak --minutes 6
    .venv/bin/python bench/bench_soak.py --phases history --history-store postgresql --history 1000000

Every part runs in its own process, as in ``bench_capacity.py`` (whose parts this reuses): a Prefect server
(SQLite), ``prefect-webhooks serve`` on embedded defaults, the receiver (``bench/recorder.py``) and the open-loop
generator (batches of 100 calls). Phases:

- ``soak``: the issue's check. ``serve`` with ``PREFECT_WEBHOOKS_RETENTION_DELIVERED=120s`` and
  ``PREFECT_WEBHOOKS_RETENTION_INTERVAL=15s`` under ``--rate`` (3,000) events/s for ``--minutes`` (6). Per minute:
  the store's files (database + WAL, and the free pages in them), ``/metrics`` answer time (p50/p95 of one request
  every 0.5 s), ingest (answers other than 200, p99 of the answers), delivery p99 (send to arrival), the Prefect
  task runs made and the Prefect database's size. Checks: ``prefect_webhooks_delivered_total`` never decreases and
  ends equal to what the receiver got, nothing lost, the store flat in the second half.
- ``prune``: ``--old-rows`` (400,000) delivered messages past their retention are bulk-inserted into the running
  store, then 2 minutes at ``--rate``: the next pass removes them while the load goes on (ingest answers, p99).
- ``prefect``: what Prefect stores at 500 and 5,000 events/s (2 minutes each, one ``serve``): task runs per second
  and the Prefect database's growth per hour; in the same run, 5,000 events/s with one task run per claimed batch
  (``PREFECT_WEBHOOKS_TASK_RUN_SECONDS=0.001``, what delivery did before) as the reference.
- ``history``: ``--history`` (5,000,000) messages of history synthesized with bulk inserts (delivered within the
  last 20 hours, so the default retention keeps them; each with its attempt record and remembered messageId) beside
  a fresh store: ``/metrics`` answer time on each, then the capacity of each: the rate stepped up
  (``--capacity-rates``, ``--step-seconds`` each) until a step misses (a call not delivered, p99 over 1 s);
  target: within 10 %.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_capacity import save_blocks  # noqa: E402
from bench_stores import Postgres  # noqa: E402
from cpu_accounting import cpu_reference  # noqa: E402
from load_generator import finish_generator, start_generator  # noqa: E402
from outage_fault import PrefectServerProcess  # noqa: E402
from started_processes import BENCH, ROOT, free_port, receiver_stats, recorder, started, wait_http  # noqa: E402

sys.path.insert(0, str(ROOT))
STEP = [1000]  # step numbers, unique across the run (the receiver keeps each step apart)


# ------------------------------------------------------------------------------------------------ measurements


class MetricsProbe:
    """Requests ``/metrics`` every ``every`` seconds on a thread: answer times and the delivered total."""

    def __init__(self, url: str, every: float = 0.5) -> None:
        self.url, self.every = url, every
        self.times: list[float] = []
        self.totals: list[int] = []
        self.decreases = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=30) as client:
            while not self.stop.wait(self.every):
                started_at = time.perf_counter()
                text = client.get(self.url).text
                self.times.append(time.perf_counter() - started_at)
                total = sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
                            if line.startswith("prefect_webhooks_delivered_total{"))
                if self.totals and total < self.totals[-1]:
                    self.decreases += 1
                self.totals.append(total)

    def take(self) -> list[float]:
        """The answer times since the last call."""
        taken, self.times = self.times, []
        return taken

    def __enter__(self) -> MetricsProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def quantile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else float("nan")


def file_sizes(path: Path) -> tuple[int, int, int]:
    """(database + WAL bytes, WAL bytes, free bytes inside the database) of a SQLite file."""
    wal = path.with_name(path.name + "-wal")
    wal_bytes = wal.stat().st_size if wal.exists() else 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as connection:
        page = connection.execute("PRAGMA page_size").fetchone()[0]
        free = connection.execute("PRAGMA freelist_count").fetchone()[0] * page
    return path.stat().st_size + wal_bytes, wal_bytes, free


def task_runs_between(api_url: str, start: float, end: float) -> int:
    import httpx

    def iso(at: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}Z"

    body = {"task_runs": {"start_time": {"after_": iso(start), "before_": iso(end)}}}
    return int(httpx.post(f"{api_url}/task_runs/count", json=body, timeout=60).json())


# ------------------------------------------------------------------------------------------------ serve and load


class Bench:
    """The parts every phase shares: workdir, Prefect server, receiver, blocks."""

    def __init__(self, stack: ExitStack, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-soak-"))
        self.env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PYTEST_"))}
        self.env.update({"PYTHONPATH": str(ROOT), "PREFECT_HOME": str(self.workdir / "prefect-client"),
                         "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
        server = stack.enter_context(PrefectServerProcess(self.workdir, self.env, free_port()))
        self.receiver_port, receiver_cm = recorder(self.workdir)
        receiver = stack.enter_context(receiver_cm)
        self.api_url = server.url
        self.prefect_db = self.workdir / "prefect-server" / "prefect.db"
        self.env["PREFECT_API_URL"] = self.api_url
        os.environ.update({"PREFECT_API_URL": self.api_url, "PREFECT_HOME": self.env["PREFECT_HOME"]})
        wait_http(f"{self.api_url}/health", server, 120, "Prefect server")
        wait_http(f"http://127.0.0.1:{self.receiver_port}/_stats/0", receiver, 30, "receiver")
        self.auth = save_blocks(f"http://127.0.0.1:{self.receiver_port}/hook")
        self.run = uuid.uuid4().hex[:6]

    def serve(self, store_url: str, **settings: str):  # type: ignore[no-untyped-def]
        """``prefect-webhooks serve`` on ``store_url`` with extra ``PREFECT_WEBHOOKS_*`` settings."""
        port = free_port()
        env = {**self.env, "PREFECT_WEBHOOKS_DATABASE_URL": store_url,
               "PREFECT_WEBHOOKS_HOME": str(self.workdir / f"home-{port}"),
               **dict(getattr(self.args, "serve_env", None) or ()),  # bench_live_lookups has no such option
               **{f"PREFECT_WEBHOOKS_{name.upper()}": value for name, value in settings.items()}}
        command = [sys.executable, "-m", "prefect_webhooks.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
        self.ingest_url = f"http://127.0.0.1:{port}"
        self.serve_log = self.workdir / f"serve-{port}.log"
        return started(command, env=env, log=self.serve_log)

    def wait_ready(self, serve: Any) -> None:
        wait_http(f"{self.ingest_url}/health", serve, 180, "prefect-webhooks serve")

    def load(self, rate: int, seconds: float) -> dict[str, Any]:
        """One open-loop step; returns the generator's figures with the receiver's for the step."""
        return self.finish_load(*self.start_load(rate, seconds), seconds)

    def start_load(self, rate: int, seconds: float) -> tuple[Any, int]:
        """An open-loop step started in the background: its generator process and step number."""
        STEP[0] += 1
        spec = {"url": f"{self.ingest_url}/v1/batch", "auth": self.auth, "batch": 100, "seconds": seconds,
                "step": STEP[0], "rate": rate, "first": 0, "run": self.run}
        return start_generator(spec), STEP[0]

    def finish_load(self, generator: Any, step: int, seconds: float) -> dict[str, Any]:
        figures = finish_generator(generator, seconds + 300)
        figures["step"] = step
        return figures

    def arrived(self, figures: dict[str, Any], drain: float = 60) -> dict[str, Any]:
        """The receiver's figures for a step once it got every accepted call (or stopped progressing)."""
        seen, progress = -1, time.monotonic()
        while True:
            stats = receiver_stats(self.receiver_port, figures["step"])
            if stats["distinct"] >= figures["accepted"] or time.monotonic() - progress > drain:
                return stats
            if stats["distinct"] != seen:
                seen, progress = stats["distinct"], time.monotonic()
            time.sleep(0.5)


def ms(value: float | None) -> str:
    return f"{value * 1000:,.0f}" if value is not None else "-"


# ------------------------------------------------------------------------------------------------------ phases


def phase_soak(bench: Bench) -> bool:
    args = bench.args
    store = bench.workdir / "soak.db"
    print(f"\nsoak: {args.rate:,}/s for {args.minutes} min, RETENTION_DELIVERED=120s, RETENTION_INTERVAL=15s",
          flush=True)
    sizes: list[int] = []
    accepted = arrived = lost = 0
    ok = True
    with bench.serve(f"sqlite:///{store}", retention_delivered="120s", retention_interval="15s") as serve:
        bench.wait_ready(serve)
        warm = bench.load(args.rate, 10)  # warm: the first delivery shift is running
        bench.arrived(warm)
        with MetricsProbe(f"{bench.ingest_url}/metrics") as probe:
            steps = [warm]
            for minute in range(1, args.minutes + 1):
                started_at = time.time()
                figures = bench.load(args.rate, 60)
                steps.append(figures)
                size, wal, free = file_sizes(store)
                sizes.append(size)
                times = probe.take()
                runs = task_runs_between(bench.api_url, started_at, time.time())
                stats = receiver_stats(bench.receiver_port, figures["step"])
                print(f"  minute {minute}: store {size / 1e6:7.1f} MB (WAL {wal / 1e6:5.1f} MB, free {free / 1e6:6.1f}"
                      f" MB), /metrics p50 {ms(statistics.median(times))} ms p95 {ms(quantile(times, 0.95))} ms, "
                      f"ingest {figures['accepted']:,} accepted, {figures['refused'] + figures['errors']} refused, "
                      f"answer p99 {ms(figures['ack_p99'])} ms, delivery p99 {ms(stats['p99'])} ms, "
                      f"{runs} task runs, Prefect db {file_sizes(bench.prefect_db)[0] / 1e6:.1f} MB", flush=True)
            for figures in steps:
                stats = bench.arrived(figures)
                accepted += figures["accepted"]
                arrived += stats["distinct"]
                lost += figures["accepted"] - stats["distinct"]
                ok &= figures["refused"] + figures["errors"] == 0
            time.sleep(2)
        final_total = probe.totals[-1] if probe.totals else 0
    half = len(sizes) // 2
    growth_first = sizes[half - 1] - sizes[0] if half > 1 else 0
    growth_second = max(sizes[half:]) - min(sizes[half:])
    print(f"  delivered_total: never decreased: {probe.decreases == 0}; final {final_total:,} vs {arrived:,} "
          f"arrived at the receiver ({accepted:,} accepted, {lost} lost)", flush=True)
    print(f"  store size: first half grew {growth_first / 1e6:+.1f} MB, second half spread {growth_second / 1e6:.1f} MB"
          f" (max - min)", flush=True)
    return ok and probe.decreases == 0 and lost == 0 and final_total == arrived


def synthesize_history(url: str, count: int, *, old: bool) -> float:
    """Build ``count`` kept messages into the store's log (``bench_message_log.build_history``); returns seconds.

    ``old``: finished two days ago (past the default retention); otherwise spread over the last day.
    """
    from bench_message_log import build_history

    return build_history(url, count, older_than=2 * 86400 if old else 0)


def phase_prune(bench: Bench) -> bool:
    args = bench.args
    store = bench.workdir / "prune.db"
    url = f"sqlite:///{store}"
    print(f"\nprune under load: {args.old_rows:,} messages past their retention, then {args.rate:,}/s for 2 min "
          "(RETENTION_INTERVAL=15s)", flush=True)
    ok = True
    with bench.serve(url, retention_interval="15s") as serve:
        bench.wait_ready(serve)
        bench.arrived(bench.load(args.rate, 20))
        seconds = synthesize_history(url, args.old_rows, old=True)
        print(f"  inserted in {seconds:.0f} s; store {file_sizes(store)[0] / 1e6:.0f} MB", flush=True)
        with MetricsProbe(f"{bench.ingest_url}/metrics") as probe:
            for half_minute in range(1, 5):
                figures = bench.load(args.rate, 30)
                stats = bench.arrived(figures)
                left = old_rows_left(url)
                times = probe.take()
                print(f"  +{half_minute * 30:3d} s: old rows left {left:,}, ingest {figures['accepted']:,} accepted, "
                      f"{figures['refused'] + figures['errors']} refused, answer p99 {ms(figures['ack_p99'])} ms, "
                      f"delivery p99 {ms(stats['p99'])} ms max {ms(stats['max'])} ms, lost "
                      f"{figures['accepted'] - stats['distinct']}, /metrics p95 {ms(quantile(times, 0.95))} ms",
                      flush=True)
                ok &= figures["refused"] + figures["errors"] == 0 and stats["distinct"] == figures["accepted"]
    return ok and left == 0


def old_rows_left(url: str) -> int:
    """Kept messages that finished more than a day ago (the history ``synthesize_history(old=True)`` built)."""
    from datetime import timedelta

    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.log.partitions import kept_partitions
    from prefect_webhooks.store.schema.tables import store_now

    with get_engine(url).connect() as connection:
        old = [p for p in kept_partitions(connection) if p.ends_at <= store_now() - timedelta(days=1)]
        return sum(connection.exec_driver_sql(f'SELECT count(*) FROM "{p.name}"').scalar_one() for p in old)


def phase_prefect(bench: Bench) -> bool:
    print("\nwhat Prefect stores: task runs per second and Prefect database growth per hour, 2 min per rate",
          flush=True)
    for label, settings, rate in (("windows (default)", {}, 500), ("windows (default)", {}, 5000),
                                  ("one task run per claim (before)", {"task_run_seconds": "0.001"}, 5000)):
        with bench.serve(f"sqlite:///{bench.workdir / f'prefect-{uuid.uuid4().hex[:6]}.db'}", **settings) as serve:
            bench.wait_ready(serve)
            bench.arrived(bench.load(rate, 15))  # warm: the first shift is running
            before, started_at = file_sizes(bench.prefect_db)[0], time.time()
            figures = bench.load(rate, 120)
            time.sleep(5)  # the task runs' last states reach the server
            elapsed = time.time() - started_at
            runs = task_runs_between(bench.api_url, started_at, time.time())
            growth = file_sizes(bench.prefect_db)[0] - before
            stats = bench.arrived(figures)
            print(f"  {label}, {rate:,}/s: {runs / elapsed:.2f} task runs/s, Prefect db {growth / 1e6:+.1f} MB in "
                  f"{elapsed:.0f} s = {growth / elapsed * 3600 / 1e6:,.0f} MB/h; delivery p99 {ms(stats['p99'])} ms",
                  flush=True)
    return True


def capacity_steps(bench: Bench, rates: list[int], seconds: float) -> int:
    """Step the rate up; the capacity is the highest rate held (every call delivered, p99 <= 1 s)."""
    capacity = 0
    for rate in rates:
        figures = bench.load(rate, seconds)
        stats = bench.arrived(figures)
        in_window = sum(n for second, n in stats["per_second"].items()
                        if figures["started"] <= int(second) < int(figures["ended"]))
        delivered = in_window / max(int(figures["ended"]) - int(figures["started"]), 1)
        held = (stats["p99"] or 99) <= 1.0 and stats["distinct"] == figures["accepted"] and not figures["refused"]
        print(f"  {rate:,}/s for {seconds:.0f} s: delivered {delivered:,.0f}/s, delivery p99 {ms(stats['p99'])} ms, "
              f"ingest answer p99 {ms(figures['ack_p99'])} ms, refused {figures['refused'] + figures['errors']}, lost "
              f"{figures['accepted'] - stats['distinct']}: {'held' if held else 'missed'}", flush=True)
        if not held:
            break
        capacity = rate
        time.sleep(5)
    return capacity


def through_first_pass(bench: Bench, rate: int, most_seconds: float = 300, least_seconds: float = 0) -> None:
    """Load at ``rate`` in 10 s steps until serve's first pruning pass has ended (and ``least_seconds`` have
    passed), so the capacity steps measure the steady state: serve's first minutes hold its first shift handover and
    that pass, which on a store built before the run seals what the builder left open. Those steps' figures are
    printed, not counted."""
    started, worst = time.monotonic(), []
    while time.monotonic() - started < max(most_seconds, least_seconds):
        figures = bench.load(rate, 10)
        stats = bench.arrived(figures)
        worst.append((stats["p99"] or 99, figures["ack_p99"] or 0))
        if ("pruned " in bench.serve_log.read_text(errors="replace")
                and time.monotonic() - started >= least_seconds):
            break
    print(f"  through serve's first pruning pass at {rate:,}/s ({len(worst) * 10} s, not counted): worst 10 s "
          f"delivery p99 {ms(max(d for d, _ in worst))} ms, ingest answer p99 {ms(max(a for _, a in worst))} ms",
          flush=True)


def health_times(url: str, count: int = 40) -> list[float]:
    """Answer times of ``count`` requests to ``url``, one after the other."""
    import httpx

    times = []
    with httpx.Client(timeout=30) as client:
        for _ in range(count):
            started_at = time.perf_counter()
            client.get(url).raise_for_status()
            times.append(time.perf_counter() - started_at)
    return times


def status_times(url: str, count: int = 40) -> list[float]:
    """What ``prefect-webhooks status`` does after its imports (read the store, build the table), ``count`` times."""
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.figures.metrics import backlog_snapshot, status_table

    engine = get_engine(url)
    times = []
    for _ in range(count):
        started_at = time.perf_counter()
        status_table(backlog_snapshot(engine))
        times.append(time.perf_counter() - started_at)
    return times


def kept_messages(url: str) -> int:
    """How many messages the store keeps, as ``prefect-webhooks status`` reports it."""
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.log.partitions import kept_counts

    return sum(kept_counts(get_engine(url)).values())


def bytes_per_message(store: Path, count: int) -> str:
    """The SQLite store's files per message of its history (what the synthesized rows take, indexes included)."""
    return f"; store {file_sizes(store)[0] / 1e6:,.0f} MB = {file_sizes(store)[0] / count:,.0f} B per message"


def phase_history(bench: Bench) -> bool:
    args = bench.args
    results = {}
    with ExitStack() as stack:
        postgres = stack.enter_context(Postgres(args.postgres)) if args.history_store == "postgresql" else None
        aged = (("a store aged before", -1),) if args.aged_store else ((f"{args.history:,} messages of history",
                                                                         args.history),)
        for label, count in (("fresh store", 0), *aged):
            url = (args.aged_store if count < 0 else postgres.fresh_database() if postgres else
                   f"sqlite:///{bench.workdir / f'history-{uuid.uuid4().hex[:6]}.db'}")
            seconds = synthesize_history(url, count, old=False) if count > 0 else 0.0
            if count < 0:
                count = kept_messages(url)
                label = f"{count:,} messages kept (built before the run)"
            size = bytes_per_message(Path(url.removeprefix("sqlite:///")), count) if count and not postgres else ""
            built = f", synthesized in {seconds:.0f} s" if seconds else ""
            print(f"\nhistory ({args.history_store}): {label}{built}{size}", flush=True)
            with bench.serve(url) as serve:
                bench.wait_ready(serve)
                bench.arrived(bench.load(args.capacity_rates[0], 10))
                with MetricsProbe(f"{bench.ingest_url}/metrics", every=0.2) as probe:
                    time.sleep(10)
                    idle = probe.take()
                    figures = bench.load(args.capacity_rates[0], 30)
                    busy = probe.take()
                bench.arrived(figures)
                print(f"  /metrics idle p50 {ms(statistics.median(idle))} ms p95 {ms(quantile(idle, 0.95))} ms; at "
                      f"{args.capacity_rates[0]:,}/s p50 {ms(statistics.median(busy))} ms p95 "
                      f"{ms(quantile(busy, 0.95))} ms", flush=True)
                backlog, status = health_times(f"{bench.ingest_url}/health/backlog"), status_times(url)
                print(f"  idle: /health/backlog p50 {ms(statistics.median(backlog))} ms p95 "
                      f"{ms(quantile(backlog, 0.95))} ms; `status` (its store read and table, in one process) p50 "
                      f"{ms(statistics.median(status))} ms p95 {ms(quantile(status, 0.95))} ms", flush=True)
                if args.steady:
                    through_first_pass(bench, args.capacity_rates[0], least_seconds=args.warm_seconds)
                results[label] = capacity_steps(bench, args.capacity_rates, args.step_seconds)
                print(f"  capacity: {results[label]:,} events/s", flush=True)
                for line in bench.serve_log.read_text(errors="replace").splitlines():
                    if "pruned " in line or "pruning the store" in line:
                        print(f"  pruning pass: {line.strip()}", flush=True)
    fresh, aged = results.values()
    print(f"  with history: capacity {aged:,}/s = {aged / max(fresh, 1):.0%} of the fresh store's {fresh:,}/s "
          "(target >= 90 %)", flush=True)
    return fresh > 0 and aged >= 0.9 * fresh


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", nargs="+", default=["soak", "prune", "prefect", "history"],
                        choices=["soak", "prune", "prefect", "history"])
    parser.add_argument("--rate", type=int, default=3000)
    parser.add_argument("--minutes", type=int, default=6)
    parser.add_argument("--old-rows", type=int, default=400_000)
    parser.add_argument("--history", type=int, default=5_000_000)
    parser.add_argument("--history-store", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--aged-store", default=None,
                        help="history phase: measure this store (built before, e.g. with bench_message_log.py "
                             "--kept N --store URL) instead of synthesizing --history messages")
    parser.add_argument("--postgres", default=None, help="PostgreSQL server URL (default: a throwaway one)")
    parser.add_argument("--capacity-rates", type=int, nargs="+", default=[3000, 4000, 4500, 5000, 5500, 6000])
    parser.add_argument("--step-seconds", type=float, default=40.0)
    parser.add_argument("--steady", action=argparse.BooleanOptionalAction, default=True,
                        help="history phase: load at the first rate until serve's first pruning pass has ended "
                             "before the capacity steps (its figures printed, not counted)")
    parser.add_argument("--warm-seconds", type=float, default=0,
                        help="history phase: the steady start lasts at least this long (serve's first minutes on a "
                             "store built before the run: its filters read, its index pages cold)")
    parser.add_argument("--serve-env", nargs=2, action="append", metavar=("NAME", "VALUE"),
                        help="a setting for every serve of the run, e.g. PREFECT_WEBHOOKS_RETENTION_DELIVERED 3600")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"bench_soak: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; {cpu_reference()}; receiver {BENCH / 'recorder.py'}"
          f"{''.join(f'; {name}={value}' for name, value in args.serve_env or ())}", flush=True)
    phases = {"soak": phase_soak, "prune": phase_prune, "prefect": phase_prefect, "history": phase_history}
    ok = True
    with ExitStack() as stack:
        bench = Bench(stack, args)
        for name in args.phases:
            passed = phases[name](bench)
            print(f"  {name}: {'PASSED' if passed else 'FAILED'}", flush=True)
            ok &= passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
