"""``prefect-webhooks serve``: the served deployments, and a SIGTERM with deliveries in flight that loses nothing."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import orjson
import pytest
import yaml
from sqlalchemy import select, update

from prefect_webhooks.deployments.serve import (
    DELETIONS_DEPLOYMENT,
    DELIVER_DEPLOYMENT,
    REPLAY_DEPLOYMENT,
    build_deployments,
    deliver_definition,
    deployment_schedule,
    load_audience_schedules,
    load_definitions,
    served_deployment,
    write_definitions,
)
from prefect_webhooks.messages.outcomes import DELIVERED, PENDING
from prefect_webhooks.serving.processes import dead_local_owners, descendant_pids, process_running, terminate_and_wait
from prefect_webhooks.serving.service import release_dead_local_leases
from prefect_webhooks.settings import ServeSettings, StoreSettings, WebhooksSettings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.figures.metrics import backlog_snapshot
from prefect_webhooks.store.queue.outbox import add_to_outbox, outbox_rows
from prefect_webhooks.store.schema.tables import OutboxMessage, store_now
from tests.receivers import Receiver
from tests.servers import free_port, save_destination, save_source
from tests.stored import every_message

ROOT = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_dead_local_owners_are_only_gone_processes_of_this_host() -> None:
    host = socket.gethostname()[:40]
    alive, dead = f"{host}:{os.getpid()}:aa", f"{host}:{_dead_pid()}:bb"
    elsewhere = f"another-host:{_dead_pid()}:cc"
    assert dead_local_owners([alive, dead, elsewhere, "not-an-owner"]) == [dead]


def test_descendants_are_found_and_terminated() -> None:
    # A parent that starts a grandchild (sleep) and waits: both are descendants of the parent.
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '60'])"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while len(descendant_pids(parent.pid)) < 1:
            assert time.monotonic() < deadline, "the grandchild never started"
            time.sleep(0.05)
        [grandchild] = descendant_pids(parent.pid)
        assert descendant_pids(os.getpid()).count(parent.pid) == 1 and grandchild in descendant_pids(os.getpid())
        terminate_and_wait([grandchild], timeout=10)
        # The grandchild got SIGTERM and is gone; its parent (not signalled) then exits on its own.
        assert parent.wait(10) == 0
        assert descendant_pids(parent.pid) == []
    finally:
        with suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(10)


def test_release_dead_local_leases(store_url: str) -> None:
    host = socket.gethostname()[:40]
    alive, dead = f"{host}:{os.getpid()}:aa", f"{host}:{_dead_pid()}:bb"
    table = OutboxMessage.__table__
    until = store_now() + timedelta(minutes=5)
    with get_engine().begin() as connection:
        rows = outbox_rows("d", [{"type": "track", "userId": f"u{i}", "event": "E"} for i in range(3)])
        add_to_outbox(connection, rows)
        for row_id, owner in zip((1, 2, 3), (alive, dead, dead), strict=True):
            connection.execute(
                update(table).where(table.c.id == row_id).values(lease_owner=owner, lease_expires_at=until)
            )
        connection.execute(update(table).where(table.c.id == 3).values(state=DELIVERED))

    assert release_dead_local_leases() == 1
    with get_engine().connect() as connection:
        owners = dict(connection.execute(select(table.c.id, table.c.lease_owner)).all())
    # The live process keeps its lease; a finished row is left alone.
    assert owners == {1: alive, 2: None, 3: dead}


def test_audience_file_entries(tmp_path: Path) -> None:
    path = tmp_path / "audiences.yaml"
    assert load_audience_schedules(path) == []
    path.write_text(
        yaml.safe_dump(
            [
                {"name": "vip", "cron": "*/15 * * * *", "parameters": {"definition": {"name": "VIP"}}},
                {"name": "churn-risk"},
            ]
        )
    )
    vip, churn = load_audience_schedules(path)
    assert (vip.name, vip.cron, vip.parameters) == ("vip", "*/15 * * * *", {"definition": {"name": "VIP"}})
    assert (churn.name, churn.cron) == ("churn-risk", None)
    path.write_text("name: not-a-list\n")
    with pytest.raises(ValueError, match="YAML list"):
        load_audience_schedules(path)


def test_served_deployments_and_schedules(tmp_path: Path) -> None:
    audiences = tmp_path / "audiences.yaml"
    audiences.write_text(yaml.safe_dump([{"name": "vip", "cron": "0 * * * *", "parameters": {"definition": {}}}]))
    settings = WebhooksSettings(store=StoreSettings(home=tmp_path), serve=ServeSettings(audiences_file=str(audiences)))
    deployments = {(d.flow_name, d.name): d for d in build_deployments(settings)}

    assert set(deployments) == {
        ("deliver", DELIVER_DEPLOYMENT),
        ("deletions", DELETIONS_DEPLOYMENT),
        ("prune", "retention"),
        ("replay", REPLAY_DEPLOYMENT),
        ("audience-sync", "vip"),
    }
    deliver = deployments[("deliver", DELIVER_DEPLOYMENT)]
    # Each run overlaps the next by 15 s, so delivery does not pause while the next run's process starts.
    assert deliver.parameters == {"run_for_seconds": 75}
    assert deliver.schedules[0].schedule.interval.total_seconds() == 60
    assert deliver.entrypoint == "prefect_webhooks.flows.deliver.deliver"
    assert deployments[("deletions", DELETIONS_DEPLOYMENT)].schedules[0].schedule.interval.total_seconds() == 60
    assert deployments[("replay", REPLAY_DEPLOYMENT)].schedules in (None, [])
    assert deployments[("audience-sync", "vip")].schedules[0].schedule.cron == "0 * * * *"
    # ``serve`` leaves deliver/continuous to its delivery workers, which register it from the same definition.
    assert ("deliver", DELIVER_DEPLOYMENT) not in {(d.flow_name, d.name) for d in build_deployments(settings,
                                                                                                 deliver=False)}
    # ... and the retention passes to its pruner, every PREFECT_WEBHOOKS_RETENTION_INTERVAL.
    assert ("prune", "retention") not in {(d.flow_name, d.name) for d in build_deployments(settings, prune=False)}
    for_workers = served_deployment(deliver_definition(settings))
    assert for_workers.parameters == deliver.parameters
    assert for_workers.schedules[0].schedule.interval == deliver.schedules[0].schedule.interval


def test_an_edited_deployments_file_changes_what_is_served(tmp_path: Path) -> None:
    edited = write_definitions(
        tmp_path / "prefect.yaml",
        {DELIVER_DEPLOYMENT: {"schedules": [{"interval": 30}], "parameters": {"run_for_seconds": 25}}},
    )
    settings = WebhooksSettings(store=StoreSettings(home=tmp_path), serve=ServeSettings(deployments_file=str(edited)))
    deployments = {d.name: d for d in build_deployments(settings)}
    assert deployments[DELIVER_DEPLOYMENT].parameters == {"run_for_seconds": 25}
    assert deployments[DELIVER_DEPLOYMENT].schedules[0].schedule.interval.total_seconds() == 30
    # The rest of the copy is the shipped definition.
    assert deployments[DELETIONS_DEPLOYMENT].schedules[0].schedule.interval.total_seconds() == 60
    with pytest.raises(KeyError, match="no-such-deployment"):
        write_definitions(tmp_path / "other.yaml", {"no-such-deployment": {}})


def test_serve_refuses_what_it_would_not_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [deliver, *_] = load_definitions()
    with pytest.raises(ValueError, match="keys not supported by serve: concurrency_limit"):
        served_deployment({**deliver, "concurrency_limit": 1})
    with pytest.raises(ValueError, match="schedule keys not supported by serve: slug"):
        deployment_schedule({"interval": 60, "slug": "every-minute"})
    with pytest.raises(ValueError, match="needs interval, cron or rrule"):
        deployment_schedule({"timezone": "UTC"})
    # The settings that once set the served schedules are refused rather than ignored.
    monkeypatch.setenv("PREFECT_WEBHOOKS_DELIVER_RUN_SECONDS", "15")
    with pytest.raises(ValueError, match="PREFECT_WEBHOOKS_DEPLOYMENTS_FILE"):
        build_deployments(WebhooksSettings(store=StoreSettings(home=tmp_path)))


@contextmanager
def running_service(env: dict[str, str], port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``prefect-webhooks serve`` (``python -m prefect_webhooks.cli``) in its own process group, killed at the end."""
    with log.open("ab") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "prefect_webhooks.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--grace", "20"],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health/backlog", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "service not ready"
            time.sleep(0.2)
        yield process
    finally:
        # A clean stop first, so the API and the runner (each in its own session) stop with the service.
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                process.wait(60)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _outbox_counts() -> dict[str, int]:
    return dict(Counter(message.state for message in every_message()))


