"""``deployments/prefect.yaml`` deploys on a real Prefect API to a `process` work pool."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _prefect(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_prefect_deploy_all_creates_every_deployment(prefect_harness: None) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    pool = _prefect("work-pool", "create", "webhooks-pool", "--type", "process", "--overwrite", env=env)
    assert pool.returncode == 0, pool.stdout + pool.stderr
    deployed = _prefect("deploy", "--all", "--prefect-file", "deployments/prefect.yaml", env=env)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr

    with get_client(sync_client=True) as client:
        deliver = client.read_deployment_by_name("deliver/continuous")
        replay = client.read_deployment_by_name("replay/on-demand")
        deletions = client.read_deployment_by_name("deletions/interval")
        audience = client.read_deployment_by_name("audience-sync/vip-users")
    assert deliver.work_pool_name == "webhooks-pool"
    # Each run overlaps the next one's start by 15 s: delivery does not pause while a new process starts.
    assert deliver.parameters == {"run_for_seconds": 75}
    assert deliver.schedules[0].schedule.interval.total_seconds() == 60
    assert deletions.schedules[0].schedule.interval.total_seconds() == 60
    assert replay.schedules == []
    assert audience.schedules[0].schedule.cron == "*/15 * * * *"
    assert audience.parameters["definition"]["name"] == "VIP Users"
