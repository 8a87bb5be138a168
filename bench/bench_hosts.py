"""Several application hosts on one PostgreSQL: events/s and CPU per event per host with 1, 2 and 3 hosts.

    .venv/bin/python bench/bench_hosts.py [--hosts 1 2 3] [--rate 1000 | --rate-per-host 500] [--seconds 30]
                                          [--batch 10]

Needs root (network namespaces), haproxy and PostgreSQL's binaries (``.ci/run`` installs them). For each count of
hosts it builds the topology of docs/operations/several-hosts.md with ``tests/hosts``: a database host (PostgreSQL,
the Prefect server), N application hosts each running ``prefect-webhooks serve``, a receiver host
(``bench/recorder.py``, which keeps each arrival with its sender) and haproxy in front of the ingest APIs. An
open-loop stream (``bench/load_generator.py``) sends ``--rate`` events/s (or ``--rate-per-host`` times the hosts)
through haproxy for a warm-up of 10 s, then for ``--seconds``; CPU is read from every process of each host's
namespace (``ip netns pids``) at the measured stream's start and once it has drained, so a host's CPU includes its
share of the tail.

Printed per count of hosts: events/s accepted, how long after the stream the last acknowledged call arrived,
delivery latency p50/p99, and CPU per event: of each application host per event of its share (the events divided
by the hosts: ingest is balanced round robin, and what each delivered is printed beside), of all application hosts
together, and of the database host
(PostgreSQL, the Prefect server). Before the load, each host's CPU over 15 s with nothing to do (its idle burn: claim
polls, the runner's loops) is measured too, and a host's CPU per event is also given with that burn left out.

Every host here shares the same 2 cores, so the total cannot grow with hosts. What shows that it would on more cores
is a host's CPU per event staying flat as hosts are added, at the same rate per host (``--rate-per-host``): at a
fixed total rate each host's batches get smaller as hosts are added, and a smaller batch costs more an event. Also
printed: ``sum(range(1000))``, the CPU reference. The check: every acknowledged call is delivered (exit 1 if not).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

from cpu_accounting import cpu_reference  # noqa: E402
from load_generator import finish_generator, start_generator  # noqa: E402

from tests.hosts import (  # noqa: E402
    BACK,
    CONNECTION_OPTIONS,
    FRONT,
    INGEST_PORT,
    Host,
    Network,
    child_env,
    require_namespaces,
    start_haproxy,
    start_postgres,
    start_prefect_server,
    start_receiver,
    wait_http,
)

WARM_UP_SECONDS = 10.0
IDLE_SECONDS = 15.0


def namespace_cpu(host: Host) -> dict[str, float]:
    """CPU seconds of every live process in ``host``'s namespace, by part: ``postgres``, ``prefect`` or ``serve``."""
    import psutil

    parts: dict[str, float] = {}
    for pid in host.pids():
        try:
            process = psutil.Process(pid)
            times = process.cpu_times()
            command = " ".join(process.cmdline())
        except psutil.NoSuchProcess:
            continue
        part = "postgres" if process.name().startswith("postgres") else "prefect" if "prefect server" in command \
            or "prefect.server" in command else "serve"
        parts[part] = parts.get(part, 0.0) + times.user + times.system
    return parts


def start_serve(host: Host, workdir: Path, prefect_url: str, store_url: str) -> subprocess.Popen[Any]:
    home = workdir / host.name
    home.mkdir(exist_ok=True)
    env = {**child_env(), "PREFECT_API_URL": prefect_url, "PREFECT_HOME": str(home / "prefect"),
           "PREFECT_WEBHOOKS_DATABASE_URL": store_url, "PREFECT_WEBHOOKS_HOME": str(home / "webhooks")}
    return host.run([sys.executable, "-m", "prefect_webhooks.cli", "serve", "--host", host.address(FRONT),
                     "--port", str(INGEST_PORT)], env=env, log=workdir / f"serve-{host.name}.log")


def stream(lb_url: str, auth: str, *, rate: int, seconds: float, batch: int, step: int) -> dict[str, Any]:
    spec = {"url": f"{lb_url}/v1/batch", "auth": auth, "batch": batch, "rate": rate, "seconds": seconds,
            "step": step, "first": 0, "run": uuid.uuid4().hex[:6], "connections": 64, "timeout": 60}
    return finish_generator(start_generator(spec), seconds + 120)


def drained(receiver_url: str, step: int, expected: int, timeout: float) -> list[list[Any]]:
    """The step's arrivals once ``expected`` distinct messages arrived (or ``timeout`` passed)."""
    deadline = time.monotonic() + timeout
    while True:
        arrivals = httpx.get(f"{receiver_url}/_arrivals/{step}", timeout=30).json()
        if len({seq for seq, _, _, status in arrivals if status == 200}) >= expected or time.monotonic() > deadline:
            return arrivals
        time.sleep(1)


