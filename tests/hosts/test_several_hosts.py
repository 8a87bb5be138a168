"""Several hosts, one PostgreSQL: the topology of docs/guides/several-hosts.md, each host a network namespace.

- ``db``: PostgreSQL and the Prefect server (back network);
- ``a1``, ``a2``: ``prefect-webhooks serve`` each (ingest API on the front network, store and Prefect on the back);
  ``a1``'s clock runs 60 s ahead of the others and ``a2``'s 60 s behind (libfaketime on every process of the host);
- ``rx``: the receiver (``bench/recorder.py``: counts every message, keeps each arrival with its sender);
- ``lb``: haproxy in front of both ingest APIs, checking ``/health`` every 0.5 s.

One set of hosts serves the module's faults in turn, each under an open-loop stream of ~1,000 events/s (batches of
10) sent to the load balancer by this process (``bench/bench_capacity.py``'s generator), each stream a step of its
own at the receiver: the skewed clocks (with a failed first attempt for one message in seven, so retries are timed),
one host's link to the database cut and healed, and one host lost whole (every process killed at once, links down).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings
from sqlalchemy import select

from prefect_webhooks.messages.outcomes import PENDING
from prefect_webhooks.messages.retry import JITTER
from prefect_webhooks.store.engine.engines import dispose_engines, get_engine
from prefect_webhooks.store.queue.outbox import OUTBOX
from prefect_webhooks.store.schema.tables import store_now
from tests.hosts import (
    BACK,
    CONNECTION_OPTIONS,
    FRONT,
    INGEST_PORT,
    ROOT,
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
from tests.servers import save_destination, save_source
from tests.skewed_clocks import skewed_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RATE, BATCH = 1000, 10
LEASE_SECONDS = 10.0
CLAIM_INTERVAL = 1.0  # a delivery worker that found nothing claims again within this (its idle sleep, rounded up)
RETRY_BASE_DELAY = 3.0
FAIL_EVERY = 7
# How far two hosts' readings of the database's clock may disagree: each is off by at most half its round trip, tens
# of ms on this 2-core machine under load (store.schema.clock). A host's own clock deciding put retries 0.7-1 s early
# here.
CLOCK_TOLERANCE = 0.15
SKEW = {"a1": +60.0, "a2": -60.0}
DESTINATION, SOURCE = "hosts-dest", "hosts-source"


@dataclass
class Cluster:
    network: Network
    apps: dict[str, Host]
    receiver_url: str
    lb_url: str
    store_url: str
    auth: str
    workdir: Path
    prefect_url: str = ""
    app_store_url: str = ""
    serves: dict[str, subprocess.Popen[Any]] = field(default_factory=dict)
    steps: int = 0
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def next_step(self) -> int:
        self.steps += 1
        return self.steps

    def arrivals(self, step: int) -> list[tuple[int, str, float, int]]:
        return [tuple(entry) for entry in httpx.get(f"{self.receiver_url}/_arrivals/{step}", timeout=30).json()]

    def stats(self, step: int) -> dict[str, Any]:
        return httpx.get(f"{self.receiver_url}/_stats/{step}", timeout=30).json()


def start_serve(cluster: Cluster, host: Host, prefect_url: str, app_store_url: str) -> subprocess.Popen[Any]:
    home = cluster.workdir / host.name
    home.mkdir(exist_ok=True)
    env = {**child_env(), **skewed_env(SKEW[host.name]),
           "PREFECT_API_URL": prefect_url, "PREFECT_HOME": str(home / "prefect"),
           "PREFECT_WEBHOOKS_DATABASE_URL": app_store_url, "PREFECT_WEBHOOKS_HOME": str(home / "webhooks"),
           "PREFECT_WEBHOOKS_LEASE_SECONDS": str(LEASE_SECONDS),
           "PREFECT_WEBHOOKS_RETRY_BASE_DELAY": str(RETRY_BASE_DELAY),
           "PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS": "5"}
    log = cluster.workdir / f"serve-{host.name}.log"
    process = host.run([sys.executable, "-m", "prefect_webhooks.cli", "serve", "--host", host.address(FRONT),
                        "--port", str(INGEST_PORT)], env=env, log=log)
    return process


def require_hosts_tests() -> None:
    """Skip unless asked for (PREFECT_WEBHOOKS_TEST_HOSTS=1) and this machine has what the hosts need."""
    if os.environ.get("PREFECT_WEBHOOKS_TEST_HOSTS") != "1":
        # Not in CI yet: in one run of five the +60 s host's delivery worker stopped claiming after a Prefect API
        # timeout (its later faults then found it holding nothing). Run with PREFECT_WEBHOOKS_TEST_HOSTS=1.
        pytest.skip("the several-hosts tests run with PREFECT_WEBHOOKS_TEST_HOSTS=1 (see the module)")
    require_namespaces()
    skewed_env(0)  # skips (fails in CI) without libfaketime


def hosts_workdir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A module's folder for its hosts' files (readable by the ``postgres`` user), once the hosts tests may run."""
    require_hosts_tests()
    workdir = tmp_path_factory.mktemp(name)
    workdir.chmod(0o755)
    return workdir


