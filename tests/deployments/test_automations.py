"""The README's automation: the YAML in deployments/automations is accepted by ``prefect automation create``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from prefect_webhooks.delivery.endpoints.events import DELIVERY_FAILED

ROOT = Path(__file__).resolve().parents[2]
AUTOMATION = ROOT / "deployments" / "automations" / "delivery-failed.yaml"


def test_automation_triggers_on_the_delivery_failed_event() -> None:
    document = yaml.safe_load(AUTOMATION.read_text())
    assert document["trigger"]["expect"] == [DELIVERY_FAILED]
    assert document["trigger"]["posture"] == "Reactive"
    assert document["actions"][0]["type"] == "send-notification"


def test_prefect_automation_create_accepts_it(prefect_harness: None, tmp_path: Path) -> None:
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    block_id = CustomWebhookNotificationBlock(
        name="ops", url="http://127.0.0.1:9/notify", json_data={"text": "{{body}}"}
    ).save("ops-alerts", overwrite=True)
    document = yaml.safe_load(AUTOMATION.read_text())
    document["actions"][0]["block_document_id"] = str(block_id)
    path = tmp_path / "automation.yaml"
    path.write_text(yaml.safe_dump(document))

    created = subprocess.run(
        [sys.executable, "-m", "prefect", "automation", "create", "--from-file", str(path)],
        env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert created.returncode == 0, created.stdout + created.stderr

    with get_client(sync_client=True) as client:
        (automation,) = client.read_automations_by_name(document["name"])
    assert automation.trigger.expect == {DELIVERY_FAILED}
    assert str(automation.actions[0].block_document_id) == str(block_id)