def measure(hosts: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One topology with ``hosts`` application hosts: its figures."""
    rate = args.rate_per_host * hosts if args.rate_per_host else args.rate
    import psycopg
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.servers import save_destination, save_source

    network = Network()
    network.folders.append(workdir)
    try:
        db = network.add_host("db", 10, [BACK])
        apps = [network.add_host(f"a{number}", 10 + number, [FRONT, BACK]) for number in range(1, hosts + 1)]
        rx = network.add_host("rx", 20, [FRONT])
        lb = network.add_host("lb", 30, [FRONT])
        server = start_postgres(db)
        with psycopg.connect(server, autocommit=True) as connection:
            connection.execute("CREATE DATABASE webhooks")
        store_url = server.rsplit("/", 1)[0] + f"/webhooks?{CONNECTION_OPTIONS}"
        prefect_url = start_prefect_server(db, workdir, child_env())
        receiver_url = start_receiver(rx, workdir, child_env())
        write_key = f"wk_{uuid.uuid4().hex}"
        with temporary_settings(updates={PREFECT_API_URL: prefect_url}):
            save_destination("hosts-bench", [receiver_url], shared_secret="hosts-bench-secret")
            save_source("hosts-bench-source", write_key, ["hosts-bench"])
        serves = {app.name: start_serve(app, workdir, prefect_url, store_url) for app in apps}
        for app in apps:
            wait_http(f"http://{app.address(FRONT)}:{INGEST_PORT}/health", 180, f"serve on {app.name}",
                      serves[app.name], workdir / f"serve-{app.name}.log")
        lb_url = start_haproxy(lb, apps, workdir)
        time.sleep(10)  # haproxy's checks pass; each serve's runner and first runs have started
        auth = "Basic " + base64.b64encode(f"{write_key}:".encode()).decode()
        # What each host burns with nothing to do (claim polls, the runner's and Prefect's loops), per second.
        idle_from = {host.name: namespace_cpu(host) for host in apps}
        time.sleep(IDLE_SECONDS)
        idle = {host.name: (sum(namespace_cpu(host).values()) - sum(idle_from[host.name].values())) / IDLE_SECONDS
                for host in apps}
        warm = stream(lb_url, auth, rate=rate, seconds=WARM_UP_SECONDS, batch=args.batch, step=1)
        drained(receiver_url, 1, warm["sent"], 60)
        before = {host.name: namespace_cpu(host) for host in [db, *apps]}
        started = time.monotonic()
        result = stream(lb_url, auth, rate=rate, seconds=args.seconds, batch=args.batch, step=2)
        refused = set(result["unacknowledged"])
        acknowledged = {seq for first in range(0, result["sent"], args.batch) if first not in refused
                        for seq in range(first, first + args.batch)}
        arrivals = drained(receiver_url, 2, len(acknowledged), 120)
        took = time.monotonic() - started
        after = {host.name: namespace_cpu(host) for host in [db, *apps]}
        stats = httpx.get(f"{receiver_url}/_stats/2", timeout=30).json()
    finally:
        network.close()
    delivered = {seq for seq, _, _, status in arrivals if status == 200}
    by_sender: dict[str, int] = {}
    for _seq, peer, _at, status in arrivals:
        if status == 200:
            by_sender[peer] = by_sender.get(peer, 0) + 1
    used = {name: {part: after[name].get(part, 0.0) - seconds for part, seconds in before[name].items()}
            for name in before}
    events = len(delivered)
    per_host = {app.name: {"delivered": by_sender.get(app.address(FRONT), 0),
                           "cpu_s": round(used[app.name].get("serve", 0.0), 2)} for app in apps}
    share = max(events, 1) / hosts  # ingest is round robin; delivery is what each host claimed
    for name, figures in per_host.items():
        figures["µs per event of its share"] = round(figures["cpu_s"] / share * 1e6)
        figures["idle, share of a core"] = round(idle[name], 3)
        # Less what the host burns idle over the same time: the work the events themselves cost.
        figures["µs per event of its share, idle burn left out"] = round((figures["cpu_s"] - idle[name] * took)
                                                                        / share * 1e6)
    return {
        "hosts": hosts, "rate": rate, "sent": result["sent"], "acknowledged": len(acknowledged), "delivered": events,
        "lost": len(acknowledged - delivered), "answers": result["answers"],
        "events/s accepted": round(len(acknowledged) / args.seconds),
        "drained after the stream (s)": round(took - args.seconds, 1), "p50 s": round(stats["p50"], 3),
        "p99 s": round(stats["p99"], 3), "per host": per_host,
        "all application hosts µs per event": round(sum(f["cpu_s"] for f in per_host.values()) / max(events, 1) * 1e6),
        "PostgreSQL µs per event": round(used["db"].get("postgres", 0.0) / max(events, 1) * 1e6),
        "Prefect server µs per event": round(used["db"].get("prefect", 0.0) / max(events, 1) * 1e6),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rate", type=int, default=1000, help="events/s through the load balancer")
    parser.add_argument("--rate-per-host", type=int, default=None,
                        help="events/s per application host instead (the rate grows with the hosts)")
    parser.add_argument("--seconds", type=float, default=30.0, help="the measured stream")
    parser.add_argument("--batch", type=int, default=10, help="calls per request")
    args = parser.parse_args()
    os.environ["CI"] = ""  # require_namespaces: say what is missing instead of failing as a test
    try:
        require_namespaces()
    except BaseException as exc:  # pytest's Skipped is a BaseException
        print(f"bench_hosts: cannot build hosts here: {exc}", file=sys.stderr)
        return 1
    import tempfile

    rate = f"{args.rate_per_host} events/s a host" if args.rate_per_host else f"{args.rate} events/s"
    print(f"bench_hosts: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; {cpu_reference()}; {rate} in batches of {args.batch}, "
          f"{args.seconds:.0f} s measured", flush=True)
    failed = False
    for hosts in args.hosts:
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-hosts-{hosts}-"))
        workdir.chmod(0o755)
        figures = measure(hosts, args, workdir)
        failed = failed or figures["lost"] > 0
        print(json.dumps(figures, ensure_ascii=False), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