def start_applications(network: Network, workdir: Path, prefect_host: Host, store_url: str,
                       app_store_url: str) -> Cluster:
    """Everything but the database: the Prefect server on ``prefect_host``, the receiver (``rx``) with the
    destination and source saved, ``serve`` on ``a1`` and ``a2`` with ``app_store_url``, haproxy (``lb``) in front
    of them once they are healthy. ``store_url`` is the store as this process reads it."""
    apps = {name: network.add_host(name, number, [FRONT, BACK]) for name, number in (("a1", 11), ("a2", 12))}
    rx = network.add_host("rx", 20, [FRONT])
    lb = network.add_host("lb", 30, [FRONT])
    prefect_url = start_prefect_server(prefect_host, workdir, child_env())
    receiver_url = start_receiver(rx, workdir, child_env())
    write_key = f"wk_{uuid.uuid4().hex}"
    with temporary_settings(updates={PREFECT_API_URL: prefect_url}):
        save_destination(DESTINATION, [receiver_url], shared_secret="hosts-secret-0001")
        save_source(SOURCE, write_key, [DESTINATION])
    cluster = Cluster(network, apps, receiver_url, "", store_url,
                      "Basic " + base64.b64encode(f"{write_key}:".encode()).decode(), workdir)
    cluster.prefect_url, cluster.app_store_url = prefect_url, app_store_url
    cluster.serves = {name: start_serve(cluster, host, prefect_url, app_store_url) for name, host in apps.items()}
    for name, host in apps.items():
        wait_http(f"http://{host.address(FRONT)}:{INGEST_PORT}/health", 180, f"serve on {name}",
                  cluster.serves[name], workdir / f"serve-{name}.log")
    cluster.lb_url = start_haproxy(lb, list(apps.values()), workdir)
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = hosts_workdir(tmp_path_factory, "hosts")
    network = Network()
    try:
        db = network.add_host("db", 10, [BACK])
        server = start_postgres(db)
        with psycopg.connect(server, autocommit=True) as connection:
            connection.execute("CREATE DATABASE webhooks")
        store_url = server.rsplit("/", 1)[0] + "/webhooks"
        cluster = start_applications(network, workdir, db, store_url, f"{store_url}?{CONNECTION_OPTIONS}")
        yield cluster
        print("\nseveral hosts, per fault:\n" + "\n".join(f"  {name}: {json.dumps(result)}"
                                                        for name, result in cluster.results.items()))
    finally:
        dispose_engines()
        network.close()


