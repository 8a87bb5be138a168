"""Whole-system capacity: ``prefect-webhooks serve`` under an open-loop load, every part on one machine.

    .venv/bin/python bench/bench_capacity.py                        # SQLite, one serve, steps up to the limit
    .venv/bin/python bench/bench_capacity.py --store postgresql --ingest-workers 1 2 --delivery-workers 1 2
    .venv/bin/python bench/bench_capacity.py --quick                # 20 s steps, for a first look
    .venv/bin/python bench/bench_capacity.py --no-references --rates 2000 --step-seconds 90 --prefect-outage 30

What runs, each in its own process: a Prefect server (``prefect server start``, SQLite, as a user's embedded
default), ``prefect-webhooks serve`` (ingest API, delivery worker(s), runner for the other deployments) on a SQLite
store or on PostgreSQL, the receiver (``bench/recorder.py``: answers 200 and times every arrival) and the load
generator. The generator is open-loop: it sends a batch of ``--batch`` calls every ``batch / rate`` seconds whatever
the answers, the way a fleet of SDKs sends (batches of 100 are the ``upload_size`` of Segment's Python SDK and
what our client sends once its queue holds that many), each call stamped with the time it was sent.

For each configuration it steps the rate up (``--rates``), holding each for ``--step-seconds`` (60 s), and reports
per step: events/s accepted, messages/s delivered inside the step, backlog growth over the step, latency from the
generator's send to the receiver's arrival (p50/p99/max), and CPU microseconds per event of every process (from
the kernel's per-process times, children included). After each step it waits for the backlog to drain and checks
against the store and the receiver that every accepted call was delivered: nothing lost, nothing pending, nothing
failed. The capacity is the highest rate held for the whole step with p99 <= 1 s, a bounded backlog (it grew by
less than one second of arrivals) and no call refused; stepping stops at the first step that misses.

In the same run, before the steps, the references:

- delivery ceiling: a raw aiohttp POST loop (one process, one keep-alive session, 64 in flight, no store, no
  signing) to the same receiver, messages/s;
- ingest ceiling, the durable floor (``bench/durable_floor.py``): an endpoint that only parses the same batches
  and commits the same rows to the same store with the same group commit, events/s with closed-loop clients; the
  ingest API is measured the same way, and its share of the floor printed (target >= 50 %).

Fault step (``--prefect-outage SECONDS``, ``bench/outage_fault.py``): during the first step of each configuration
the Prefect server is SIGKILLed ``--outage-at`` seconds in and started again on the same port SECONDS later; the
step also reports messages/s delivered before, during and after the outage (the rate before is the reference), how
long after the server's return delivery was back to normal, and the flow runs Prefect shows for the step.

The generator, the process handling, the CPU accounting and the stores are modules of their own
(``load_generator``, ``started_processes``, ``cpu_accounting``, ``bench_stores``), shared with the other benchmarks.

The capacity is also given as a share of the lower of the two ceilings. The exit status is 1 when a check fails
(a call lost, left pending or failed; a reference that could not run) and 2 when ``--target`` is not reached.
Everything started is stopped at the end, including a PostgreSQL server started for ``--store postgresql``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from bench_stores import Postgres, fresh_store, pending_count, settled_store_counts, store_counts  # noqa: E402
from cpu_accounting import Processes, cpu_reference, machine_busy, tree_cpu  # noqa: E402
from load_generator import finish_generator, make_batch, start_generator  # noqa: E402
from outage_fault import Outage, PrefectServerProcess  # noqa: E402
from receiver_fault import ReceiverOutage  # noqa: E402
from started_processes import free_port, receiver_stats, recorder, started, wait_http  # noqa: E402

DESTINATION = "bench-dest"
SOURCE = "bench-source"
P99_LIMIT = 1.0


# ------------------------------------------------------------------------------------------------ the parts


def save_blocks(receiver_url: str) -> str:
    """Save the Source and the signed WebhookDestination on the bench's Prefect server; returns the Basic header."""
    import base64

    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.blocks.source import Source

    write_key = uuid.uuid4().hex
    WebhookDestination(endpoints=[{"url": receiver_url, "headers": {"X-Api-Key": "bench"}}],
                       shared_secret="bench-secret-0001").save(DESTINATION, overwrite=True)
    Source(write_key=write_key, destinations=[DESTINATION]).save(SOURCE, overwrite=True)
    return "Basic " + base64.b64encode(f"{write_key}:".encode()).decode()


