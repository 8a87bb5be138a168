"""``prefect-webhooks deploy --pool NAME``: the served deployments on a work pool from the installed package, with a
first deliver run at once; and what a worker does with them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter
from prefect.settings import PREFECT_API_URL
from prefect.settings.models.server.services import ServerServicesCancellationCleanupSettings

from prefect_webhooks.deployments.serve import AudienceSchedule
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import enqueue
from tests.receivers import Receiver
from tests.servers import background, save_destination
from tests.signing.test_headers import track

# Whether this Prefect's server marks a run left Cancelling as Cancelled after a timeout (3.8.8 does, 3.4.9 not).
CANCELLING_TIMEOUT = "cancelling_timeout_seconds" in ServerServicesCancellationCleanupSettings.model_fields


def deploy_command(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``prefect-webhooks deploy ARGS`` as a user runs it, outside any clone (a working directory of its own)."""
    script = shutil.which("prefect-webhooks", path=str(Path(sys.executable).parent))
    assert script
    audiences = tmp_path / "audiences.yaml"
    audiences.write_text(yaml.safe_dump([AudienceSchedule(name="vip-users", cron="*/15 * * * *").model_dump()]))
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_WEBHOOKS_AUDIENCES_FILE": str(audiences)}
    return subprocess.run([script, "deploy", *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.shares_machine
@pytest.mark.slow
def test_deploy_creates_the_pool_the_deployments_and_a_first_deliver_run(prefect_harness: None,
                                                                        tmp_path: Path) -> None:
    pool = f"webhooks-{uuid.uuid4().hex[:6]}"
    done = deploy_command(tmp_path, "--pool", pool)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"work pool {pool!r} created (type process)" in done.stdout
    assert ("deliver/continuous, deletions/interval, prune/retention, replay/on-demand, audience-sync/vip-users"
            in done.stdout)
    assert f"prefect worker start --pool {pool}" in done.stdout
    with get_client(sync_client=True) as client:
        assert client.read_work_pool(pool).type == "process"
        deployments = {f"{client.read_flow(d.flow_id).name}/{d.name}": d for d in client.read_deployments()
                       if d.work_pool_name == pool}
        assert sorted(deployments) == ["audience-sync/vip-users", "deletions/interval", "deliver/continuous",
                                       "prune/retention", "replay/on-demand"]
        deliver = deployments["deliver/continuous"]
        # A module path: a worker imports the installed package, whatever its working directory.
        assert deliver.entrypoint == "prefect_webhooks.flows.deliver.deliver" and not deliver.pull_steps
        assert [schedule.schedule.interval.total_seconds() for schedule in deliver.schedules] == [60.0]

        def manual_runs() -> dict[str, object]:
            runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deliver.id])),
                                         flow_run_filter=FlowRunFilter())
            return {str(run.id): run for run in runs if not run.auto_scheduled}

        # The one run this deploy started (a deployment is one per server: other tests may have run it before).
        started = [run for run_id, run in manual_runs().items() if run_id in done.stdout]
        assert len(started) == 1 and started[0].state.is_scheduled()
        # Again, without a new run: the pool and deployments are updated in place.
        before = set(manual_runs())
        again = deploy_command(tmp_path, "--pool", pool, "--no-run")
        assert again.returncode == 0 and "created" not in again.stdout and "first deliver run" not in again.stdout
        assert set(manual_runs()) == before


def test_deploy_refuses_a_pool_of_another_type_in_one_line(prefect_harness: None, tmp_path: Path) -> None:
    pool = f"other-{uuid.uuid4().hex[:6]}"
    from prefect.client.schemas.actions import WorkPoolCreate

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="prefect-agent"))
    done = deploy_command(tmp_path, "--pool", pool)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"deploy: work pool {pool!r} is of type 'prefect-agent'" in done.stderr


@pytest.mark.shares_machine
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_worker_delivers_at_once_after_deploy_and_stops_as_documented(prefect_harness: None, tmp_path: Path) -> None:
    pool = f"webhooks-{uuid.uuid4().hex[:6]}"
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    name = f"pool-{uuid.uuid4().hex[:6]}"
    with Receiver() as receiver:
        save_destination(name, [receiver.url])
        enqueue(name, [track(1)], engine=get_engine(store_url))
        env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_WEBHOOKS_DATABASE_URL": store_url}
        started = time.monotonic()
        done = deploy_command(tmp_path, "--pool", pool)
        assert done.returncode == 0, done.stderr
        with background([sys.executable, "-m", "prefect", "worker", "start", "--pool", pool], env=env,
                        cwd=tmp_path, name="worker") as worker:
            while not receiver.requests:
                assert time.monotonic() - started < 180, worker.output()
                time.sleep(0.2)
            first_delivery = time.monotonic() - started
            # Delivered by the run deploy started, not by one the schedule made a minute later.
            run = running_deliver_run(pool)
            assert str(run) in done.stdout
            # Ctrl-C in the worker's terminal (SIGINT to its process group) stops the worker at once, and the run it
            # was executing (still claiming: each claims for 75 s) goes with it: nothing is left behind.
            children = psutil.Process(worker.process.pid).children(recursive=True)
            assert children, "the flow run runs in a process of its own"
            stopping = time.monotonic()
            os.killpg(worker.process.pid, signal.SIGINT)
            worker.process.wait(60)
            stop_seconds = time.monotonic() - stopping
            _, alive = psutil.wait_procs(children, timeout=10)  # before `background` kills what is left
            assert alive == []
    # What the docs say it leaves in Prefect: the run shows Running; cancelled, it shows Cancelling until the server's
    # cancelling timeout marks it Cancelled (300 s by default; the tests' server waits 10 s: tests/conftest.py).
    assert state_name(run) == "Running"
    cancel = subprocess.run([sys.executable, "-m", "prefect", "flow-run", "cancel", str(run)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert state_name(run) == "Cancelling"
    cancelled = time.monotonic()
    while CANCELLING_TIMEOUT and state_name(run) != "Cancelled":
        assert time.monotonic() - cancelled < 120, state_name(run)
        time.sleep(1)
    print(f"first delivery {first_delivery:.1f} s after deploy began; worker stopped in {stop_seconds:.1f} s; "
          f"cancelled run Cancelled {time.monotonic() - cancelled:.1f} s later")


def running_deliver_run(pool: str) -> object:
    with get_client(sync_client=True) as client:
        runs = [run for run in client.read_flow_runs() if run.work_pool_name == pool and run.state.is_running()]
    assert len(runs) == 1, runs
    return runs[0].id


def state_name(flow_run_id: object) -> str:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state.name