@dataclass
class Stream:
    """An open-loop stream through the load balancer (``bench_capacity.py``'s generator) in a thread's process."""

    cluster: Cluster
    seconds: float
    answer_times: bool = False  # the result gets when each batch was sent and answered (``answered``)
    step: int = 0
    result: dict[str, Any] | None = None
    process: subprocess.Popen[str] | None = None
    started: float = 0.0

    def __enter__(self) -> Stream:
        self.step = self.cluster.next_step()
        spec = {"url": f"{self.cluster.lb_url}/v1/batch", "auth": self.cluster.auth, "batch": BATCH, "rate": RATE,
                "seconds": self.seconds, "step": self.step, "first": 0, "run": uuid.uuid4().hex[:6],
                "connections": 64, "timeout": 60}
        if self.answer_times:
            spec["answer_times"] = str(self.answers_file())
        self.started = time.time()
        self.process = subprocess.Popen([sys.executable, str(ROOT / "bench" / "load_generator.py"),
                                         json.dumps(spec)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                        env=child_env())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        try:
            out, _ = self.process.communicate(timeout=self.seconds + 120)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)
        if exc[0] is None:
            assert self.process.returncode == 0, "the load generator failed"
            self.result = json.loads(out.strip().splitlines()[-1])
            if self.answer_times:
                self.result["answered"] = json.loads(self.answers_file().read_text())

    def answers_file(self) -> Path:
        return self.cluster.workdir / f"answers-{self.step}.json"

    def acknowledged(self) -> set[int]:
        """The message numbers of every batch answered 200."""
        assert self.result is not None
        refused = set(self.result["unacknowledged"])
        sent = self.result["sent"]
        return {seq for first in range(0, sent, BATCH) if first not in refused for seq in range(first, first + BATCH)}


def held_by(cluster: Cluster, pids: list[int]) -> set[int]:
    """The message numbers (``bench_seq``) of pending rows leased by the processes ``pids`` under a live lease."""
    marks = [f"%:{pid}:%" for pid in pids]
    engine = get_engine(cluster.store_url)
    query = select(OUTBOX.c.lease_owner, OUTBOX.c.body).where(
        OUTBOX.c.state == PENDING, OUTBOX.c.lease_expires_at > store_now(engine))
    held = set()
    with engine.connect() as connection:
        for owner, body in connection.execute(query):
            if owner and any(f":{pid}:" in owner for pid in pids):
                held.add(orjson.loads(body)["properties"]["bench_seq"])
    assert marks
    return held


def pending_rows(cluster: Cluster) -> int:
    with get_engine(cluster.store_url).connect() as connection:
        return len(connection.execute(select(OUTBOX.c.id).where(OUTBOX.c.state == PENDING)).all())


def drained(cluster: Cluster, step: int, expected: set[int], timeout: float) -> dict[int, list[tuple[str, float, int]]]:
    """Wait until every expected message arrived (answered 200) and nothing is pending; returns the arrivals by
    message."""
    deadline = time.monotonic() + timeout
    while True:
        by_message: dict[int, list[tuple[str, float, int]]] = defaultdict(list)
        for seq, peer, at, status in cluster.arrivals(step):
            by_message[seq].append((peer, at, status))
        delivered = {seq for seq, arrivals in by_message.items() if any(status == 200 for _, _, status in arrivals)}
        if (expected <= delivered and not pending_rows(cluster)) or time.monotonic() > deadline:
            return by_message
        time.sleep(1)


def duplicates_of(by_message: dict[int, list[tuple[str, float, int]]]) -> Counter[int]:
    return Counter({seq: sum(status == 200 for _, _, status in arrivals) - 1 for seq, arrivals in by_message.items()
                    if sum(status == 200 for _, _, status in arrivals) > 1})