# ------------------------------------------------------------------------------------------------ references


def delivery_ceiling(receiver_port: int, messages: int, concurrency: int) -> tuple[float, float]:
    """The raw aiohttp POST loop to the receiver: messages/s and CPU µs per message of the loop's process."""
    from bench_delivery import raw_loop

    from prefect_webhooks.messages.payloads import serialize

    url = f"http://127.0.0.1:{receiver_port}/hook"
    bodies = [serialize({"type": "track", "userId": f"user-{n}", "event": "Order Completed",
                         "properties": {"bench_step": -1, "bench_seq": n, "bench_sent": time.time(), "revenue": 19.99,
                                        "currency": "EUR", "sku": "A-1"}}) for n in range(messages)]
    asyncio.run(raw_loop(url, bodies[:2000], concurrency))  # warm-up, as the delivery benchmark does
    return asyncio.run(raw_loop(url, bodies, concurrency))


def closed_loop(url: str, auth: str, seconds: float, processes: int, concurrency: int, batch: int,
                procs: Processes) -> tuple[float, dict[str, Any]]:
    """Events/s accepted by ``url`` from ``processes`` closed-loop clients."""
    run = uuid.uuid4().hex[:8]
    specs = [{"url": f"{url}/v1/batch", "auth": auth, "batch": batch, "seconds": seconds, "step": -2,
              "concurrency": concurrency, "first": index * 10_000_000, "run": f"{run}-{index}"}
             for index in range(processes)]
    generators = [start_generator(spec) for spec in specs]
    try:
        results = [finish_generator(process, seconds + 120) for process in generators]
    finally:
        for process in generators:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    accepted = sum(result["accepted"] for result in results)
    refused = sum(result["refused"] + result["errors"] for result in results)
    elapsed = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return accepted / elapsed, {"accepted": accepted, "refused": refused, "elapsed": elapsed}


def ingest_references(args: argparse.Namespace, kind: str, workdir: Path, postgres: Postgres | None,
                      env: dict[str, str], auth: str) -> dict[str, float]:
    """The durable floor and the ingest API, each on a fresh store, loaded by the same closed-loop clients.

    The two are measured in turns (``--reference-rounds``), so a change in the machine's other load between the
    two measurements shows as spread between rounds rather than as a bias; the ratio is the median of the rounds.
    """
    import statistics

    commands = {
        "durable floor": [sys.executable, "-m", "uvicorn", "--app-dir", str(BENCH), "durable_floor:app",
                          "--no-access-log", "--log-level", "warning"],
        "ingest API": [sys.executable, "-m", "prefect_webhooks.cli", "ingest"],
    }
    rates: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    with ExitStack() as stack:
        servers = {}
        for name, command in commands.items():
            port = free_port()
            url = fresh_store(kind, workdir, postgres, f"reference-{name.replace(' ', '-')}")
            process = stack.enter_context(started([*command, "--host", "127.0.0.1", "--port", str(port)],
                                                  env={**env, "PREFECT_WEBHOOKS_DATABASE_URL": url},
                                                  log=workdir / "references.log"))
            wait_http(f"http://127.0.0.1:{port}/health", process, 90, name)
            servers[name] = (f"http://127.0.0.1:{port}", process, url)
            closed_loop(servers[name][0], auth, 2, args.reference_clients, 16, args.batch, Processes())  # warm-up
        accepted = dict.fromkeys(commands, 0)
        for _round in range(args.reference_rounds):
            for name, (base, process, _url) in servers.items():
                cpu_before = tree_cpu(process.pid)
                rate, detail = closed_loop(base, auth, args.reference_seconds, args.reference_clients, 16,
                                           args.batch, Processes())
                if detail["refused"]:
                    raise RuntimeError(f"{name}: {detail['refused']} calls refused")
                rates[name].append(rate)
                cpu[name].append((tree_cpu(process.pid) - cpu_before) / max(detail["accepted"], 1) * 1e6)
                accepted[name] += detail["accepted"]
    figures: dict[str, float] = {}
    for name, (_base, _process, url) in servers.items():
        committed = sum(store_counts(url).values())
        if committed < accepted[name]:  # (the warm-up adds rows of its own)
            raise RuntimeError(f"{name}: {committed} rows committed for more accepted calls")
        figures[name] = statistics.median(rates[name])
        figures[f"{name} cpu_us"] = statistics.median(cpu[name])
        print(f"  {name:14s} {figures[name]:9,.0f} events/s (rounds: "
              f"{', '.join(f'{rate:,.0f}' for rate in rates[name])}; "
              f"{figures[f'{name} cpu_us']:.0f} µs server CPU per event; every accepted call committed)",
              flush=True)
    ratios = [api / floor for api, floor in zip(rates["ingest API"], rates["durable floor"], strict=True)]
    figures["ratio"] = statistics.median(ratios)
    figures["cpu ratio"] = figures["durable floor cpu_us"] / figures["ingest API cpu_us"]
    print(f"  ingest API / durable floor: {figures['ratio']:.1%} (median of rounds "
          f"{', '.join(f'{ratio:.0%}' for ratio in ratios)}; target >= 50 %); in CPU per event "
          f"{figures['cpu ratio']:.0%}; load average {os.getloadavg()[0]:.1f}", flush=True)
    return figures


