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

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx

from prefect_webhooks.demo.receiver import SigningReceiver
from prefect_webhooks.demo.stack import (
    AUDIENCE_DEPLOYMENT,
    FIRST_MEMBERS,
    DemoStack,
    demo_stack,
    prefect_settings,
    write_snapshot,
)
from prefect_webhooks.utilities.tables import table_text

SECOND_MEMBERS = ("ada", "linus", "margaret")
DELETED_USER = "linus"
CALL_TYPES = ("identify", "track", "page", "screen", "group", "alias")


def expected_counts() -> Counter[str]:
    """What the receiver must get: one per call type, the audience identifies (3 first, 2 changes) and 1 delete."""
    first = len(FIRST_MEMBERS)
    changes = len(set(FIRST_MEMBERS) ^ set(SECOND_MEMBERS))
    counts = Counter(dict.fromkeys(CALL_TYPES, 1))
    counts["identify"] += first + changes
    counts["delete"] = 1
    return counts


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


LINGER_HINT = "scripts/quickstart --linger 600 keeps it up for ten minutes after the summary"


def drive(stack: DemoStack, timeout: float, echo: bool = True, *, linger: float = 0.0) -> dict[str, Any]:
    """Send the traffic of a demo run through a started stack and wait for the receiver to have all of it."""
    from prefect_webhooks.deployments.serve import DELETIONS_DEPLOYMENT, DELIVER_DEPLOYMENT

    say = print if echo else (lambda *_args, **_kw: None)
    # Said while the UI is up: the summary comes when the demo is about to stop it.
    after = f"and for {linger:.0f} s after the summary" if linger > 0 else f"and stops with it ({LINGER_HINT})"
    say(f"Prefect UI, up while the demo runs {after}: {stack.ui_url}", flush=True)
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


def report(result: dict[str, Any], stack: DemoStack, *, linger: float = 0.0) -> str:
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
    if linger <= 0:
        lines.append(f"  the demo stops it now; {LINGER_HINT}")
    for label, url in result["links"].items():
        lines.append(f"  {label}: {url}")
    lines.append("Browse this run afterwards:")
    lines.append(
        f"  PREFECT_HOME={stack.run_dir / 'prefect'} PREFECT_API_DATABASE_CONNECTION_URL="
        f"sqlite+aiosqlite:///{stack.run_dir / 'prefect' / 'prefect.db'} prefect server start"
    )
    return "\n".join(lines)


def run_demo(run_dir: Path | None, *, timeout: float, linger: float = 0.0) -> int:
    """Run the main job end to end and print its summary.

    Args:
        run_dir: Folder for this run (store, Prefect database, logs); a new temporary folder by default.
        timeout: Seconds the traffic part may take before the demo gives up.
        linger: Seconds to keep everything up after the summary, to browse the UI (Ctrl-C ends it early).

    Returns:
        0 when every expected message arrived with a valid signature, 1 otherwise.
    """
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C ends the demo even when it was started with SIGINT ignored (a script's background job inherits
        # that, and Python then raises no KeyboardInterrupt): the lingering would otherwise run its whole time.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    with demo_stack(run_dir) as stack:
        try:
            result = drive(stack, timeout, linger=linger)
        except Exception as exc:  # noqa: BLE001 - any failure ends the demo with a short message and the logs
            print(f"demo failed: {type(exc).__name__}: {exc}\nlogs: {stack.run_dir}", file=sys.stderr)
            return 1
        print(report(result, stack, linger=linger))
        print(f"finished in {time.monotonic() - started:.0f} s", flush=True)
        if linger > 0:
            print(f"keeping everything up for {linger:.0f} s (Ctrl-C to stop) …", flush=True)
            with suppress(KeyboardInterrupt):
                time.sleep(linger)
        ok = result["rejected"] == 0 and all(result["counts"][k] >= n for k, n in expected_counts().items())
        return 0 if ok else 1
