"""The optional SSRF guard: refuse destinations on loopback, private, link-local or reserved networks.

Off by default (local receivers are the common case while developing); turn it on with
``PREFECT_WEBHOOKS_BLOCK_PRIVATE_NETWORKS=true`` where destination URLs come from people you don't control. The
check runs on the addresses the connection is actually made to (IP literals and what a hostname resolves to at
connection time), so a public name pointing at an internal address (DNS rebinding) is refused too: the transport
(``transport.CurlTransport``) asks ``is_blocked_address`` of each address just before it opens a socket to it.
"""

from __future__ import annotations

import ipaddress


def is_blocked_address(address: str) -> bool:
    """Whether ``address`` (an IP literal) is on a network the guard refuses."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def blocked_reason(host: str, address: str) -> str:
    """Why a request to ``host`` was refused: it is, or resolved to, ``address``, which the guard refuses."""
    return (f"{host} is or resolves to {address}, a private or loopback address "
            "(PREFECT_WEBHOOKS_BLOCK_PRIVATE_NETWORKS is on)")
