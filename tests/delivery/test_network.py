import aiohttp
import pytest

from prefect_webhooks.delivery.network import BlockedAddressError, delivery_connector, is_blocked_address
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


async def test_guarded_session_refuses_loopback_and_sends_nothing(receiver: Receiver) -> None:
    async with aiohttp.ClientSession(connector=delivery_connector(True)) as session:
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            await session.post(receiver.url.replace("127.0.0.1", "localhost"), data=b"{}")
    assert isinstance(caught.value.os_error, BlockedAddressError)
    assert receiver.requests == []


async def test_guard_off_by_default_reaches_a_local_receiver(receiver: Receiver) -> None:
    async with (
        aiohttp.ClientSession(connector=delivery_connector(False)) as session,
        session.post(receiver.url, data=b"{}") as response,
    ):
        assert response.status == 200
    assert len(receiver.requests) == 1


async def test_guard_also_refuses_ip_literals(receiver: Receiver) -> None:
    async with aiohttp.ClientSession(connector=delivery_connector(True)) as session:
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            await session.post(receiver.url, data=b"{}")
    assert "private or loopback" in str(caught.value.os_error)
    assert receiver.requests == []
