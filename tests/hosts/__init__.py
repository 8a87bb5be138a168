"""Real hosts on one machine for the several-hosts tests: Linux network namespaces, one per host, wired by the test.

``Network`` makes a switch namespace with two bridges and one namespace per host:

- the *front* network (``10.254.N.0/24``): the load balancer, the application hosts' ingest APIs, the receiver;
- the *back* network (``10.253.N.0/24``): the database host (PostgreSQL, the Prefect server) and the application
  hosts' store and Prefect connections.

This process (the test, in the machine's own namespace) has an address on both (``.1``): it sends the load to the
load balancer and reads the store. ``N`` is chosen so that it overlaps no route of the machine. Faults are made as
they happen: ``Host.lose()`` kills every process in the host's namespace at once (``ip netns pids``) and takes its
links down; ``Network.cut(host, "back")`` takes the switch's port of one host's back link down (the host's own
interface stays up, its packets go nowhere: a partition, not a refused connection) and ``heal`` brings it back.
A database host may run a primary (``start_postgres``) or a streaming standby of another's (``start_standby``);
``pg_ctl(host, "stop", "-m", "immediate")`` stops its server as a crash would and ``pg_ctl(host, "promote")``
promotes a standby.

Everything is removed at ``close()``: processes in the namespaces, the namespaces (their interfaces go with them),
this namespace's ends of the links. Needs root and ``ip`` (iproute2); ``require_namespaces()`` skips a test
without them (in CI, which runs as root, it fails instead).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
FRONT, BACK = "front", "back"
PG_PORT, PREFECT_PORT, INGEST_PORT, RECEIVER_PORT, LB_PORT = 5432, 4200, 8088, 9000, 8080


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def require_namespaces() -> None:
    """Skip (fail in CI) unless this process may make network namespaces, and haproxy and PostgreSQL are here."""
    missing = [tool for tool in ("ip", "haproxy") if shutil.which(tool) is None]
    problem = None
    if os.geteuid() != 0:
        problem = "network namespaces need root"
    elif missing:
        problem = f"missing: {', '.join(missing)} (.ci/run installs iproute2 and haproxy)"
    else:
        name = f"pwcheck{uuid.uuid4().hex[:6]}"
        made = _ip("netns", "add", name, check=False)
        _ip("netns", "del", name, check=False)
        if made.returncode != 0:
            problem = f"ip netns add failed: {made.stderr.strip()}"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)


@dataclass
class Host:
    """One host: a namespace with an address on the front and/or back network, and the processes it runs."""

    network: Network
    name: str
    number: int
    networks: tuple[str, ...]
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)
    postgres_data: Path | None = None  # the data folder of the PostgreSQL cluster it runs, if any

    @property
    def namespace(self) -> str:
        return f"{self.network.prefix}{self.name}"

    def address(self, network: str) -> str:
        return f"{self.network.subnet[network]}.{self.number}"

    def interface(self, network: str) -> str:
        """This host's interface on ``network`` (inside its namespace)."""
        return f"{self.network.prefix}{self.name[:3]}{network[0]}"

    def port(self, network: str) -> str:
        """The switch's end of this host's link to ``network``."""
        return f"{self.network.prefix}{self.name[:3]}{network[0]}s"

    def run(self, command: Sequence[str], *, env: dict[str, str] | None = None, log: Path | None = None,
            user: str | None = None) -> subprocess.Popen[Any]:
        """Start ``command`` in this host's namespace (a session of its own), its output to ``log``."""
        prefix = ["ip", "netns", "exec", self.namespace]
        if user:
            prefix += ["runuser", "-u", user, "--"]
        out: IO[bytes] | int = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - the child holds it
        try:
            process = subprocess.Popen([*prefix, *command], env=env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True, cwd=ROOT)
        finally:
            if log:
                out.close()  # type: ignore[union-attr]
        self.processes.append(process)
        return process

    def pids(self) -> list[int]:
        """Every process in this host's namespace."""
        listed = _ip("netns", "pids", self.namespace, check=False).stdout.split()
        return [int(pid) for pid in listed]

    def kill_all(self, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to every process of the host at once; returns how many."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        self.processes = [process for process in self.processes if process.poll() is None]
        return len(pids)

    def lose(self) -> int:
        """The host is gone: every process killed at once, its links down. Returns how many processes died."""
        killed = self.kill_all()
        for network in self.networks:
            self.network.cut(self, network)
        return killed


class Network:
    """The test's hosts and the networks between them (see the module)."""

    def __init__(self) -> None:
        self.prefix = f"pw{uuid.uuid4().hex[:4]}"
        self.switch = f"{self.prefix}sw"
        self.hosts: dict[str, Host] = {}
        self.folders: list[Path] = []
        third = self._free_third_octet()
        self.subnet = {FRONT: f"10.254.{third}", BACK: f"10.253.{third}"}
        self.closed = False
        _ip("netns", "add", self.switch)
        self._in(self.switch, "link", "set", "lo", "up")
        for network in (FRONT, BACK):
            bridge = self._bridge(network)
            self._in(self.switch, "link", "add", bridge, "type", "bridge")
            self._in(self.switch, "link", "set", bridge, "up")
            # This process's own address on each network.
            here, there = f"{self.prefix}t{network[0]}", f"{self.prefix}t{network[0]}s"
            _ip("link", "add", here, "type", "veth", "peer", "name", there, "netns", self.switch)
            _ip("addr", "add", f"{self.subnet[network]}.1/24", "dev", here)
            _ip("link", "set", here, "up")
            self._in(self.switch, "link", "set", there, "master", bridge, "up")

    @staticmethod
    def _free_third_octet() -> int:
        routes = _ip("-4", "route", "show", "table", "all").stdout
        addresses = _ip("-4", "addr").stdout
        choices = list(range(16, 250))
        random.shuffle(choices)
        for third in choices:
            if f"10.254.{third}." not in routes + addresses and f"10.253.{third}." not in routes + addresses:
                return third
        raise RuntimeError("no free 10.254.N.0/24 and 10.253.N.0/24 for the test's networks")

    def _bridge(self, network: str) -> str:
        return f"{self.prefix}br{network[0]}"

    @staticmethod
    def _in(namespace: str, *args: str) -> None:
        _ip("-n", namespace, *args)

    def add_host(self, name: str, number: int, networks: Sequence[str]) -> Host:
        """A new host with address ``.number`` on each of ``networks``."""
        host = Host(self, name, number, tuple(networks))
        self.hosts[name] = host
        _ip("netns", "add", host.namespace)
        self._in(host.namespace, "link", "set", "lo", "up")
        for network in networks:
            inside, port = host.interface(network), host.port(network)
            _ip("link", "add", inside, "netns", host.namespace, "type", "veth", "peer", "name", port,
                "netns", self.switch)
            self._in(host.namespace, "addr", "add", f"{host.address(network)}/24", "dev", inside)
            self._in(host.namespace, "link", "set", inside, "up")
            self._in(self.switch, "link", "set", port, "master", self._bridge(network), "up")
        return host

    def cut(self, host: Host, network: str) -> None:
        """Take the switch's port of ``host``'s link to ``network`` down: its packets there go nowhere."""
        self._in(self.switch, "link", "set", host.port(network), "down")

    def heal(self, host: Host, network: str) -> None:
        """Bring the link back."""
        self._in(self.switch, "link", "set", host.port(network), "up")

    def close(self) -> None:
        """Stop every process in the hosts' namespaces and remove the namespaces and links."""
        if self.closed:
            return
        self.closed = True
        for host in self.hosts.values():
            host.kill_all(signal.SIGTERM)
        time.sleep(0.5)
        for host in self.hosts.values():
            host.kill_all(signal.SIGKILL)
            _ip("netns", "del", host.namespace, check=False)
        for network in (FRONT, BACK):
            _ip("link", "del", f"{self.prefix}t{network[0]}", check=False)
        _ip("netns", "del", self.switch, check=False)
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)


