"""The blocks and the demo's runs as the Prefect UI shows them.

- ``prefect block register -m prefect_webhooks`` registers both block types on a real API (Prefect's
  ``BlockStandardTestSuite`` runs over both in ``tests/blocks/test_blocks.py``);
- after a demo run against a real ``prefect server start`` (``scripts/quickstart --linger``, in
  ``tests/demo/test_demo.py``), headless Chromium renders the artifact and flow-run pages, and the artifact's table
  figures are in the rendered DOM (``check_artifact_pages``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from prefect_webhooks.blocks.destination import WebhookDestination

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=15000",
]


def test_block_register_lists_both_block_types(prefect_harness: None) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    registered = subprocess.run(
        [sys.executable, "-m", "prefect", "block", "register", "-m", "prefect_webhooks"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert registered.returncode == 0, registered.stdout + registered.stderr
    assert "Successfully registered 2 blocks" in registered.stdout, registered.stdout

    with get_client(sync_client=True) as client:
        types = {block_type.slug: block_type for block_type in client.read_block_types()}
        assert types["webhook-destination"].name == "Webhook Destination"
        assert types["webhooks-source"].name == "Webhooks Source"
        schema = client.read_block_schema_by_checksum(
            WebhookDestination._calculate_schema_checksum()
        )
    assert {"endpoints", "shared_secret"} <= set(schema.fields["properties"])


def _text_of(dom: str) -> str:
    """The visible text of a dumped DOM, whitespace collapsed."""
    body = dom[dom.find("<body") :]
    body = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", body, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))


def render(url: str, profile: Path) -> str:
    """Load ``url`` in headless Chromium and return the visible text of the rendered DOM."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is not installed (apt-get install -y chromium; .ci/run installs it)"
    done = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return _text_of(done.stdout)


def check_artifact_pages(ui_url: str, profile: Path) -> None:
    """Headless Chromium renders a demo ``deliver`` run's artifact (every column and figure of its table, and the run
    that made it) and that run's page (the run, its state and its deployment), from the Prefect UI at ``ui_url``."""
    import httpx

    api_url = f"{ui_url}/api"
    # The delivery engine keys its table artifacts ``delivery-…`` (one key per destination endpoint).
    query = {"artifacts": {"key": {"like_": "delivery-"}}, "sort": "CREATED_DESC", "limit": 100}
    answer = httpx.post(f"{api_url}/artifacts/filter", json=query, timeout=30)
    answer.raise_for_status()
    artifacts = [a for a in answer.json() if a["key"].startswith("delivery-")]
    assert artifacts, "the deliver runs left no table artifact"
    # The run that delivered most is the most telling one.
    artifact = max(artifacts, key=lambda a: json.loads(a["data"])[0]["delivered"])
    row = json.loads(artifact["data"])[0]
    assert row["delivered"] > 0
    flow_run = httpx.get(f"{api_url}/flow_runs/{artifact['flow_run_id']}", timeout=30).json()

    page = render(f"{ui_url}/artifacts/artifact/{artifact['id']}", profile)
    assert "Can't connect to Server API" not in page
    assert artifact["key"] in page
    assert row["endpoint"] in page
    # Each column and figure of the artifact's table is in the rendered page.
    for column, value in row.items():
        assert column in page, column
        assert as_displayed(value) in page, (column, value)

    # The artifact page names the flow run that made it; the run's page shows the run and its deployment.
    assert flow_run["name"] in page
    run_page = render(f"{ui_url}/runs/flow-run/{flow_run['id']}", profile)
    assert flow_run["name"] in run_page
    assert "Completed" in run_page
    assert "deliver" in run_page and "continuous" in run_page


def as_displayed(value: object) -> str:
    """How the UI (JavaScript) writes a table value: a whole float without its ".0" (3.0 → "3")."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
