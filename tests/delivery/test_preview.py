"""``prefect-webhooks preview``: the exact requests a saved destination would make, secrets masked, nothing sent."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.cli import main
from prefect_webhooks.messages.payloads import serialize

pytestmark = pytest.mark.usefixtures("prefect_harness")

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MESSAGE = {"version": 1, "type": "track", "userId": "u1", "timestamp": "2026-01-01T00:00:00.000Z",
           "event": "Order Completed", "properties": {"revenue": 19.5}}


def parse(printed: str) -> list[tuple[str, dict[str, str], bytes]]:
    """Each previewed request: its first line, its headers and its body, as a reader would take them."""
    requests = []
    parts = printed.strip().split("\n\n")  # head, body, head, body…: a JSON body holds no blank line
    for head, body in zip(parts[::2], parts[1::2], strict=True):
        first, *lines = [line for line in head.splitlines() if not line.startswith("  note:")]
        requests.append((first, dict(line.split(": ", 1) for line in lines), body.encode()))
    return requests


def test_preview_shows_the_exact_body_headers_and_signatures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"preview-{uuid.uuid4().hex[:8]}"
    WebhookDestination(endpoints=[
        {"url": "https://hooks.example.com/in?token=abc", "headers": {"X-Api-Key": "k3y-value"}},
        {"url": "https://crm.example.com/contacts", "method": "PUT", "mapping": {"id": {"@path": "$.userId"}},
         "auth": {"type": "bearer", "token": "bearer-value"}},
    ], shared_secret=SECRET, standard_webhooks=True).save(name)
    (tmp_path / "message.json").write_text(json.dumps(MESSAGE))
    assert main(["preview", name, "--message", str(tmp_path / "message.json")]) == 0
    printed = capsys.readouterr().out
    assert "k3y-value" not in printed and "bearer-value" not in printed and "token=abc" not in printed
    (plain_line, plain, plain_body), (put_line, put, put_body) = parse(printed)
    assert plain_line.startswith("POST https://hooks.example.com/in?******** ")
    assert put_line.startswith("PUT https://crm.example.com/contacts ")
    assert plain_body == serialize(MESSAGE) and put_body == b'{"id":"u1"}'
    for headers, body in ((plain, plain_body), (put, put_body)):
        assert headers["X-Signature"] == hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest()
        Webhook(SECRET).verify(body, headers)  # the Standard Webhooks signature a receiver would check
    assert plain["X-Api-Key"] == "********" and put["Authorization"] == "Bearer ********"


def test_preview_of_a_batching_destination_shows_the_arrays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = f"preview-{uuid.uuid4().hex[:8]}"
    WebhookDestination(endpoints=[{"url": "https://hooks.example.com/in"}], shared_secret="s3cret-s3cret-01",
                       batch_size=2).save(name)
    (tmp_path / "messages.json").write_text(json.dumps([MESSAGE] * 3))
    assert main(["preview", name, "--message", str(tmp_path / "messages.json")]) == 0
    requests = parse(capsys.readouterr().out)
    assert [len(json.loads(body)) for _, _, body in requests] == [2, 1]
    assert json.loads(requests[1][2]) == [{"id": "msg_preview_3", "message": MESSAGE}]
    assert requests[0][1]["Idempotency-Key"].startswith("batch_preview_")


def test_preview_errors_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.json").write_text(json.dumps([MESSAGE, {"event": "no type"}]))
    assert main(["preview", "any", "--message", str(tmp_path / "bad.json")]) == 1
    assert "item 1 is not an outbound message" in capsys.readouterr().err
    (tmp_path / "ok.json").write_text(json.dumps(MESSAGE))
    assert main(["preview", f"missing-{uuid.uuid4().hex[:8]}", "--message", str(tmp_path / "ok.json")]) == 1
    assert "no WebhookDestination block named 'missing-" in capsys.readouterr().err


def test_a_disabled_endpoint_is_previewed_and_a_bound_message_shows_its_one_endpoint() -> None:
    from prefect_webhooks.delivery.endpoints.preview import preview_requests, stored_message_requests
    from prefect_webhooks.store.endpoints.states import url_key

    block = WebhookDestination(
        endpoints=[{"url": "https://one.example.com/in"}, {"url": "https://two.example.com/in"}], each_endpoint=True,
        disabled_endpoints=[{"position": 1, "reason": "maintenance", "disabled_at": "2026-11-27T00:00:00Z"}])
    # Both endpoints, in the block's order, the disabled one included: enabled again, it gets these.
    assert [(shown.endpoint, shown.url) for shown in preview_requests(block, [MESSAGE])] == [
        (1, "https://one.example.com/in"), (2, "https://two.example.com/in")]
    # A fan-out message bound to endpoint 2 makes one request, to it; one bound to a removed endpoint makes none.
    body = serialize(MESSAGE)
    (shown,) = stored_message_requests(block, body, 7, "a1b2c3d4e5f6", url_key("https://two.example.com/in"))
    assert shown.startswith("POST https://two.example.com/in  (endpoint 2)")
    assert "msg_a1b2c3d4e5f6_7" in shown
    assert stored_message_requests(block, body, 7, "a1b2c3d4e5f6", "0" * 32) == [
        "(the endpoint this message was bound to is no longer in its destination block: no request is made)"]
