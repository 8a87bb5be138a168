"""What one request to one endpoint carries: its method, its body (the message, or what the endpoint's mapping
makes of it) and its headers (static, bearer token, signatures, the message or batch id).

The sender and ``prefect-webhooks preview`` both shape requests here, so a preview shows what is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from pydantic import SecretStr

from prefect_webhooks.blocks.endpoint import WebhookEndpoint
from prefect_webhooks.blocks.endpoint_auth import BearerToken, ClientCertificate, OAuth2ClientCredentials
from prefect_webhooks.delivery.sending.transport import ClientTls
from prefect_webhooks.messages.mapping import Mapping, compile_mapping
from prefect_webhooks.signing.headers import MessageSigner
from prefect_webhooks.signing.signatures import SIGNATURE_HEADER
from prefect_webhooks.store.endpoints.states import url_key

# The delivery contract's version (the destination spec's ``<product_name>/1.0``), not the package's: receivers may
# allow-list it, so it moves only with the bodies and headers they get.
USER_AGENT = "prefect-webhooks/1.0"
AUTHORIZATION_HEADER = "Authorization"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One URL ready to send to: the headers every request carries (static ones and a bearer token included), the
    method, the compiled mapping, OAuth2 credentials to fetch a token with, and the client certificate (mTLS)."""

    url: str
    headers: dict[str, str]
    method: str = "POST"
    mapping: Mapping | None = None
    oauth2: OAuth2ClientCredentials | None = None
    tls: ClientTls | None = None
    position: int = 1
    """Its place in the block's list, from 1 (how ``disabled_endpoints`` names it)."""
    key: str = ""
    """Its key in the store's ``endpoint_states`` (``url_key``)."""
    rate_limit: float | None = None
    burst: int = 1

    def render(self, body: bytes) -> bytes:
        """The body this endpoint gets for one serialised message: the message itself, or its mapping."""
        return body if self.mapping is None else self.mapping.render(body)


def endpoint_of(endpoint: WebhookEndpoint, ca_file: str | None, position: int = 1) -> Endpoint:
    """Prepare a saved endpoint, the ``position``-th of its destination, for sending (secrets in the clear, kept
    only in memory)."""
    headers = {"User-Agent": USER_AGENT, "Content-Type": "application/json"}
    headers.update(endpoint.header_values())
    headers.pop(SIGNATURE_HEADER, None)
    auth = endpoint.auth
    if isinstance(auth, BearerToken):
        headers[AUTHORIZATION_HEADER] = f"Bearer {auth.token.get_secret_value()}"
    certificate = endpoint.client_certificate
    return Endpoint(
        url=endpoint.url,
        headers=headers,
        method=endpoint.method,
        mapping=compile_mapping(endpoint.mapping) if endpoint.mapping is not None else None,
        oauth2=auth if isinstance(auth, OAuth2ClientCredentials) else None,
        tls=_client_tls(certificate, ca_file) if certificate is not None else None,
        position=position,
        key=url_key(endpoint.url),
        rate_limit=endpoint.rate_limit,
        burst=endpoint.rate_limit_burst,
    )


def _client_tls(certificate: ClientCertificate, ca_file: str | None) -> ClientTls:
    password = certificate.private_key_password.get_secret_value() if certificate.private_key_password else None
    return _tls_for(certificate.certificate, certificate.private_key.get_secret_value(), password,
                    certificate.ca_bundle, ca_file)


@lru_cache(maxsize=64)
def _tls_for(
    certificate: str, private_key: str, password: str | None, ca_bundle: str | None, ca_file: str | None
) -> ClientTls:
    # Loaded once as the block's validation loads it, so material that cannot be used fails here, naming its field
    # (``ClientCertificate.ssl_context``), not at each request. One value per certificate for the process: the
    # transport keeps its handles and connections apart by it, and a block reloaded every few seconds keeps them.
    ClientCertificate.model_construct(
        certificate=certificate, private_key=SecretStr(private_key), ca_bundle=ca_bundle,
        private_key_password=SecretStr(password) if password is not None else None,
    ).ssl_context(ca_file)
    return ClientTls(certificate.encode(), private_key.encode(), password,
                     ca_bundle.encode() if ca_bundle is not None else None)


@dataclass(frozen=True, slots=True)
class Request:
    """One request to send: where, what, and with which headers (an OAuth2 token is added when it is sent)."""

    endpoint: Endpoint
    body: bytes
    headers: dict[str, str]


def shape_requests(
    endpoints: Sequence[Endpoint], signer: MessageSigner, key: str, body_for: Callable[[Endpoint], bytes]
) -> list[Request]:
    """The requests of one message or batch (id ``key``) to ``endpoints``; ``body_for`` gives each one's body.

    Endpoints without a mapping share one body and one set of signatures (signed once).
    """
    shared: tuple[bytes, dict[str, str]] | None = None
    requests = []
    for endpoint in endpoints:
        if endpoint.mapping is None and shared is not None:
            body, signed = shared
        else:
            body = body_for(endpoint)
            signed = signer.headers(body, key)
            if endpoint.mapping is None:
                shared = body, signed
        requests.append(Request(endpoint, body, {**endpoint.headers, **signed}))
    return requests
