"""What a demo run starts and stops: a local Prefect server, the signing receiver, ``prefect-webhooks serve``, each
child in its own process group, and the blocks, snapshot and deployment files they read."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from prefect_webhooks.demo.receiver import SigningReceiver

DESTINATION_BLOCK = "demo-receiver"
SOURCE_BLOCK = "demo-app"
AUDIENCE_DEPLOYMENT = "demo-vip-users"
AUDIENCE_NAME = "VIP Users"
FIRST_MEMBERS = ("ada", "grace", "linus")
SERVER_START_TIMEOUT = 120.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
        # The demo waits for its deliver runs to end and show their artifacts: a run that found nothing to deliver
        # hands over after the interval too, instead of going on while the demo is quiet.
        "PREFECT_WEBHOOKS_QUIET_RUN_SECONDS": "10",
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
    from prefect_webhooks.store.engine.engines import dispose_engines

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
    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.blocks.source import Source

    WebhookDestination.register_type_and_schema()
    Source.register_type_and_schema()
    WebhookDestination(endpoints=[{"url": stack.receiver.url}], shared_secret=stack.secret).save(
        DESTINATION_BLOCK, overwrite=True
    )
    Source(write_key=stack.write_key, destinations=[DESTINATION_BLOCK]).save(SOURCE_BLOCK, overwrite=True)