# What the guide says to put in every process's connection string: a dead link is noticed within seconds, not the
# kernel's 15 minutes of retransmissions.
CONNECTION_OPTIONS = ("connect_timeout=3&tcp_user_timeout=5000&keepalives_idle=5&keepalives_interval=2"
                      "&keepalives_count=2")


def child_env() -> dict[str, str]:
    """The environment of a process a test starts on a host: this one's, less pytest's and Prefect's settings."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PREFECT_"))},
            "PYTHONPATH": str(ROOT)}


def wait_http(url: str, timeout: float, what: str, process: subprocess.Popen[Any] | None = None,
              log: Path | None = None) -> None:
    """Wait until ``url`` answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}: {_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{what} not answering at {url} after {timeout:.0f} s: {_tail(log)}")


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return log.read_text(errors="replace")[-3000:]


# The server's side of docs/operations/several-hosts.md's connection options. A host cut off in the middle of a
# transaction leaves its backend waiting in ClientRead with the row locks it took: without keepalives the server
# notices after the kernel's two hours, and the other hosts' writes of the same keys (the calls haproxy resent to
# them: the same messageIds) wait behind it. Seen: a2's ingest API stuck for minutes behind a1's dead INSERT into
# seen_ids after the cut test, its /health timing out, and 1,541 of 2,000 calls refused at the load balancer.
# No tcp_user_timeout here: in the one run with it (5 s) both application hosts' store calls failed for seconds during
# the clocks test at load average 7 (leases lapsed: 97 duplicates). Not understood, so left out.
SERVER_KEEPALIVES = ("-c", "tcp_keepalives_idle=5", "-c", "tcp_keepalives_interval=2", "-c", "tcp_keepalives_count=2")


def _postgres_bin(program: str) -> str:
    return str(sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1] / program)