# ----------------------------------------------------------------------------------------------------- steps


@dataclass
class StepResult:
    rate: int
    accepted: int = 0
    refused: int = 0
    in_rate: float = 0.0
    delivered_rate: float = 0.0
    backlog_growth: int = 0
    p50: float | None = None
    p99: float | None = None
    max: float | None = None
    lost: int = 0
    duplicates: int = 0
    lag: float = 0.0
    ack_p99: float | None = None
    cpu_us: dict[str, float] = field(default_factory=dict)
    cpu_share: dict[str, float] = field(default_factory=dict)
    machine_busy: float = 0.0
    load: float = 0.0
    store_ok: bool = True
    store_detail: str = ""
    drain_seconds: float = 0.0
    worst_seconds: list[tuple[int, float]] = field(default_factory=list)
    fault: str = ""

    @property
    def held(self) -> bool:
        # Bounded: the backlog grew by less than a second of arrivals (or than what two claims hold in flight).
        return (self.store_ok and self.lost == 0 and self.refused == 0 and self.p99 is not None
                and self.p99 <= P99_LIMIT and self.backlog_growth <= max(self.rate, 4000))


def run_step(step: int, rate: int, args: argparse.Namespace, *, ingest_url: str, auth: str, receiver_port: int,
             store_url: str, procs: Processes, totals: dict[str, int], run: str,
             outage: Outage | ReceiverOutage | None = None) -> StepResult:
    result = StepResult(rate=rate, load=os.getloadavg()[0])
    pending_before = pending_count(store_url)
    cpu_before = procs.cpu()
    busy_before = machine_busy()
    started_at = time.time()
    spec = {"url": f"{ingest_url}/v1/batch", "auth": auth, "batch": args.batch, "seconds": args.step_seconds,
            "step": step, "rate": rate, "first": 0, "run": run}
    generator = start_generator(spec)
    if outage is not None:
        outage.begin(started_at)
    procs.generator = [generator.pid]
    generated = finish_generator(generator, args.step_seconds + 300)
    if outage is not None:
        outage.finish()
    if outage is not None and outage.server is not None:
        procs.prefect_server = outage.server.pid
    procs.generator, procs.generator_cpu = [], procs.generator_cpu + generated["cpu"]
    ended_at = time.time()
    result.backlog_growth = pending_count(store_url) - pending_before
    cpu_window = procs.cpu()
    busy_window = machine_busy()
    result.accepted, result.refused = generated["accepted"], generated["refused"] + generated["errors"]
    result.lag, result.ack_p99 = generated["lag"], generated["ack_p99"]
    result.in_rate = result.accepted / args.step_seconds
    # Drain: wait while the receiver keeps getting this step's calls.
    drain_started = time.monotonic()
    seen, last_progress = -1, time.monotonic()
    while True:
        stats = receiver_stats(receiver_port, step)
        if stats["distinct"] >= result.accepted:
            break
        if stats["distinct"] != seen:
            seen, last_progress = stats["distinct"], time.monotonic()
        if time.monotonic() - last_progress > args.drain_timeout:
            break
        time.sleep(0.5)
    result.drain_seconds = time.monotonic() - drain_started
    cpu_after = procs.cpu()
    stats = receiver_stats(receiver_port, step)
    in_window = sum(count for second, count in stats["per_second"].items()
                    if started_at <= int(second) < int(ended_at))
    window = max(int(ended_at) - int(started_at), 1)
    result.delivered_rate = in_window / window
    result.p50, result.p99, result.max = stats["p50"], stats["p99"], stats["max"]
    result.lost = result.accepted - stats["distinct"]
    result.duplicates = stats["duplicates"]
    # When, in the step, the longest delays arrived (seconds from the step's start): a pause shows as a run of them.
    worst = sorted(((delay, int(second) - int(started_at)) for second, delay in stats["worst_per_second"].items()),
                   reverse=True)[:5]
    result.worst_seconds = [(at, delay) for delay, at in worst]
    if outage is not None:
        # What the generator had sent by each second, as the calls accepted spread over the step (its nominal rate
        # overstates it: the step ends after the generator's last answer, and 'backlog gone' then never came).
        result.fault = outage.describe(stats, result.accepted / max(ended_at - started_at, 1e-9), started_at, ended_at)
    totals["accepted"] += result.accepted
    expected = {"delivered": totals["accepted"]} if totals["accepted"] else {}
    counts = settled_store_counts(store_url, expected, args.drain_timeout)
    if counts != expected:
        result.store_ok = False
        result.store_detail = f"store {counts}, expected {expected}"
    events = max(result.accepted, 1)
    for role, after in cpu_after.items():
        result.cpu_us[role] = (after - cpu_before.get(role, 0.0)) / events * 1e6
        result.cpu_share[role] = (cpu_window.get(role, 0.0) - cpu_before.get(role, 0.0)) / (ended_at - started_at)
    busy = busy_window[0] - busy_before[0]
    result.machine_busy = busy / max(busy_window[1] - busy_before[1], 1e-9) * (os.cpu_count() or 1)
    return result