def _running_deliver_runs() -> list[UUID]:
    """The ids of the deliver runs running now."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["deliver"])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                any_=[StateType.RUNNING, StateType.PENDING]))))
    return [run.id for run in runs]


def _flow_run_state(flow_run_id: UUID) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state.type.value


@pytest.mark.shares_machine
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_sigterm_with_deliveries_in_flight_loses_nothing(
    prefect_harness: None, store_url: str, tmp_path: Path
) -> None:
    from prefect.settings import PREFECT_API_URL

    count = 30
    port = free_port()
    # Every request takes 4 s to answer: the batch is in flight when SIGTERM arrives.
    with Receiver(default={"status": 200, "delay": 4.0}) as receiver:
        save_destination("svc-dest", [receiver.url])
        save_source("svc-source", "wk_service_test", ["svc-dest"])
        workdir = tmp_path / "service"
        workdir.mkdir()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
            "PREFECT_API_URL": PREFECT_API_URL.value(),
            "PREFECT_RUNNER_POLL_FREQUENCY": "1",
            "PREFECT_WEBHOOKS_DATABASE_URL": store_url,
            "PREFECT_WEBHOOKS_HOME": str(workdir),
            # Long leases: rows must come back because the service released them, not because a lease expired.
            "PREFECT_WEBHOOKS_LEASE_SECONDS": "300",
            "PREFECT_WEBHOOKS_TASK_RETRIES": "0",
            "PYTHONPATH": str(ROOT),
        }
        log = workdir / "service.log"
        with running_service(env, port, log) as service:
            batch = {
                "batch": [
                    {"type": "track", "userId": f"u{i}", "event": "Shutdown Test", "messageId": f"m-{i}"}
                    for i in range(count)
                ]
            }
            auth = base64.b64encode(b"wk_service_test:").decode()
            answer = httpx.post(
                f"http://127.0.0.1:{port}/v1/batch", json=batch, headers={"Authorization": f"Basic {auth}"}
            )
            assert answer.status_code == 200, answer.text
            # The delivery worker's run claims them at once; their requests hang for 4 s.
            receiver.wait_for(1, timeout=120)
            interrupted_runs = _running_deliver_runs()
            assert interrupted_runs
            service.send_signal(signal.SIGTERM)
            assert service.wait(60) == 0, log.read_text()[-3000:]
            # Nothing of the service is left: not the API, not the worker, not the runner, not a flow-run process.
            time.sleep(1)
            assert not _group_alive(service.pid), log.read_text()[-3000:]
            # The stopped runs finished the batch in flight and completed, instead of staying "Running".
            assert {_flow_run_state(run) for run in interrupted_runs} == {"COMPLETED"}, log.read_text()[-3000:]
        interrupted = _outbox_counts()
        # Stopped mid-batch: every row is delivered (its outcome was recorded) or pending again; none is lost,
        # failed, or still held by the stopped run's lease.
        assert set(interrupted) <= {PENDING, DELIVERED} and sum(interrupted.values()) == count, interrupted
        assert backlog_snapshot()["totals"]["in_flight"] == 0
        assert "interrupted deliveries returned to pending" in log.read_text() or PENDING not in interrupted

        receiver.default = 200
        with running_service(env, port, log):
            deadline = time.monotonic() + 120
            while _outbox_counts() != {DELIVERED: count}:
                assert time.monotonic() < deadline, (_outbox_counts(), log.read_text()[-3000:])
                time.sleep(0.5)
        users = {orjson.loads(request.body)["userId"] for request in receiver.requests}
        assert users == {f"u{i}" for i in range(count)}


@pytest.mark.shares_machine
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_a_killed_service_takes_its_parts_down(prefect_harness: None, store_url: str, tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PREFECT_WEBHOOKS_DATABASE_URL": store_url,
        "PREFECT_WEBHOOKS_HOME": str(tmp_path),
        "PREFECT_WEBHOOKS_DEPLOYMENTS_FILE": str(
            write_definitions(tmp_path / "prefect.yaml", {DELIVER_DEPLOYMENT: {"schedules": []}})
        ),
        "PYTHONPATH": str(ROOT),
    }
    log = tmp_path / "service.log"
    with running_service(env, port, log) as service:
        deadline = time.monotonic() + 60
        while len(parts := descendant_pids(service.pid)) < 2:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        # SIGKILL: the supervisor gets no chance to stop its parts; the kernel's parent-death signal must.
        service.kill()
        service.wait(10)
        deadline = time.monotonic() + 60
        while alive := [pid for pid in parts if process_running(pid)]:
            assert time.monotonic() < deadline, f"still running after the service was killed: {alive}"
            time.sleep(0.2)
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)



def test_endpoint_disable_and_enable_reach_a_running_serve_at_once(
    prefect_harness: None, store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``serve`` keeps each block for PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS (10 s by default, left so here): the
    commands (run in this process, on the same store and Prefect server) must not wait for that."""
    from prefect.settings import PREFECT_API_URL

    from prefect_webhooks.cli import main

    port = free_port()
    auth = base64.b64encode(b"wk_toggle_test:").decode()

    def send(first: int) -> None:
        batch = {"batch": [{"type": "track", "userId": f"u{i}", "event": "Toggle", "messageId": f"t-{i}"}
                           for i in range(first, first + 10)]}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/batch", json=batch,
                            headers={"Authorization": f"Basic {auth}"}, timeout=30)
        assert answer.status_code == 200, answer.text

    def wait_for(check: Any, what: str, seconds: float = 8.0) -> None:
        deadline = time.monotonic() + seconds
        while not check():
            assert time.monotonic() < deadline, f"{what}: {_outbox_counts()}"
            time.sleep(0.1)

    with Receiver() as receiver:
        save_destination("svc-toggle", [receiver.url])
        save_source("svc-toggle-source", "wk_toggle_test", ["svc-toggle"])
        workdir = tmp_path / "service"
        workdir.mkdir()
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
               "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_WEBHOOKS_DATABASE_URL": store_url,
               "PREFECT_WEBHOOKS_HOME": str(workdir), "PYTHONPATH": str(ROOT)}
        env.pop("PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS", None)

        def command(*args: str) -> str:
            capsys.readouterr()
            assert main(["endpoint", *args]) == 0, capsys.readouterr().err
            return capsys.readouterr().out

        with running_service(env, port, workdir / "service.log"):
            send(0)
            wait_for(lambda: len(receiver.requests) == 10, "the first 10 delivered", 60)
            assert "disabled endpoint(s) [1]" in command("disable", "svc-toggle", "--position", "1")
            time.sleep(1.5)  # the serve's copy of the block is a few seconds old: 10 s would keep it
            send(10)
            wait_for(lambda: _outbox_counts().get("failed") == 10, "the next 10 failed as disabled")
            assert len(receiver.requests) == 10
            assert "10 message(s) pending again" in command("enable", "svc-toggle", "--replay")
            wait_for(lambda: _outbox_counts() == {DELIVERED: 20}, "the replayed 10 delivered")
    assert sorted(orjson.loads(request.body)["userId"] for request in receiver.requests) == sorted(
        f"u{i}" for i in range(20))