def _postgres_folder(host: Host) -> Path:
    """A folder of the ``postgres`` user under /tmp for ``host``'s cluster (removed with the network)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{host.namespace}-pg-"))
    host.network.folders.append(workdir)
    shutil.chown(workdir, "postgres")
    return workdir


def start_postgres(host: Host, *, port: int = PG_PORT, settings: Sequence[str] = ()) -> str:
    """A fresh PostgreSQL cluster on ``host``'s back address, as the ``postgres`` user, in a folder of its own under
    /tmp (removed with the network); returns the server's URL (database ``postgres``). ``settings``: more ``-c``
    arguments (on the command line, so a standby copied from this cluster does not get them)."""
    workdir = _postgres_folder(host)
    data = workdir / "pgdata"
    subprocess.run(["runuser", "-u", "postgres", "--", _postgres_bin("initdb"), "-D", str(data), "-U", "postgres",
                    "--auth=trust", "-E", "UTF8"], check=True, capture_output=True)
    with (data / "pg_hba.conf").open("a") as hba:
        hba.write("host all all 0.0.0.0/0 trust\nhost replication all 0.0.0.0/0 trust\n")
    return _run_postgres(host, data, port, settings)


def start_standby(host: Host, primary: Host, *, name: str, port: int = PG_PORT) -> str:
    """A streaming standby of ``primary``'s cluster on ``host`` (``pg_basebackup -R`` from it, over the back network),
    its walreceiver named ``name`` (what ``synchronous_standby_names`` on the primary names); returns its URL."""
    workdir = _postgres_folder(host)
    data, log = workdir / "pgdata", workdir / "basebackup.log"
    copy = host.run([_postgres_bin("pg_basebackup"), "-h", primary.address(BACK), "-p", str(port), "-U", "postgres",
                     "-D", str(data), "-R", "-X", "stream", "-c", "fast"], user="postgres", log=log)
    if copy.wait(300) != 0:
        raise RuntimeError(f"pg_basebackup failed: {_tail(log)}")
    host.processes.remove(copy)
    # The walreceiver's application_name is cluster_name.
    return _run_postgres(host, data, port, ("-c", f"cluster_name={name}"))


def _run_postgres(host: Host, data: Path, port: int, settings: Sequence[str]) -> str:
    address = host.address(BACK)
    host.postgres_data = data
    log = data.parent / "postgres.log"
    log.touch()
    shutil.chown(log, "postgres")
    process = host.run([_postgres_bin("postgres"), "-D", str(data), "-p", str(port), "-k", str(data.parent),
                        "-c", f"listen_addresses={address}", "-c", "max_connections=300", "-c", "fsync=off",
                        "-c", "synchronous_commit=on", *SERVER_KEEPALIVES, *settings], log=log, user="postgres")
    url = f"postgresql://postgres@{address}:{port}/postgres"
    deadline = time.monotonic() + 60
    import psycopg

    while True:
        try:
            with psycopg.connect(url, connect_timeout=2):
                return url
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start: {_tail(log)}") from None
            time.sleep(0.2)


def pg_ctl(host: Host, *args: str) -> None:
    """``pg_ctl`` on ``host``'s cluster as the ``postgres`` user (``stop -m immediate``, ``promote``)."""
    assert host.postgres_data is not None, f"no PostgreSQL on {host.name}"
    subprocess.run(["runuser", "-u", "postgres", "--", _postgres_bin("pg_ctl"), "-D", str(host.postgres_data),
                    *args], check=True, capture_output=True, timeout=120)


