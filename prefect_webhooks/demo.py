"""The main job: the whole system on embedded defaults, end to end, on one machine, in bounded time.

``prefect-webhooks demo`` (and ``scripts/quickstart``) runs it. In a fresh run folder it:

1. starts a local Prefect server (SQLite under the run folder) and points ``PREFECT_API_URL`` at it;
2. starts a local receiver that checks every ``X-Signature`` with ``prefect_webhooks.signing.verify``;
3. registers the block types and saves a ``WebhookDestination`` (the receiver, a shared secret) and a ``Source``;
4. starts ``prefect-webhooks serve`` (ingest API + served deployments) against that server and store;
5. sends every call type through the ``Analytics`` client, runs an audience sync twice (first, then incremental)
   and a deletion, each through its served deployment;
6. waits until the receiver has everything, prints counts per type, the signature check and the UI links;
7. stops everything it started (process groups killed in ``finally``), so it can be run again at once.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from prefect_webhooks.signing import SIGNATURE_HEADER, verify
from prefect_webhooks.tables import table_text

DESTINATION_BLOCK = "demo-receiver"
SOURCE_BLOCK = "demo-app"
AUDIENCE_DEPLOYMENT = "demo-vip-users"
AUDIENCE_NAME = "VIP Users"
FIRST_MEMBERS = ("ada", "grace", "linus")
SECOND_MEMBERS = ("ada", "linus", "margaret")
DELETED_USER = "linus"
CALL_TYPES = ("identify", "track", "page", "screen", "group", "alias")
DEFAULT_TIMEOUT = 170.0
SERVER_START_TIMEOUT = 120.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def expected_counts() -> Counter[str]:
    """What the receiver must get: one per call type, the audience identifies (3 first, 2 changes) and 1 delete."""
    first = len(FIRST_MEMBERS)
    changes = len(set(FIRST_MEMBERS) ^ set(SECOND_MEMBERS))
    counts = Counter(dict.fromkeys(CALL_TYPES, 1))
    counts["identify"] += first + changes
    counts["delete"] = 1
    return counts


class SigningReceiver:
    """A local webhook receiver (aiohttp, own thread) that verifies ``X-Signature`` on every request."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.port = 0
        self.bodies: list[dict[str, Any]] = []
        self.verified = 0
        self.rejected = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        """The URL the destination block points at."""
        return f"http://127.0.0.1:{self.port}/webhook"

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read()
        signature = request.headers.get(SIGNATURE_HEADER, "")
        authentic = bool(signature) and verify(body, signature, self.secret)
        with self._lock:
            if authentic:
                self.verified += 1
                self.bodies.append(orjson.loads(body))
            else:
                self.rejected += 1
        # A receiver that cannot authenticate a request must not accept it.
        return web.Response(status=200 if authentic else 401, text="ok" if authentic else "bad signature")

    def _serve(self) -> None:
        from aiohttp import web

        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/webhook", self._handle)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def start(self) -> SigningReceiver:
        """Start serving; returns once the port is bound."""
        self._thread = threading.Thread(target=self._serve, name="demo-receiver", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the demo receiver did not start")
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._loop and self._thread:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def counts(self) -> Counter[str]:
        """Verified requests per message type."""
        with self._lock:
            return Counter(body.get("type", "?") for body in self.bodies)


def start_group(
    command: list[str], env: dict[str, str], log: Path, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``command`` in its own process group (in ``cwd``, by default this one's), output to ``log``."""
    with log.open("ab") as handle:
        return subprocess.Popen(
            command, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd
        )


def stop_group(process: subprocess.Popen[bytes] | None, grace: float = 20.0) -> None:
    """SIGTERM the process, wait ``grace`` seconds, then SIGKILL its whole group (nothing is left running)."""
    if process is None:
        return
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(grace)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        process.wait(5)


def wait_until_healthy(url: str, process: subprocess.Popen[bytes], what: str, timeout: float, log: Path) -> None:
    """Poll ``url`` until it answers 200; fail fast when ``process`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{what} exited with {process.returncode}; last output:\n{tail}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{what} not healthy after {timeout:.0f} s (see {log})")


def prefect_server_env(run_dir: Path, port: int, base: dict[str, str]) -> dict[str, str]:
    """Environment of the local Prefect server: its own home and SQLite database under the run folder."""
    home = run_dir / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    return {
        **base,
        # The UI would otherwise call the API on the default port 4200.
        "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        "PREFECT_UI_ENABLED": "true",
    }


def service_env(run_dir: Path, api_url: str, ingest_port: int, base: dict[str, str]) -> dict[str, str]:
    """Environment shared by the service and this process: the Prefect server, the store, short schedules."""
    return {
        **base,
        "PREFECT_HOME": str(run_dir / "prefect"),
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # Served runs are picked up within two seconds instead of ten.
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
        "PREFECT_WEBHOOKS_HOME": str(run_dir),
        "PREFECT_WEBHOOKS_DATABASE_URL": f"sqlite:///{run_dir / 'webhooks.db'}",
        "PREFECT_WEBHOOKS_INGEST_HOST": "127.0.0.1",
        "PREFECT_WEBHOOKS_INGEST_PORT": str(ingest_port),
        "PREFECT_WEBHOOKS_ENDPOINT": f"http://127.0.0.1:{ingest_port}",
        "PREFECT_WEBHOOKS_AUDIENCES_FILE": str(run_dir / "audiences.yaml"),
        "PREFECT_WEBHOOKS_DEPLOYMENTS_FILE": str(run_dir / "prefect.yaml"),
    }


def write_deployments_file(run_dir: Path) -> None:
    """The shipped deployments with short delivery runs, so the demo can wait for their artifacts before it ends."""
    from prefect_webhooks.deployments.serve import DELETIONS_DEPLOYMENT, DELIVER_DEPLOYMENT, write_definitions

    write_definitions(
        run_dir / "prefect.yaml",
        {
            DELIVER_DEPLOYMENT: {"schedules": [{"interval": 10}], "parameters": {"run_for_seconds": 15}},
            # The demo runs its deletion itself.
            DELETIONS_DEPLOYMENT: {"schedules": [{"interval": 3600}]},
        },
    )


def write_snapshot(path: Path, members: tuple[str, ...]) -> None:
    """Write an audience snapshot CSV."""
    path.write_text("user_id\n" + "".join(f"{member}\n" for member in members))


def write_audiences_file(run_dir: Path, snapshot: Path) -> None:
    """The audiences file the served deployments read: one audience sync, no cron (the demo triggers it)."""
    definition = {"name": AUDIENCE_NAME, "sources": [SOURCE_BLOCK], "snapshot": {"kind": "csv", "path": str(snapshot)}}
    entries = [{"name": AUDIENCE_DEPLOYMENT, "parameters": {"definition": definition}}]
    (run_dir / "audiences.yaml").write_text(yaml.safe_dump(entries, sort_keys=False))


@dataclass
class DemoStack:
    """Everything a demo run started, and where to reach it."""

    run_dir: Path
    env: dict[str, str]
    prefect_port: int
    ingest_port: int
    receiver: SigningReceiver
    secret: str
    write_key: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def ui_url(self) -> str:
        """Root URL of the Prefect UI of this run."""
        return f"http://127.0.0.1:{self.prefect_port}"

    @property
    def api_url(self) -> str:
        """``PREFECT_API_URL`` of this run."""
        return f"{self.ui_url}/api"

    @property
    def ingest_url(self) -> str:
        """Base URL of the ingest API."""
        return f"http://127.0.0.1:{self.ingest_port}"


@contextmanager
def prefect_settings(stack: DemoStack) -> Iterator[None]:
    """Point this process's Prefect client at the run's server (the settings were read at import)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: stack.api_url}):
        yield


def _apply_store_env(env: dict[str, str]) -> None:
    from prefect_webhooks.settings import get_settings
    from prefect_webhooks.store import dispose_engines

    for key, value in env.items():
        if key.startswith("PREFECT_WEBHOOKS_"):
            os.environ[key] = value
    get_settings.cache_clear()
    dispose_engines()


@contextmanager
def demo_stack(run_dir: Path | None = None, echo: bool = True) -> Iterator[DemoStack]:
    """Start the Prefect server, the receiver and the service for a demo run; stop all of it on exit.

    Args:
        run_dir: Folder for this run's store, Prefect database and logs; a new temporary folder by default.
        echo: Print progress lines.
    """
    run_dir = Path(run_dir or tempfile.mkdtemp(prefix="prefect-webhooks-demo-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    base = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PYTEST_"))}
    say = print if echo else (lambda *_args, **_kw: None)
    receiver = SigningReceiver(secrets.token_hex(16)).start()
    stack = DemoStack(
        run_dir=run_dir,
        env={},
        prefect_port=free_port(),
        ingest_port=free_port(),
        receiver=receiver,
        secret=receiver.secret,
        write_key="wk_demo_" + secrets.token_hex(8),
    )
    stack.env = service_env(run_dir, stack.api_url, stack.ingest_port, base)
    saved_env = {key: os.environ.get(key) for key in stack.env if key.startswith("PREFECT_WEBHOOKS_")}
    try:
        say(f"run folder: {run_dir}")
        say(f"starting a local Prefect server on {stack.ui_url} …", flush=True)
        server_log = run_dir / "prefect-server.log"
        server = start_group(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
             str(stack.prefect_port)],
            prefect_server_env(run_dir, stack.prefect_port, base),
            server_log,
        )
        stack.processes.append(server)
        wait_until_healthy(f"{stack.api_url}/health", server, "the Prefect server", SERVER_START_TIMEOUT, server_log)
        _apply_store_env(stack.env)
        snapshot = run_dir / "vip-users.csv"
        write_snapshot(snapshot, FIRST_MEMBERS)
        write_audiences_file(run_dir, snapshot)
        write_deployments_file(run_dir)
        with prefect_settings(stack):
            save_blocks(stack)
        say(f"starting prefect-webhooks serve (ingest API on {stack.ingest_url}) …", flush=True)
        service_log = run_dir / "service.log"
        service = start_group(
            [sys.executable, "-m", "prefect_webhooks.cli", "serve", "--host", "127.0.0.1", "--port",
             str(stack.ingest_port), "--grace", "15"],
            stack.env,
            service_log,
        )
        stack.processes.append(service)
        wait_until_healthy(f"{stack.ingest_url}/health/backlog", service, "the service", 60, service_log)
        yield stack
    finally:
        for process in reversed(stack.processes):
            stop_group(process)
        receiver.stop()
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _apply_store_env({})