def test_clocks_a_minute_off_send_nothing_twice_and_no_retry_early(cluster: Cluster) -> None:
    """a1 runs 60 s ahead, a2 60 s behind: with the database's clock deciding, no lease is taken from the other
    host and no retry goes before its backoff (at least ``RETRY_BASE_DELAY`` less the jitter)."""
    httpx.get(f"{cluster.receiver_url}/_fail_first/{FAIL_EVERY}", timeout=10)
    try:
        with Stream(cluster, 15) as stream:
            pass
    finally:
        httpx.get(f"{cluster.receiver_url}/_fail_first/0", timeout=10)
    acknowledged = stream.acknowledged()
    by_message = drained(cluster, stream.step, acknowledged, 60)
    delivered = {seq for seq, arrivals in by_message.items() if any(status == 200 for _, _, status in arrivals)}
    early = []
    retried = 0
    for seq, arrivals in by_message.items():
        failed_at = [at for _, at, status in arrivals if status == 500]
        if failed_at:
            retried += 1
            later = [at for _, at, status in arrivals if status == 200]
            if later and min(later) - failed_at[0] < RETRY_BASE_DELAY * (1 - JITTER) - CLOCK_TOLERANCE:
                early.append((seq, round(min(later) - failed_at[0], 2)))
    senders = Counter(peer for arrivals in by_message.values() for peer, _, _ in arrivals)
    duplicates = duplicates_of(by_message)
    cluster.results["clocks +60 s / -60 s"] = {
        "sent": stream.result["sent"], "answers": stream.result["answers"], "delivered": len(delivered),
        "duplicates": sum(duplicates.values()), "retried": retried, "early retries": len(early),
        "senders": dict(senders)}
    print(f"\nclocks a minute off: {cluster.results['clocks +60 s / -60 s']}, early: {early[:10]}")
    assert stream.result["sent"] >= RATE * 14
    assert acknowledged <= delivered, f"acknowledged but not delivered: {sorted(acknowledged - delivered)[:20]}"
    assert not duplicates, f"sent twice: {dict(list(duplicates.items())[:20])}"
    assert retried >= len(acknowledged) // FAIL_EVERY // 2
    assert not early, early[:20]
    assert len(senders) == 2, "both hosts must deliver"