def start_prefect_server(host: Host, workdir: Path, env: dict[str, str]) -> str:
    """``prefect server start`` on ``host``'s back address; returns its API URL once healthy."""
    address = host.address(BACK)
    url = f"http://{address}:{PREFECT_PORT}/api"
    home = workdir / "prefect-server"
    home.mkdir(parents=True, exist_ok=True)
    log = workdir / "prefect-server.log"
    process = host.run([sys.executable, "-m", "prefect", "server", "start", "--host", address, "--port",
                        str(PREFECT_PORT)],
                       env={**env, "PREFECT_HOME": str(home), "PREFECT_API_URL": url,
                            "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}, log=log)
    wait_http(f"{url}/health", 180, "the Prefect server", process, log)
    return url


def start_receiver(host: Host, workdir: Path, env: dict[str, str]) -> str:
    """``bench/recorder.py`` on ``host``'s front address, keeping every arrival; returns its URL."""
    address = host.address(FRONT)
    log = workdir / "receiver.log"
    process = host.run([sys.executable, str(ROOT / "bench" / "recorder.py"), str(RECEIVER_PORT), address],
                       env={**env, "RECORDER_ARRIVALS": "1"}, log=log)
    url = f"http://{address}:{RECEIVER_PORT}"
    wait_http(f"{url}/_stats/0", 30, "the receiver", process, log)
    return url


HAPROXY_CONFIG = """global
    maxconn 4000
defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 10s
    timeout check 2s
    retries 3
    option redispatch 1
    # An ingest call is idempotent (its messageIds are deduplicated): one that failed on a host is sent to another.
    retry-on conn-failure empty-response response-timeout 503
    option http-buffer-request
frontend ingest
    bind {address}:{port}
    default_backend apps
backend apps
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
{servers}
"""


def start_haproxy(host: Host, backends: Sequence[Host], workdir: Path) -> str:
    """haproxy on ``host``, balancing the ingest APIs of ``backends`` and checking ``/health`` every 0.5 s."""
    servers = "\n".join(f"    server {backend.name} {backend.address(FRONT)}:{INGEST_PORT} check inter 500 "
                        "fall 2 rise 2" for backend in backends)
    config = workdir / "haproxy.cfg"
    config.write_text(HAPROXY_CONFIG.format(address=host.address(FRONT), port=LB_PORT, servers=servers))
    subprocess.run(["haproxy", "-c", "-f", str(config)], check=True, capture_output=True)
    log = workdir / "haproxy.log"
    process = host.run(["haproxy", "-db", "-f", str(config)], log=log)
    url = f"http://{host.address(FRONT)}:{LB_PORT}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"haproxy exited: {_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=2)
            return url
        time.sleep(0.2)
    raise TimeoutError(f"haproxy not listening: {_tail(log)}")
