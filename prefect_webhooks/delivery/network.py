"""The optional SSRF guard: refuse destinations on loopback, private, link-local or reserved networks.

Off by default (local receivers are the common case while developing); turn it on with
``PREFECT_WEBHOOKS_BLOCK_PRIVATE_NETWORKS=true`` where destination URLs come from people you don't control. The
check runs on the addresses the connection is actually made to (IP literals and what a hostname resolves to at
connection time), so a public name pointing at an internal address (DNS rebinding) is refused too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp.abc import ResolveResult


class BlockedAddressError(OSError):
    """A destination resolved to an address the SSRF guard refuses."""


def is_blocked_address(address: str) -> bool:
    """Whether ``address`` (an IP literal) is on a network the guard refuses."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


class GuardedConnector(aiohttp.TCPConnector):
    """A connector that refuses to connect to loopback, private, link-local or reserved addresses."""

    async def _resolve_host(
        self, host: str, port: int, traces: Sequence[Any] | None = None
    ) -> list[ResolveResult]:
        results = await super()._resolve_host(host, port, traces)
        refused = [result["host"] for result in results if is_blocked_address(result["host"])]
        if refused:
            raise BlockedAddressError(
                f"{host} is or resolves to {refused[0]}, a private or loopback address "
                "(PREFECT_WEBHOOKS_BLOCK_PRIVATE_NETWORKS is on)"
            )
        return results


def delivery_connector(block_private_networks: bool, **options: Any) -> aiohttp.TCPConnector:
    """The connector for outbound delivery: guarded when the SSRF setting is on."""
    connector_class = GuardedConnector if block_private_networks else aiohttp.TCPConnector
    return connector_class(**options)