def print_step(result: StepResult) -> None:
    def ms(value: float | None) -> str:
        return f"{value * 1000:,.0f}" if value is not None else "-"

    verdict = "held" if result.held else "MISSED"
    print(f"  {result.rate:6,d}/s: in {result.in_rate:7,.0f}/s, delivered {result.delivered_rate:7,.0f}/s, backlog "
          f"{result.backlog_growth:+8,d}, latency p50 {ms(result.p50)} ms p99 {ms(result.p99)} ms max "
          f"{ms(result.max)} ms, lost {result.lost}, dup {result.duplicates}, refused {result.refused}, "
          f"drain {result.drain_seconds:.1f} s, load {result.load:.1f}, machine {result.machine_busy:.0%} "
          f"busy: {verdict}" + (f" ({result.store_detail})" if not result.store_ok else ""), flush=True)
    parts = ", ".join(f"{role} {us:,.0f} µs ({result.cpu_share.get(role, 0):.0%})"
                      for role, us in result.cpu_us.items() if us >= 0.5)
    print(f"          CPU per event (share of a core): {parts}", flush=True)
    if result.p99 is not None and result.p99 > P99_LIMIT / 2:
        worst = ", ".join(f"+{at} s: {delay * 1000:,.0f} ms" for at, delay in result.worst_seconds)
        print(f"          longest delays by second of arrival: {worst}", flush=True)
    if result.fault:
        print(result.fault, flush=True)


@dataclass
class Config:
    store: str
    ingest_workers: int = 1
    delivery_workers: int = 1
    number: int = 0
    env: tuple[tuple[str, str], ...] = ()
    """Extra settings of this configuration's serve (``--reference-env``: the same configuration as it was)."""

    @property
    def label(self) -> str:
        extra = "".join(f", {name}={value}" for name, value in self.env)
        return f"{self.store}, {self.ingest_workers} ingest x {self.delivery_workers} delivery{extra}"


