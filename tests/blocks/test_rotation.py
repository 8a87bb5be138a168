"""Zero-downtime secret rotation: a rotation in the middle of a stream of deliveries, the end of the window (the old
secret leaves the saved block), and the ``rotate-secret`` command — real receivers, blocks on the test Prefect
server, delivery through the outbox and the delivery engine."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest
from prefect import get_client
from prefect.settings import PREFECT_API_URL
from pydantic import SecretStr

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.rotation import RotationOutcome, describe_rotation, finish_rotations
from prefect_webhooks.blocks.saved import load_block
from prefect_webhooks.cli import main
from prefect_webhooks.delivery import DeliveryOptions, deliver_due
from prefect_webhooks.flows.deliver import deliver
from prefect_webhooks.messages.outcomes import DELIVERED, FAILED
from prefect_webhooks.settings import get_settings
from prefect_webhooks.signing.signatures import sign, verify
from prefect_webhooks.store.queue.outbox import enqueue
from tests.receivers import Receiver
from tests.signing.test_headers import fast, libraries_accept, track  # noqa: F401  (fast is a fixture)
from tests.stored import every_message

pytestmark = pytest.mark.usefixtures("prefect_harness")


def block_name() -> str:
    return f"rot-{uuid.uuid4().hex[:8]}"


def states(destination: str) -> dict[str, int]:
    return dict(Counter(message.state for message in every_message(destination=destination)))


@pytest.mark.usefixtures("fast")
async def test_a_rotation_in_the_middle_of_a_stream_rejects_nothing() -> None:
    old, new = (WebhookDestination.generate_secret().get_secret_value() for _ in range(2))
    accepted = [old]
    seen_with: list[tuple[float, tuple[str, ...]]] = []

    def keeper_checks(body: bytes, headers: dict[str, str]) -> bool:
        # A receiver that adds the new secret during the window and drops the old one after it: it checks
        # X-Signature with prefect_webhooks.signing.verify and webhook-signature with both published libraries.
        secrets = tuple(accepted)
        seen_with.append((time.time(), secrets))
        return verify(body, headers.get("X-Signature", ""), secrets) and libraries_accept(*secrets)(body, headers)

    def laggard_checks(body: bytes, headers: dict[str, str]) -> bool:
        # A receiver that never learns the new secret.
        return verify(body, headers.get("X-Signature", ""), old) and libraries_accept(old)(body, headers)

    keeping, lagging = block_name(), block_name()
    learned_at: list[float] = []

    def checked_after(moment: float, secrets: tuple[str, ...]) -> int:
        return sum(1 for at, known in list(seen_with) if at > moment and known == secrets)

    def receivers_owner(rotated_at: float, window_end: float, stop: threading.Event) -> None:
        # The receiver's owner adds the new secret during the window and removes the old one after it. It acts on
        # what the receiver has checked, not on a clock alone, so every phase is seen however late a loaded machine
        # delivers: it learns once a request after the rotation was checked with the old secret alone (1 s before
        # the window ends at the latest), and forgets a second after the window once one was checked with both.
        while not stop.wait(0.02):
            if new not in accepted:
                if checked_after(rotated_at, (old,)) or time.time() >= window_end - 1.0:
                    accepted.append(new)
                    learned_at.append(time.time())
            elif time.time() >= window_end + 1.0 and checked_after(learned_at[0], (old, new)):
                accepted.remove(old)
                return

    with Receiver(verifier=keeper_checks) as keeper, Receiver(verifier=laggard_checks) as laggard:
        destination = WebhookDestination(endpoints=[{"url": keeper.url}], shared_secret=old, standard_webhooks=True)
        saving = time.monotonic()
        await destination.save(keeping)
        other = WebhookDestination(endpoints=[{"url": laggard.url}], shared_secret=old, standard_webhooks=True)
        await other.save(lagging)
        # The window counts from the rotation, before its block is saved: it must outlast that save and the reads of
        # the block by delivery, which a loaded Prefect server makes slow. Eight seconds, or longer on a slow server.
        window = max(8.0, 8 * (time.monotonic() - saving))
        stop_delivering = asyncio.Event()

        async def deliver_until_stopped() -> None:
            while not stop_delivering.is_set():
                await deliver_due(DeliveryOptions(run_for_seconds=1, idle_sleep=0.05))

        delivering = asyncio.create_task(deliver_until_stopped())
        rotate_at = time.time() + 1.5
        rotated_at = window_end = 0.0
        sent = 0
        owner_stop = threading.Event()
        # The rotation comes once the stream reaches the receiver. The stream goes on until the receiver has checked
        # a few requests with the new secret alone, and the laggard (rotated second) was sent something after its
        # window.
        while (not window_end or time.time() < window_end + 2.0 or checked_after(rotated_at, (new,)) < 3
               or not laggard.rejected):
            assert not window_end or time.time() < window_end + 60, "no request reached the receiver after the window"
            if not window_end and time.time() >= rotate_at and len(seen_with) >= 3:
                await destination.arotate_secret(new, window=window)
                window_end = destination.previous_secret_expires_at.timestamp()
                rotated_at = time.time()
                owner = threading.Thread(target=receivers_owner, args=(rotated_at, window_end, owner_stop),
                                         daemon=True)
                owner.start()
                await other.arotate_secret(new, window=window)
            await asyncio.to_thread(enqueue, keeping, [track(sent)])
            await asyncio.to_thread(enqueue, lagging, [track(sent)])
            sent += 1
            await asyncio.sleep(0.05)
        stop_delivering.set()
        owner_stop.set()
        await delivering
        await deliver_due()  # what the stream added last, on a busy machine
    learn_at = learned_at[0]
    assert learn_at < window_end, "the receiver must learn the new secret inside the window"
    # Every phase happened: the receiver checked requests knowing only the old secret after the rotation, both
    # secrets, and only the new one after the window.
    phases = {secrets for at, secrets in seen_with if at > rotated_at}
    assert phases == {(old,), (old, new), (new,)}
    assert new in accepted and old not in accepted

    # Nothing was ever refused by the receiver that followed the rotation, and everything arrived.
    assert keeper.rejected == []
    assert states(keeping) == {DELIVERED: sent}
    assert sorted(orjson.loads(r.body)["userId"] for r in keeper.requests) == sorted(f"u{n}" for n in range(sent))
    # X-Signature: the old secret until the window ends, then the new one; webhook-signature: both inside it.
    # (A batch that read the block just before the rotation still signs the old way, with the old secret only.)
    both = 0
    for request in keeper.requests:
        sent_at = int(request.headers["webhook-timestamp"])
        signatures = request.headers["webhook-signature"].split(" ")
        if sent_at < window_end - 1:
            assert request.headers["X-Signature"] == sign(request.body, old)
            both += len(signatures) == 2
        if sent_at > window_end + 1:
            assert request.headers["X-Signature"] == sign(request.body, new)
            assert len(signatures) == 1
    # Several requests of the window carried both signatures (how many depends on the machine's pace: 9 on a
    # loaded CI machine, 10-30 idle).
    assert both >= 3
    # The receiver that knew only the old secret kept working for the whole window, and only then was refused.
    assert laggard.rejected, "requests after the window must be signed with the new secret only"
    # (Its own window ends a little later: its block was rotated just after the other one.)
    laggard_end = other.previous_secret_expires_at.timestamp()
    signed_at = {id(request): int(request.headers["webhook-timestamp"]) for request in laggard.requests}
    assert min(signed_at[id(request)] for request in laggard.rejected) >= int(laggard_end)
    assert all(signed_at[id(request)] <= laggard_end for request in laggard.requests if request not in laggard.rejected)
    assert states(lagging)[FAILED] == len(laggard.rejected)


@pytest.mark.usefixtures("fast")
async def test_the_deliver_flow_removes_the_old_secret_once_the_window_ends() -> None:
    ending, lasting = block_name(), block_name()
    first = WebhookDestination(endpoints=[{"url": "https://hooks.example.com/a"}], shared_secret="old-secret-one-01")
    await first.save(ending)
    second = WebhookDestination(endpoints=[{"url": "https://hooks.example.com/b"}], shared_secret="old-secret-two-01")
    await second.save(lasting)
    await first.arotate_secret("new-secret-one-01", window=1.5)
    await second.arotate_secret("new-secret-two-01", window=3600)
    assert (await load_block(WebhookDestination, ending)).previous_secret is not None
    await asyncio.sleep(max(0.0, first.previous_secret_expires_at.timestamp() - time.time()) + 0.1)
    await deliver()
    ended = await load_block(WebhookDestination, ending)
    assert ended.previous_secret is None and ended.previous_secret_expires_at is None
    assert ended.secret() == "new-secret-one-01"
    async with get_client() as client:
        stored = await client.read_block_document_by_name(ending, "webhook-destination", include_secrets=True)
    assert stored.data["previous_secret"] is None
    assert "old-secret-one-01" not in str(stored.data)
    # A rotation still inside its window is left alone.
    kept = await load_block(WebhookDestination, lasting)
    assert kept.previous_secret.get_secret_value() == "old-secret-two-01" and kept.rotation_active()


def cli_destination(secret: str = "cli-old-secret-01") -> str:
    name = block_name()
    WebhookDestination(endpoints=[{"url": "https://hooks.example.com/in"}], shared_secret=secret).save(name)
    return name


def test_rotate_secret_command_generates_and_prints_the_new_secret_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = cli_destination()
    assert main(["rotate-secret", name, "--generate", "--window", "2h"]) == 0
    out = capsys.readouterr().out
    block = WebhookDestination.load(name)
    new_secret = block.secret()
    assert new_secret.startswith("whsec_") and out.count(new_secret) == 1
    assert "cli-old-secret-01" not in out
    assert "X-Signature is still made with the old secret" in out
    remaining = (block.previous_secret_expires_at - dt.datetime.now(dt.timezone.utc)).total_seconds()
    assert 7190 < remaining <= 7200
    assert block.previous_secret.get_secret_value() == "cli-old-secret-01"


def test_rotate_secret_command_reads_a_given_secret_without_printing_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = cli_destination()
    monkeypatch.setenv("NEW_WEBHOOK_SECRET", "given-new-secret")
    assert main(["rotate-secret", name, "--from-env", "NEW_WEBHOOK_SECRET", "--window", "0"]) == 0
    out = capsys.readouterr().out
    assert "given-new-secret" not in out and "signs every request from now on" in out
    block = WebhookDestination.load(name)
    assert (block.secret(), block.previous_secret) == ("given-new-secret", None)


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--generate"], "is in progress until"),
     (["--from-env", "NO_SUCH_VARIABLE_SET"], "NO_SUCH_VARIABLE_SET is not set or empty")],
)
def test_rotate_secret_command_explains_a_refusal(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    name = cli_destination()
    WebhookDestination.load(name).rotate_secret("second-secret-001", window=600)
    assert main(["rotate-secret", name, *args]) == 1
    captured = capsys.readouterr()
    assert says in captured.err and captured.out == ""
    assert WebhookDestination.load(name).secret() == "second-secret-001"


def test_rotate_secret_command_names_a_missing_block(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rotate-secret", "no-such-destination", "--generate"]) == 1
    assert "no WebhookDestination block named 'no-such-destination'" in capsys.readouterr().err


def test_rotate_secret_command_needs_a_source_for_the_secret(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rotate-secret", "anything"]) == 2
    assert "give exactly one of --generate, --from-env or --from-stdin" in capsys.readouterr().err
    assert main(["rotate-secret", "anything", "--generate", "--from-stdin"]) == 2


def test_rotate_secret_command_reads_the_secret_from_stdin_and_finish_rotations_ends_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = cli_destination()
    monkeypatch.setattr(sys, "stdin", io.StringIO("stdin-new-secret\n"))
    assert main(["rotate-secret", name, "--from-stdin", "--window", "1"]) == 0
    assert "stdin-new-secret" not in capsys.readouterr().out
    block = WebhookDestination.load(name)
    assert (block.secret(), block.previous_secret.get_secret_value()) == ("stdin-new-secret", "cli-old-secret-01")
    time.sleep(max(0.0, block.previous_secret_expires_at.timestamp() - time.time()) + 0.1)
    # The synchronous form of what every deliver run does.
    assert name in finish_rotations()
    assert WebhookDestination.load(name).previous_secret is None
    assert name not in finish_rotations()


def test_the_rotate_secret_command_says_what_this_destination_signs_and_names_its_own_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a user runs it: the installed command, in its own process, against the Prefect server.
    name = cli_destination()
    script = str(Path(sys.executable).parent / "prefect-webhooks")
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    first = subprocess.run([script, "rotate-secret", name, "--generate", "--window", "1h"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    # No Standard Webhooks on this destination: nothing about webhook-signature.
    assert "X-Signature is still made with the old secret" in first.stdout
    assert "webhook-signature" not in first.stdout
    # The refusals, in this process (a command's process start is 10-20 s of the oldest Prefect's import).
    for variable, value in {"SHORT": "abc", "OTHER": "another-new-secret",
                            "PREFECT_WEBHOOKS_MIN_SECRET_LENGTH": "16"}.items():
        monkeypatch.setenv(variable, value)
    get_settings.cache_clear()
    capsys.readouterr()
    assert main(["rotate-secret", name, "--from-env", "OTHER"]) == 1
    refused = capsys.readouterr().err
    assert "add --force to drop the older secret now" in refused and "force=True" not in refused
    assert main(["rotate-secret", name, "--from-env", "SHORT", "--force"]) == 1
    assert "at least 16 characters here (PREFECT_WEBHOOKS_MIN_SECRET_LENGTH), this one 3" in capsys.readouterr().err
    assert main(["rotate-secret", name, "--from-env", "OTHER", "--force"]) == 0
    get_settings.cache_clear()
    assert WebhookDestination.load(name).secret() == "another-new-secret"


@pytest.mark.parametrize(("x_signature", "standard", "says"), [
    (True, False, "X-Signature is still made with the old secret; add"),
    (True, True, "X-Signature is still made with the old secret and webhook-signature carries a signature with each"),
    (False, True, "Until then webhook-signature carries a signature with each secret; add"),
])
def test_the_rotation_message_names_only_the_signatures_sent(x_signature: bool, standard: bool, says: str) -> None:
    outcome = RotationOutcome("crm", SecretStr("n" * 20), generated=False, x_signature=x_signature,
                              standard_webhooks=standard,
                              old_secret_valid_until=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    assert says in describe_rotation(outcome)