def save_blocks(stack: DemoStack) -> None:
    """Register the block types and save the demo's destination and source."""
    from prefect_webhooks.blocks import Source, WebhookDestination

    WebhookDestination.register_type_and_schema()
    Source.register_type_and_schema()
    WebhookDestination(endpoints=[{"url": stack.receiver.url}], shared_secret=stack.secret).save(
        DESTINATION_BLOCK, overwrite=True
    )
    Source(write_key=stack.write_key, destinations=[DESTINATION_BLOCK]).save(SOURCE_BLOCK, overwrite=True)


def send_every_call(stack: DemoStack) -> None:
    """One call of each type through the Analytics client, flushed before returning."""
    from prefect_webhooks.client import Analytics

    errors: list[str] = []
    analytics = Analytics(
        stack.write_key, endpoint=stack.ingest_url, on_error=lambda error, messages: errors.append(str(error))
    )
    analytics.identify("ada", traits={"name": "Ada Lovelace", "plan": "pro"})
    analytics.track("ada", "Order Completed", properties={"revenue": 42.5, "currency": "EUR"})
    analytics.page("ada", name="Pricing", properties={"url": "https://example.com/pricing", "title": "Pricing"})
    analytics.screen(
        "ada", name="Home", context={"device": {"model": "Pixel 8", "type": "android"}, "app": {"version": "1.2"}}
    )
    analytics.group("ada", group_id="acme", traits={"name": "Acme Inc.", "employees": 42})
    analytics.alias(previous_id="anon-7f3a", user_id="ada")
    if not analytics.close(timeout=30) or errors:
        raise RuntimeError(f"the Analytics client could not send every call: {errors or 'flush timed out'}")