def test_a_host_cut_off_from_the_database_answers_503_and_sends_nothing_after_the_heal(cluster: Cluster) -> None:
    """a1's link to the database goes down for 12 s while its front link stays up: its ingest API answers 503 (never
    200), the load balancer takes it out, a2 delivers a1's leased messages after their lease; healed, a1 sends
    nothing a2 delivered meanwhile."""
    a1 = cluster.apps["a1"]
    direct = f"http://{a1.address(FRONT)}:{INGEST_PORT}"
    answers: list[int | str] = []
    waits: list[float] = []
    probing = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=20) as client:
            number = 0
            while probing.is_set():
                call = {"batch": [{"type": "track", "userId": "probe", "event": "Probe",
                                   "messageId": f"probe-{uuid.uuid4().hex}", "properties": {"n": number}}]}
                started = time.monotonic()
                try:
                    answers.append(client.post(f"{direct}/v1/batch", json=call,
                                               headers={"Authorization": cluster.auth}).status_code)
                except httpx.HTTPError as exc:
                    answers.append(type(exc).__name__)
                waits.append(round(time.monotonic() - started, 1))
                number += 1
                time.sleep(0.5)

    with Stream(cluster, 20) as stream:
        time.sleep(4)
        pids = a1.pids()
        # The cut must land while a1 holds leases: a batch takes milliseconds, and between two it holds none. A cut
        # that found none is healed at once (a few milliseconds: TCP resends what was lost) and made again.
        for _ in range(100):
            cluster.network.cut(a1, BACK)
            cut_at = time.time()
            held = held_by(cluster, pids)
            if held:
                break
            cluster.network.heal(a1, BACK)
            time.sleep(0.05)
        else:
            cluster.network.cut(a1, BACK)  # never found holding leases: cut all the same (the test then fails)
            cut_at = time.time()
        probing.set()
        prober = threading.Thread(target=probe)
        prober.start()
        time.sleep(12)
        probing.clear()
        prober.join(30)
        cluster.network.heal(a1, BACK)
        healed_at = time.time()
    acknowledged = stream.acknowledged()
    by_message = drained(cluster, stream.step, acknowledged, 90)
    delivered = {seq for seq, arrivals in by_message.items() if any(status == 200 for _, _, status in arrivals)}
    duplicates = duplicates_of(by_message)
    a1_address = a1.address(FRONT)
    # After the heal, anything a1 sent that another host had delivered before it.
    late = []
    for seq, arrivals in by_message.items():
        first_elsewhere = min((at for peer, at, status in arrivals if peer != a1_address and status == 200),
                              default=None)
        for peer, at, _ in arrivals:
            if peer == a1_address and at > healed_at + 0.5 and first_elsewhere is not None and first_elsewhere < at:
                late.append(seq)
    cluster.results["database link cut 12 s"] = {
        "sent": stream.result["sent"], "answers at the LB": stream.result["answers"], "delivered": len(delivered),
        "held by the cut host": len(held), "duplicates": sum(duplicates.values()),
        "sent by it after the heal, delivered elsewhere": len(late), "its own API's answers": dict(Counter(answers)),
        "seconds to each answer": waits,
        "cut at": round(cut_at - stream.started, 1), "healed at": round(healed_at - stream.started, 1)}
    print(f"\nlink to the database cut: {cluster.results['database link cut 12 s']}")
    assert stream.result["answers"] == {"200": stream.result["sent"] // BATCH}, stream.result["answers"]
    assert acknowledged <= delivered, f"acknowledged but not delivered: {sorted(acknowledged - delivered)[:20]}"
    assert 200 not in answers, "the cut host's ingest API accepted a call it could not store"
    assert 503 in answers, answers
    assert held, "the cut must land while the host holds leases"
    assert set(duplicates) <= held, f"duplicates of messages the cut host did not hold: {set(duplicates) - held}"
    assert not late, late[:20]
    assert wait_for_health(direct, 60), "the healed host's ingest API did not come back"


def wait_for_health(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=3).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


def test_a_lost_hosts_leased_messages_are_delivered_by_the_other_within_a_lease(cluster: Cluster) -> None:
    """Every process of a1 killed at once and its links taken down under the stream: the load balancer sends on to
    a2, nothing acknowledged is lost, a1's leased messages arrive from a2 within the lease and a claim interval,
    and only those may arrive twice."""
    a1 = cluster.apps["a1"]
    with Stream(cluster, 18) as stream:
        time.sleep(6)
        pids = a1.pids()
        killed = a1.lose()
        lost_at = time.time()
        held = held_by(cluster, pids)
    acknowledged = stream.acknowledged()
    by_message = drained(cluster, stream.step, acknowledged, 90)
    delivered = {seq for seq, arrivals in by_message.items() if any(status == 200 for _, _, status in arrivals)}
    duplicates = duplicates_of(by_message)
    a1_address = a1.address(FRONT)
    late = {seq: round(min(at for peer, at, status in by_message[seq] if status == 200 and peer != a1_address)
                       - lost_at, 1)
            for seq in held if any(status == 200 and peer != a1_address for peer, _, status in by_message.get(seq, []))}
    slowest = max(late.values(), default=0.0)
    cluster.results["host lost"] = {
        "sent": stream.result["sent"], "answers at the LB": stream.result["answers"], "delivered": len(delivered),
        "processes killed": killed, "held by the lost host": len(held), "duplicates": sum(duplicates.values()),
        "its messages delivered by the other after (s)": slowest}
    print(f"\nhost lost: {cluster.results['host lost']}")
    assert killed >= 3
    assert stream.result["answers"] == {"200": stream.result["sent"] // BATCH}, stream.result["answers"]
    assert acknowledged <= delivered, f"acknowledged but not delivered: {sorted(acknowledged - delivered)[:20]}"
    assert held, "the loss must land while the host holds leases"
    assert held <= set(late), f"held by the lost host, never delivered by the other: {sorted(held - set(late))[:20]}"
    assert slowest <= LEASE_SECONDS + CLAIM_INTERVAL + 2.0, late
    assert set(duplicates) <= held, f"duplicates of messages the lost host did not hold: {set(duplicates) - held}"


# Each host's serve stops (SIGTERM), starts again and is healthy within this; the stream covers both restarts (90 s
# in the first run: each serve took 23-26 s to stop and 10-19 s to answer /health again).
ROLLING_STREAM_SECONDS = 100.0
DELIVERY_P99_SECONDS = 2.0


def test_a_rolling_restart_loses_nothing(cluster: Cluster) -> None:
    """Under the stream, each application host in turn gets SIGTERM for its serve, which is started again once it has
    stopped: each serve exits 0 and is back within the stream, nothing acknowledged is lost. What the load balancer
    refused and how long delivery took are asserted by the next test."""
    # Last in the module: the host the loss test took away comes back first (links up, serve started again).
    for name, host in cluster.apps.items():
        if cluster.serves[name].poll() is not None:
            for network in host.networks:
                cluster.network.heal(host, network)
            cluster.serves[name] = start_serve(cluster, host, cluster.prefect_url, cluster.app_store_url)
            wait_http(f"http://{host.address(FRONT)}:{INGEST_PORT}/health", 180, f"serve on {name} back",
                      cluster.serves[name], cluster.workdir / f"serve-{name}.log")
    time.sleep(3)  # haproxy's two passed checks
    restarts: dict[str, dict[str, float]] = {}
    with Stream(cluster, ROLLING_STREAM_SECONDS) as stream:
        time.sleep(5)
        for name, host in cluster.apps.items():
            process = cluster.serves[name]
            log = cluster.workdir / f"serve-{name}.log"
            logged = log.stat().st_size
            asked = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait(90)
            stopped = time.monotonic()
            with log.open("rb") as lines:
                lines.seek(logged)
                stages = [line.split("serve: ", 1)[1].strip() for line in lines.read().decode(errors="replace")
                          .splitlines() if "prefect-webhooks serve: " in line and " stop" in line]
            cluster.serves[name] = start_serve(cluster, host, cluster.prefect_url, cluster.app_store_url)
            wait_http(f"http://{host.address(FRONT)}:{INGEST_PORT}/health", 180, f"serve on {name} restarted",
                      cluster.serves[name], cluster.workdir / f"serve-{name}.log")
            healthy = time.monotonic()
            # haproxy takes it back after two passed checks 0.5 s apart; the next host stops only once it has.
            time.sleep(3)
            restarts[name] = {"exit code": process.returncode, "stopped in (s)": round(stopped - asked, 1),
                              "healthy again after (s)": round(healthy - stopped, 1), "its stages": stages,
                              "at (s into the stream)": round(time.time() - stream.started - (healthy - asked), 1)}
        restarted_by = time.time() - stream.started
    acknowledged = stream.acknowledged()
    by_message = drained(cluster, stream.step, acknowledged, 90)
    delivered = {seq for seq, arrivals in by_message.items() if any(status == 200 for _, _, status in arrivals)}
    stats = cluster.stats(stream.step)
    cluster.results["rolling restart"] = {
        "sent": stream.result["sent"], "answers at the LB": stream.result["answers"], "delivered": len(delivered),
        "duplicates": sum(duplicates_of(by_message).values()), "delivery p50 (s)": round(stats["p50"], 3),
        "delivery p99 (s)": round(stats["p99"], 3), "delivery max (s)": round(stats["max"], 3),
        "ack p99 (s)": round(stream.result["ack_p99"], 3), "restarts": restarts,
        "both restarted by (s)": round(restarted_by, 1)}
    print(f"\nrolling restart: {cluster.results['rolling restart']}")
    assert acknowledged <= delivered, f"acknowledged but not delivered: {sorted(acknowledged - delivered)[:20]}"
    assert all(restart["exit code"] == 0 for restart in restarts.values()), restarts
    assert restarted_by < ROLLING_STREAM_SECONDS, "the stream ended before both hosts were back"


@pytest.mark.xfail(strict=True, reason=(
    "not met on the 2-core test machine (2026-12-04): while one host restarts, the other alone answers /health in "
    "over haproxy's 2 s check timeout, goes DOWN, and haproxy answers 503 with no server left (1,755 of 7,500 calls "
    "in the first run; delivery p99 16.4 s). The remedy (a /health that a group commit cannot hold up, serve "
    "failing /health before it stops) is not done yet"))
def test_a_rolling_restart_refuses_no_call_and_delivers_within_2_s(cluster: Cluster) -> None:
    """The rolling restart above (issue 54): 0 calls refused at the load balancer, delivery p99 within 2 s."""
    result = cluster.results.get("rolling restart")
    assert result is not None, "test_a_rolling_restart_loses_nothing did not run"
    assert result["answers at the LB"] == {"200": result["sent"] // BATCH}, result["answers at the LB"]
    assert result["delivery p99 (s)"] <= DELIVERY_P99_SECONDS, result["delivery p99 (s)"]
