"""Every official server-side Segment and RudderStack SDK, end to end: SDK → ingest API → store → receiver.

Each SDK runs unmodified in its own process (``tests/sdks/driver.py`` for the Python SDKs, ``tests/sdks/driver.mjs``
for the Node.js SDKs) and sends the calls of ``tests/sdks/calls.json`` to a real ingest API (uvicorn subprocess).
The messages are then delivered over HTTP to a real receiver, and each body the receiver got is compared field by
field with the body ``calls.json`` says the destination spec requires — whatever each SDK does on the wire (where
it puts identify traits, page category, integrations, timestamps…).

Installing the SDKs (``.ci/run`` does both):

- Node.js SDKs: ``cd tests/sdks && npm ci`` (``package-lock.json`` pins every package; it also lists the
  optional macOS/Windows/ARM builds of ``msgpackr-extract``, a dependency of ``@rudderstack/rudder-sdk-node``, as the
  npm registry has them: ``npm ci`` refuses a lock file without them and never downloads them on Linux x64);
- Segment's legacy ``analytics-python`` (its pinned ``backoff==1.10.0`` cannot share the project's virtualenv with
  ``rudder-sdk-python``): ``python3 -m venv tests/sdks/.venv && tests/sdks/.venv/bin/pip install -r
  tests/sdks/requirements-legacy.txt``.

An SDK that is not installed is skipped locally and fails the run in CI (``CI`` set).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import orjson
import pytest
from prefect.settings import PREFECT_API_URL

from prefect_webhooks.delivery import DeliveryOptions, deliver_due
from prefect_webhooks.signing.signatures import verify
from prefect_webhooks.store.engine.engines import get_engine
from tests.receivers import Receiver
from tests.servers import IngestServer, ingest_api_process, save_destination, save_source

SDK_DIR = Path(__file__).resolve().parents[1] / "sdks"
CALLS = orjson.loads((SDK_DIR / "calls.json").read_bytes())["calls"]
LEGACY_PYTHON = SDK_DIR / ".venv" / "bin" / "python"
SECRET = "sdk-test-secret-1"
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
SERVER_ENV = {"PREFECT_WEBHOOKS_UNKNOWN_KEY_REFRESH_SECONDS": "0"}


@dataclass(frozen=True)
class Sdk:
    """One official SDK: its package name and how its driver is started."""

    package: str
    runtime: str  # "python" (project virtualenv), "legacy-python" (tests/sdks/.venv) or "node"
    module: str = ""

    def command(self, host: str, write_key: str) -> list[str]:
        if self.runtime == "node":
            return ["node", str(SDK_DIR / "driver.mjs"), self.package, host, write_key]
        python = sys.executable if self.runtime == "python" else str(LEGACY_PYTHON)
        return [python, str(SDK_DIR / "driver.py"), self.package, host, write_key]

    def missing(self) -> str | None:
        """Why this SDK cannot run here, or None."""
        if self.runtime == "python":
            return None if importlib.util.find_spec(self.module) else f"{self.package} is not installed"
        if self.runtime == "legacy-python":
            if not LEGACY_PYTHON.exists():
                return f"{LEGACY_PYTHON} does not exist"
            found = subprocess.run([str(LEGACY_PYTHON), "-c", f"import {self.module}"], capture_output=True)
            return None if found.returncode == 0 else f"{self.package} is not installed in {LEGACY_PYTHON}"
        if shutil.which("node") is None:
            return "node is not on PATH"
        if not (SDK_DIR / "node_modules" / self.package / "package.json").exists():
            return f"{self.package} is not in tests/sdks/node_modules"
        return None


SDKS = [
    Sdk("segment-analytics-python", "python", "segment.analytics"),
    Sdk("rudder-sdk-python", "python", "rudderstack.analytics"),
    Sdk("analytics-python", "legacy-python", "analytics"),  # Segment's legacy Python library
    Sdk("@segment/analytics-node", "node"),
    Sdk("analytics-node", "node"),  # Segment's legacy Node.js library
    Sdk("@rudderstack/rudder-sdk-node", "node"),
    Sdk("@rudderstack/analytics-js-service-worker", "node"),  # RudderStack's SDK for serverless runtimes
]


def require(sdk: Sdk) -> None:
    """Skip (locally) or fail (in CI) when the SDK is not installed."""
    reason = sdk.missing()
    if reason is None:
        return
    hint = "install it as .ci/run does (see this module's docstring)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; {hint}")
    pytest.skip(f"{reason}; {hint}")


@dataclass
class Stack:
    server: IngestServer
    store_url: str
    receiver: Receiver


@pytest.fixture(scope="module")
def stack(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    store_url = f"sqlite:///{tmp_path_factory.mktemp('sdks') / 'store.db'}"
    get_engine(store_url)
    with (
        Receiver() as receiver,
        ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(), env=SERVER_ENV) as server,
    ):
        yield Stack(server, store_url, receiver)


def expected_bodies() -> list[dict]:
    return [call["delivered"] for call in CALLS if call["delivered"] is not None]


def sort_key(body: dict) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


@pytest.mark.parametrize("sdk", SDKS, ids=[sdk.package for sdk in SDKS])
def test_sdk_calls_reach_the_receiver_exactly_as_the_destination_spec_says(stack: Stack, sdk: Sdk) -> None:
    require(sdk)
    suffix = uuid.uuid4().hex[:8]
    path = f"/{sdk.package.strip('@').replace('/', '-')}-{suffix}"
    destination, source, write_key = f"sdk-dest-{suffix}", f"sdk-src-{suffix}", f"wk_sdk_{suffix}"
    save_destination(destination, [f"http://127.0.0.1:{stack.receiver.port}{path}"], shared_secret=SECRET)
    save_source(source, write_key, [destination])
    started = time.time()

    sent = subprocess.run(sdk.command(stack.server.url, write_key), capture_output=True, text=True, timeout=120)
    assert sent.returncode == 0, f"{sdk.package} reported an error:\n{sent.stderr[-3000:]}"
    stats = asyncio.run(deliver_due(DeliveryOptions(destination=destination), engine=get_engine(stack.store_url)))
    assert stats.summary()["delivered"] == len(expected_bodies())

    requests = [request for request in stack.receiver.requests if request.path == path]
    received = []
    for request in requests:
        assert request.headers["User-Agent"] == "prefect-webhooks/1.0"
        assert request.headers["Content-Type"] == "application/json"
        assert verify(request.body, request.headers["X-Signature"], SECRET)
        body = orjson.loads(request.body)
        timestamp = body.pop("timestamp")
        assert TIMESTAMP.match(timestamp), timestamp
        # The SDKs stamp the call when it is made; clock correction keeps it within the run.
        assert started - 5 <= datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() <= time.time() + 5
        received.append(body)
    assert sorted(received, key=sort_key) == sorted(expected_bodies(), key=sort_key)