def run_deployment_and_wait(name: str, parameters: dict[str, Any] | None = None, timeout: float = 90) -> Any:
    """Run a served deployment and wait for it to finish; raise unless it completed."""
    from prefect.deployments import run_deployment

    flow_run = run_deployment(name, parameters=parameters or {}, timeout=timeout)
    if flow_run.state is None or not flow_run.state.is_completed():
        state = flow_run.state.name if flow_run.state else "unknown"
        raise RuntimeError(f"deployment {name} ended {state} (flow run {flow_run.id})")
    return flow_run


def wait_for_deployments(names: list[str], service: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """Wait until the served deployments are registered with the Prefect server."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout
    missing = list(names)
    with get_client(sync_client=True) as client:
        while missing and time.monotonic() < deadline:
            if service is not None and service.poll() is not None:
                raise RuntimeError(f"the service exited with {service.returncode}")
            try:
                client.read_deployment_by_name(missing[0])
                missing.pop(0)
            except ObjectNotFound:
                time.sleep(0.5)
    if missing:
        raise TimeoutError(f"deployments not served after {timeout:.0f} s: {', '.join(missing)}")


def start_delivery() -> None:
    """Start a delivery run now instead of waiting for the schedule's first slot."""
    from prefect.deployments import run_deployment

    from prefect_webhooks.deployments.serve import DELIVER_DEPLOYMENT

    run_deployment(f"deliver/{DELIVER_DEPLOYMENT}", timeout=0)


def wait_for_counts(receiver: SigningReceiver, want: Counter[str], timeout: float) -> None:
    """Wait until the receiver has at least ``want`` of every type."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = receiver.counts()
        if all(got[kind] >= count for kind, count in want.items()):
            return
        time.sleep(0.2)
    raise TimeoutError(f"receiver has {dict(receiver.counts())}, waited for {dict(want)}")


def api_filter(stack: DemoStack, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST a ``/filter`` query to the run's Prefect REST API.

    The REST API is used directly: the sync client of prefect 3.8.8 sends ``null`` for every filter not given, which
    the server rejects, and empty filters would join artifacts to task runs and hide flow-level artifacts.
    """
    answer = httpx.post(f"{stack.api_url}/{path}/filter", json=body, timeout=30)
    answer.raise_for_status()
    return answer.json()


def deliver_runs(stack: DemoStack, states: list[str] | None = None) -> list[dict[str, Any]]:
    """The flow runs of the ``deliver`` flow, oldest first, optionally only in the given state types."""
    body: dict[str, Any] = {"flows": {"name": {"any_": ["deliver"]}}, "sort": "START_TIME_ASC", "limit": 200}
    if states:
        body["flow_runs"] = {"state": {"type": {"any_": states}}}
    return api_filter(stack, "flow_runs", body)


def wait_for_running_deliveries(stack: DemoStack, timeout: float) -> None:
    """Wait until the deliver runs running now have finished (their table artifacts are written at the end)."""
    deadline = time.monotonic() + timeout
    waiting = {run["id"] for run in deliver_runs(stack, ["RUNNING", "PENDING"])}
    while waiting and time.monotonic() < deadline:
        time.sleep(1)
        still = {run["id"] for run in deliver_runs(stack, ["RUNNING", "PENDING", "CANCELLING"])}
        waiting &= still
    if waiting:
        raise TimeoutError(f"{len(waiting)} deliver run(s) still running after {timeout:.0f} s")


def drive(stack: DemoStack, timeout: float, echo: bool = True) -> dict[str, Any]:
    """Send the traffic of a demo run through a started stack and wait for the receiver to have all of it."""
    from prefect_webhooks.deployments.serve import DELETIONS_DEPLOYMENT, DELIVER_DEPLOYMENT

    say = print if echo else (lambda *_args, **_kw: None)
    deadline = time.monotonic() + timeout
    with prefect_settings(stack):
        served = [f"deliver/{DELIVER_DEPLOYMENT}", f"deletions/{DELETIONS_DEPLOYMENT}"]
        wait_for_deployments(
            [*served, f"audience-sync/{AUDIENCE_DEPLOYMENT}"],
            stack.processes[-1] if stack.processes else None,
            min(90.0, deadline - time.monotonic()),
        )
        start_delivery()
        say("sending identify, track, page, screen, group and alias through the Analytics client …", flush=True)
        send_every_call(stack)
        wait_for_counts(stack.receiver, Counter(dict.fromkeys(CALL_TYPES, 1)), deadline - time.monotonic())
        say("audience sync: first run …", flush=True)
        run_deployment_and_wait(f"audience-sync/{AUDIENCE_DEPLOYMENT}")
        wait_for_counts(stack.receiver, Counter(identify=1 + len(FIRST_MEMBERS)), deadline - time.monotonic())
        say("audience sync: incremental run …", flush=True)
        write_snapshot(stack.run_dir / "vip-users.csv", SECOND_MEMBERS)
        run_deployment_and_wait(f"audience-sync/{AUDIENCE_DEPLOYMENT}")
        say(f"deletion request for {DELETED_USER!r} …", flush=True)
        run_deployment_and_wait(f"deletions/{DELETIONS_DEPLOYMENT}", {"user_id": DELETED_USER})
        wait_for_counts(stack.receiver, expected_counts(), deadline - time.monotonic())
        say("waiting for the delivery runs to finish and publish their artifacts …", flush=True)
        wait_for_running_deliveries(stack, max(5.0, deadline - time.monotonic()))
        links = ui_links(stack)
    return {"counts": stack.receiver.counts(), "verified": stack.receiver.verified,
            "rejected": stack.receiver.rejected, "links": links}


def ui_links(stack: DemoStack) -> dict[str, str]:
    """Links to this run's flow runs (latest per flow) and artifacts (latest per key) in the Prefect UI."""
    links = {"flow runs": f"{stack.ui_url}/runs", "artifacts": f"{stack.ui_url}/artifacts"}
    flows = {flow["id"]: flow["name"] for flow in api_filter(stack, "flows", {"limit": 50})}
    finished = {"flow_runs": {"state": {"type": {"any_": ["COMPLETED", "FAILED", "CRASHED"]}}}}
    runs = api_filter(stack, "flow_runs", {**finished, "sort": "START_TIME_ASC", "limit": 200})
    for run in runs:
        # Later runs overwrite earlier ones: one line per flow, its latest finished run.
        label = f"latest {flows.get(run['flow_id'], 'flow')} run"
        links[label] = f"{stack.ui_url}/runs/flow-run/{run['id']}"
    artifacts = api_filter(stack, "artifacts", {"sort": "CREATED_DESC", "limit": 200})
    for artifact in reversed(artifacts):
        if artifact.get("key"):
            links[f"artifact {artifact['key']}"] = f"{stack.ui_url}/artifacts/artifact/{artifact['id']}"
    return links


def report(result: dict[str, Any], stack: DemoStack) -> str:
    """The demo's closing summary: counts per type, the signature check, where to look."""
    want = expected_counts()
    counts: Counter[str] = result["counts"]
    total = result["verified"] + result["rejected"]
    table = table_text(
        ("type", "received", "expected"),
        [(kind, counts[kind], want[kind]) for kind in (*CALL_TYPES, "delete")],
        total=("total", sum(counts.values()), sum(want.values())),
        indent=2,
    )
    lines = ["", "what the receiver got:", table]
    lines.append(f"signatures: {result['verified']}/{total} verified")
    lines.append("")
    lines.append(f"Prefect UI (while the demo runs): {stack.ui_url}")
    for label, url in result["links"].items():
        lines.append(f"  {label}: {url}")
    lines.append("Browse this run afterwards:")
    lines.append(
        f"  PREFECT_HOME={stack.run_dir / 'prefect'} PREFECT_API_DATABASE_CONNECTION_URL="
        f"sqlite+aiosqlite:///{stack.run_dir / 'prefect' / 'prefect.db'} prefect server start"
    )
    return "\n".join(lines)


def run_demo(run_dir: Path | None = None, timeout: float = DEFAULT_TIMEOUT, linger: float = 0.0) -> int:
    """Run the main job end to end and print its summary.

    Args:
        run_dir: Folder for this run (store, Prefect database, logs); a new temporary folder by default.
        timeout: Seconds the traffic part may take before the demo gives up.
        linger: Seconds to keep everything up after the summary, to browse the UI (Ctrl-C ends it early).

    Returns:
        0 when every expected message arrived with a valid signature, 1 otherwise.
    """
    started = time.monotonic()
    with demo_stack(run_dir) as stack:
        try:
            result = drive(stack, timeout)
        except Exception as exc:  # noqa: BLE001 - any failure ends the demo with a short message and the logs
            print(f"demo failed: {type(exc).__name__}: {exc}\nlogs: {stack.run_dir}", file=sys.stderr)
            return 1
        print(report(result, stack))
        print(f"finished in {time.monotonic() - started:.0f} s", flush=True)
        if linger > 0:
            print(f"keeping everything up for {linger:.0f} s (Ctrl-C to stop) …", flush=True)
            with suppress(KeyboardInterrupt):
                time.sleep(linger)
        ok = result["rejected"] == 0 and all(result["counts"][k] >= n for k, n in expected_counts().items())
        return 0 if ok else 1
