"""The private-network guard, checked on the transport's connections: refused before any byte is sent."""

import pytest

from prefect_webhooks.delivery.sending.network import is_blocked_address
from prefect_webhooks.delivery.sending.transport import CurlTransport, TransportError
from tests.receivers import Receiver


@pytest.mark.parametrize(
    ("address", "blocked"),
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),
        ("172.16.0.1", True),
        ("192.168.1.1", True),
        ("169.254.169.254", True),
        ("::1", True),
        ("fe80::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", True),
        ("8.8.8.8", False),
        ("2606:4700::1111", False),
        ("not-an-ip", False),
    ],
)
def test_address_classification(address: str, blocked: bool) -> None:
    assert is_blocked_address(address) is blocked


async def test_guarded_transport_refuses_a_name_resolving_to_loopback_and_sends_nothing(receiver: Receiver) -> None:
    transport = CurlTransport(timeout=5, block_private_networks=True)
    try:
        with pytest.raises(TransportError) as caught:
            await transport.request("POST", receiver.url.replace("127.0.0.1", "localhost"), b"{}", {})
    finally:
        await transport.close()
    assert caught.value.blocked in ("127.0.0.1", "::1")
    assert receiver.requests == []


async def test_guard_off_by_default_reaches_a_local_receiver(receiver: Receiver) -> None:
    transport = CurlTransport(timeout=5)
    try:
        answer = await transport.request("POST", receiver.url, b"{}", {})
    finally:
        await transport.close()
    assert answer.status == 200
    assert len(receiver.requests) == 1


async def test_guard_also_refuses_ip_literals(receiver: Receiver) -> None:
    transport = CurlTransport(timeout=5, block_private_networks=True)
    try:
        with pytest.raises(TransportError) as caught:
            await transport.request("POST", receiver.url, b"{}", {})
    finally:
        await transport.close()
    assert caught.value.blocked == "127.0.0.1"
    assert receiver.requests == []
