"""``deployments/prefect.yaml`` is the one definition: ``prefect deploy`` and ``serve`` make the same deployments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefect_webhooks.deployments.serve import (
    DEFINITION_FILE,
    AudienceSchedule,
    audience_entry,
    build_deployments,
)
from prefect_webhooks.settings import ServeSettings, StoreSettings, WebhooksSettings

ROOT = Path(__file__).resolve().parents[2]
POOL = "webhooks-pool"


def _prefect(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _schedule_fields(schedule: Any) -> dict[str, Any]:
    inner = schedule.schedule
    return {
        "active": schedule.active,
        "type": type(inner).__name__,
        "interval": inner.interval.total_seconds() if hasattr(inner, "interval") else None,
        "cron": getattr(inner, "cron", None),
        "rrule": getattr(inner, "rrule", None),
        "timezone": getattr(inner, "timezone", None),
    }


def _deployments_on_server() -> dict[tuple[str, str], dict[str, Any]]:
    """Every deployment on the API, by (flow name, deployment name), as the fields a definition sets."""
    from prefect.client.orchestration import get_client

    found = {}
    with get_client(sync_client=True) as client:
        flows = {flow.id: flow.name for flow in client.read_flows()}
        for deployment in client.read_deployments():
            found[(flows[deployment.flow_id], deployment.name)] = {
                "entrypoint": deployment.entrypoint,
                "description": deployment.description,
                "tags": sorted(deployment.tags),
                "parameters": deployment.parameters,
                "parameter_openapi_schema": deployment.parameter_openapi_schema,
                "enforce_parameter_schema": deployment.enforce_parameter_schema,
                "paused": deployment.paused,
                "version": deployment.version,
                "schedules": sorted(
                    (_schedule_fields(schedule) for schedule in deployment.schedules), key=lambda s: repr(s)
                ),
            }
    return found


@pytest.mark.shares_machine
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_prefect_deploy_and_serve_make_the_same_deployments(prefect_harness: None, tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    audience = AudienceSchedule(
        name="vip-users",
        cron="*/15 * * * *",
        parameters={"definition": {"name": "VIP Users", "sources": ["web-app"], "snapshot": {"kind": "csv",
                                                                                             "path": "/x.csv"}}},
    )
    audiences_file = tmp_path / "audiences.yaml"
    audiences_file.write_text(yaml.safe_dump([audience.model_dump()]))
    # For a work pool, an audience sync is one more entry of prefect.yaml (as the file's comment shows); serve builds
    # its deployment from the same entry.
    document = yaml.safe_load(DEFINITION_FILE.read_text())
    document["deployments"].append({**audience_entry(audience), "work_pool": {"name": POOL}})
    prefect_file = tmp_path / "prefect.yaml"
    prefect_file.write_text(yaml.safe_dump(document, sort_keys=False))

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    pool = _prefect("work-pool", "create", POOL, "--type", "process", "--overwrite", env=env)
    assert pool.returncode == 0, pool.stdout + pool.stderr
    deployed_run = _prefect("deploy", "--all", "--prefect-file", str(prefect_file), env=env)
    assert deployed_run.returncode == 0, deployed_run.stdout + deployed_run.stderr
    deployed = _deployments_on_server()

    settings = WebhooksSettings(
        store=StoreSettings(home=tmp_path), serve=ServeSettings(audiences_file=str(audiences_file))
    )
    served = build_deployments(settings)
    for deployment in served:
        deployment.apply()
    applied = _deployments_on_server()

    names = {(d.flow_name, d.name) for d in served}
    assert names == {
        ("deliver", "continuous"),
        ("deletions", "interval"),
        ("prune", "retention"),
        ("replay", "on-demand"),
        ("audience-sync", "vip-users"),
    }
    for name in sorted(names):
        assert applied[name] == deployed[name], name
    # The comparison is about the shipped values, not two empty definitions.
    deliver = deployed[("deliver", "continuous")]
    assert deliver["entrypoint"] == "prefect_webhooks.flows.deliver.deliver"
    # Each run overlaps the next one's start by 15 s: delivery does not pause while a new process starts.
    assert deliver["parameters"] == {"run_for_seconds": 75}
    assert [s["interval"] for s in deliver["schedules"]] == [60.0]
    assert [s["interval"] for s in deployed[("deletions", "interval")]["schedules"]] == [60.0]
    assert [s["interval"] for s in deployed[("prune", "retention")]["schedules"]] == [300.0]
    assert deployed[("replay", "on-demand")]["schedules"] == []
    assert [s["cron"] for s in deployed[("audience-sync", "vip-users")]["schedules"]] == ["*/15 * * * *"]