def serve_command(config: Config, port: int) -> list[str]:
    command = [sys.executable, "-m", "prefect_webhooks.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if config.ingest_workers != 1:
        command += ["--ingest-workers", str(config.ingest_workers)]
    if config.delivery_workers != 1:
        command += ["--delivery-workers", str(config.delivery_workers)]
    return command


def run_config(config: Config, args: argparse.Namespace, *, workdir: Path, postgres: Postgres | None,
               env: dict[str, str], auth: str, receiver_port: int, procs: Processes,
               server: PrefectServerProcess | None = None) -> dict[str, Any]:
    store_url = fresh_store(config.store, workdir, postgres, f"serve-{uuid.uuid4().hex[:6]}")
    port = free_port()
    serve_env = {**env, "PREFECT_WEBHOOKS_DATABASE_URL": store_url,
                 "PREFECT_WEBHOOKS_HOME": str(workdir / f"home-{port}"), **dict(args.env), **dict(config.env)}
    serve_root = Path(args.serve_root).resolve() if args.serve_root else ROOT
    serve_env["PYTHONPATH"] = str(serve_root)
    print(f"\n{config.label}: store {store_url.split('@')[-1]}", flush=True)
    results: list[StepResult] = []
    totals = {"accepted": 0}
    run = uuid.uuid4().hex[:6]
    serve_started = time.monotonic()
    # ``python -m`` puts the working directory first on the path: serve runs from the checkout it is started in.
    with started(serve_command(config, port), env=serve_env, log=workdir / f"serve-{port}.log",
                 cwd=serve_root) as serve:
        ingest_url = f"http://127.0.0.1:{port}"
        wait_http(f"{ingest_url}/health", serve, 120, "prefect-webhooks serve")
        api_ready = time.monotonic() - serve_started
        procs.serve = serve.pid
        # The first call: how long after the start of serve is it delivered?
        import httpx

        # Step numbers are unique across configurations (the receiver keeps every step's figures apart).
        first_step = config.number * 100
        answer = httpx.post(f"{ingest_url}/v1/batch", content=make_batch(run, first_step, 0, 1, time.time()),
                            headers={"Authorization": auth, "Content-Type": "application/json"}, timeout=30)
        assert answer.status_code == 200, answer.text
        totals["accepted"] += 1
        while receiver_stats(receiver_port, first_step)["distinct"] < 1:
            if serve.poll() is not None:
                raise RuntimeError(f"serve exited with {serve.returncode}")
            if time.monotonic() - serve_started > 300:
                raise TimeoutError("the first call was not delivered within 300 s of the start of serve")
            time.sleep(0.1)
        first_delivery = time.monotonic() - serve_started
        print(f"  first call delivered {first_delivery:.1f} s after serve started (its ingest API answered "
              f"after {api_ready:.1f} s)", flush=True)
        time.sleep(args.settle)
        for number, rate in enumerate(args.rates, start=first_step + 1):
            # The Prefect-outage fault step: the first step of the configuration.
            outage: Outage | ReceiverOutage | None = None
            if args.prefect_outage and server and number == first_step + 1:
                outage = Outage(server, args.outage_at, args.prefect_outage, wait_http)
            elif args.receiver_outage and number == first_step + 1:
                outage = ReceiverOutage(None, args.outage_at, args.receiver_outage, None,
                                        receiver_port=receiver_port)
            result = run_step(number, rate, args, ingest_url=ingest_url, auth=auth, receiver_port=receiver_port,
                              store_url=store_url, procs=procs, totals=totals, run=run, outage=outage)
            results.append(result)
            print_step(result)
            if not result.store_ok or result.lost:
                break
            if not result.held and not args.keep_going:
                break
        procs.serve = None
    held = [result.rate for result in results if result.held]
    capacity = 0
    for result in results:
        if not result.held:
            break
        capacity = result.rate
    ok = all(result.store_ok and result.lost == 0 for result in results)
    return {"config": config, "results": results, "capacity": capacity, "held": held, "ok": ok,
            "first_delivery": first_delivery}


# ------------------------------------------------------------------------------------------------------ main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", nargs="+", default=["sqlite"], choices=["sqlite", "postgresql"])
    parser.add_argument("--postgres", default=None,
                        help="PostgreSQL server URL (default: a throwaway server from scripts/test-postgres on a free "
                        "port, so its CPU can be measured; stopped at the end)")
    parser.add_argument("--ingest-workers", type=int, nargs="+", default=[1])
    parser.add_argument("--delivery-workers", type=int, nargs="+", default=[1])
    parser.add_argument("--rates", type=int, nargs="+",
                        default=[500, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 10000, 12000])
    parser.add_argument("--step-seconds", type=float, default=60.0)
    parser.add_argument("--batch", type=int, default=100, help="calls per request (SDK batch)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between the first call and step 1")
    parser.add_argument("--drain-timeout", type=float, default=60.0,
                        help="give up draining after this many seconds without progress")
    parser.add_argument("--keep-going", action="store_true", help="run every rate even after a missed step")
    parser.add_argument("--reference-seconds", type=float, default=10.0, help="seconds per reference round")
    parser.add_argument("--reference-rounds", type=int, default=3)
    parser.add_argument("--reference-clients", type=int, default=3)
    parser.add_argument("--references", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--steps", action=argparse.BooleanOptionalAction, default=True,
                        help="run the serve configurations (--no-steps: only the references)")
    parser.add_argument("--target", type=int, default=None, help="exit 2 when the first configuration holds less")
    parser.add_argument("--quick", action="store_true", help="20 s steps, 8 s references")
    parser.add_argument("--env", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="extra environment variable for serve (repeatable)")
    parser.add_argument("--reference-env", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="run each configuration again with this setting too, as the reference (repeatable)")
    parser.add_argument("--keep-workdir", action="store_true")
    parser.add_argument("--serve-root", default=None,
                        help="run serve from another checkout of the project (before/after comparisons)")
    parser.add_argument("--prefect-outage", type=float, default=None, metavar="SECONDS",
                        help="fault step: during the first step of each configuration, SIGKILL the Prefect server and "
                        "start it again on the same port SECONDS later")
    parser.add_argument("--receiver-outage", type=float, default=None, metavar="SECONDS",
                        help="the receiver answers 503 for this long in each configuration's first step "
                             "(bench/receiver_fault.py)")
    parser.add_argument("--outage-at", type=float, default=20.0, metavar="SECONDS",
                        help="with --prefect-outage: seconds into the step when the server is killed")
    args = parser.parse_args()
    if args.quick:
        args.step_seconds, args.reference_seconds, args.reference_rounds = 20.0, 5.0, 2
    return args


def check_serve_root(serve_root: Path) -> None:
    """Stop with the fix when another checkout cannot run as itself: this interpreter's editable install maps
    ``prefect_webhooks.flows`` and ``.deployments`` to this checkout's top-level folders, so a checkout whose package
    folder lacks them would run this checkout's flows over its own modules."""
    missing = [name for name in ("flows", "deployments") if not (serve_root / "prefect_webhooks" / name).exists()]
    if missing:
        links = " && ".join(f"ln -s ../{name} {serve_root}/prefect_webhooks/{name}" for name in missing)
        raise SystemExit(f"--serve-root {serve_root}: its prefect_webhooks/ has no {' or '.join(missing)}; link the "
                         f"checkout's own folders there first: {links}")


def main() -> int:
    args = parse_args()
    if args.serve_root:
        check_serve_root(Path(args.serve_root).resolve())
    # SIGTERM (a CI timeout, kill PID) unwinds like Ctrl-C, so every part started below is stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    workdir = Path(tempfile.mkdtemp(prefix="bench-capacity-"))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PYTEST_"))}
    env.update({"PYTHONPATH": str(ROOT), "PREFECT_HOME": str(workdir / "prefect-client"),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    print(f"bench_capacity: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; {cpu_reference()}; batches of {args.batch}, "
          f"steps of {args.step_seconds:.0f} s; work dir {workdir}", flush=True)
    exit_code = 0
    outcomes: list[dict[str, Any]] = []
    references: dict[str, dict[str, float]] = {}
    with ExitStack() as stack:
        server = stack.enter_context(PrefectServerProcess(workdir, env, free_port()))
        receiver_port, receiver_cm = recorder(workdir)
        receiver = stack.enter_context(receiver_cm)
        postgres = stack.enter_context(Postgres(args.postgres)) if "postgresql" in args.store else None
        api_url = server.url
        env["PREFECT_API_URL"] = api_url
        os.environ.update({"PREFECT_API_URL": api_url, "PREFECT_HOME": env["PREFECT_HOME"]})
        wait_http(f"{api_url}/health", server, 120, "Prefect server")
        wait_http(f"http://127.0.0.1:{receiver_port}/_stats/0", receiver, 30, "receiver")
        auth = save_blocks(f"http://127.0.0.1:{receiver_port}/hook")
        procs = Processes(prefect_server=server.pid, receiver=receiver.pid)
        print("receiver: bench/recorder.py (uvloop + httptools, one process) — it times each arrival, which nginx "
              "cannot", flush=True)
        if args.references:
            rate, cpu_us = delivery_ceiling(receiver_port, 20_000, 64)
            print(f"reference, delivery ceiling: raw aiohttp POST loop {rate:,.0f} msg/s ({cpu_us:.0f} µs CPU/msg; "
                  f"load average {os.getloadavg()[0]:.1f})", flush=True)
            for kind in args.store:
                print(f"reference, ingest ceiling ({kind}), closed loop, {args.reference_clients} client processes "
                      f"x 16 requests in flight, batches of {args.batch}, {args.reference_seconds:.0f} s:",
                      flush=True)
                try:
                    references[kind] = {**ingest_references(args, kind, workdir, postgres, env, auth),
                                        "delivery ceiling": rate}
                except Exception as exc:
                    print(f"  FAILED: {exc}", flush=True)
                    exit_code = 1
        configs = [] if not args.steps else [Config(kind, ingest, delivery, env=env) for kind in args.store
                   for ingest in (args.ingest_workers if kind == "postgresql" else [1])
                   for delivery in args.delivery_workers
                   for env in ((), *([tuple(map(tuple, args.reference_env))] if args.reference_env else []))]
        for number, config in enumerate(configs, start=1):
            config.number = number
        for config in configs:
            procs.postgres = postgres.pid if postgres is not None and config.store == "postgresql" else None
            try:
                outcome = run_config(config, args, workdir=workdir, postgres=postgres, env=env, auth=auth,
                                     receiver_port=receiver_port, procs=procs, server=server)
            except (RuntimeError, TimeoutError) as exc:
                print(f"  FAILED: {exc} (logs in {workdir})", flush=True)
                exit_code = 1
                continue
            outcomes.append(outcome)
            if not outcome["ok"]:
                exit_code = 1
    summarise(outcomes, references, args)
    if exit_code == 0 and args.target and outcomes and outcomes[0]["capacity"] < args.target:
        exit_code = 2
    if not args.keep_workdir and exit_code == 0:
        shutil.rmtree(workdir, ignore_errors=True)
    return exit_code


def summarise(outcomes: list[dict[str, Any]], references: dict[str, dict[str, float]],
              args: argparse.Namespace) -> None:
    print("\nsummary")
    base: dict[str, int] = {}
    for outcome in outcomes:
        config: Config = outcome["config"]
        capacity = outcome["capacity"]
        base.setdefault(config.store, capacity)
        line = f"  {config.label}: capacity {capacity:,} events/s"
        if base[config.store]:
            line += f" ({capacity / base[config.store]:.2f}x the first {config.store} configuration)"
        ref = references.get(config.store)
        if ref and capacity:
            lower = min(ref["delivery ceiling"], ref["durable floor"])
            line += (f"; {capacity / lower:.0%} of the lower ceiling ({lower:,.0f}: delivery "
                     f"{ref['delivery ceiling']:,.0f} msg/s, durable ingest floor "
                     f"{ref['durable floor']:,.0f} events/s)")
        line += f"; first call delivered {outcome['first_delivery']:.1f} s after serve started"
        line += "" if outcome["ok"] else " — CHECK FAILED (lost, pending or failed calls)"
        print(line)
    if args.target and outcomes:
        met = outcomes[0]["capacity"] >= args.target
        print(f"  target {args.target:,} events/s ({outcomes[0]['config'].label}): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
