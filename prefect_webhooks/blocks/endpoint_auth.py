"""How an endpoint authenticates the sender beyond the HMAC signatures: a bearer token, OAuth2 client credentials,
or a client certificate (mutual TLS). Each is a part of a ``WebhookEndpoint``; every secret is a ``SecretStr``.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from prefect_webhooks.blocks.validated import part_config

_PEM_BEGIN = "-----BEGIN "


def check_url(url: str) -> str:
    """A full ``http``/``https`` URL with a host, or ``ValueError`` saying what is missing."""
    parts = urlsplit(url.strip())
    if "://" not in url:
        # "127.0.0.1:9000/h" parses as a scheme-less path (or as scheme "127.0.0.1"): say what to add.
        raise ValueError("URL needs http:// or https:// in front (for example https://hooks.example.com/in)")
    if parts.scheme not in ("http", "https"):
        raise ValueError("URL must start with http:// or https:// (no other scheme is delivered to)")
    if not parts.hostname:
        raise ValueError("URL has no host")
    return url.strip()


class BearerToken(BaseModel):
    """A fixed token sent as ``Authorization: Bearer <token>``."""

    model_config = part_config(hide_input_in_errors=True)

    type: Literal["bearer"] = Field(default="bearer", description="Bearer token authentication.")
    token: SecretStr = Field(description="The token; kept secret.")

    @field_validator("token")
    @classmethod
    def _printable(cls, value: SecretStr) -> SecretStr:
        token = value.get_secret_value()
        if not token or not token.isprintable() or not token.isascii() or " " in token:
            raise ValueError("a bearer token is non-empty printable ASCII without spaces")
        return value


class OAuth2ClientCredentials(BaseModel):
    """OAuth2 client credentials (RFC 6749 section 4.4): a token is fetched from ``token_url`` and sent as
    ``Authorization: Bearer``; it is kept until shortly before it expires and fetched again once on a 401."""

    model_config = part_config(hide_input_in_errors=True)

    type: Literal["oauth2_client_credentials"] = Field(
        default="oauth2_client_credentials", description="OAuth2 client credentials grant."
    )
    token_url: str = Field(description="The authorization server's token endpoint, a full http(s) URL.")
    client_id: str = Field(min_length=1, description="The client id the authorization server issued.")
    client_secret: SecretStr = Field(description="The client secret; kept secret.")
    scope: str | None = Field(default=None, description="Space-separated scopes to ask for; none when unset.")
    client_auth: Literal["basic", "body"] = Field(
        default="basic",
        description="How the client authenticates: HTTP Basic (client_secret_basic) or form fields "
        "(client_secret_post).",
    )

    @field_validator("token_url")
    @classmethod
    def _full_url(cls, value: str) -> str:
        return check_url(value)


class ClientCertificate(BaseModel):
    """A client certificate for mutual TLS, and optionally the certificate authorities to trust for the server."""

    model_config = part_config(hide_input_in_errors=True)

    certificate: str = Field(description="The client certificate in PEM, followed by its intermediates if any.")
    private_key: SecretStr = Field(description="The certificate's private key in PEM; kept secret.")
    private_key_password: SecretStr | None = Field(
        default=None, description="Password of an encrypted private key; kept secret."
    )
    ca_bundle: str | None = Field(
        default=None,
        description="PEM certificates of the authorities the server's certificate must chain to, instead of the "
        "system trust store.",
    )

    @model_validator(mode="after")
    def _loads(self) -> ClientCertificate:
        # Building the context is the real check (PEM syntax, key matches certificate); OpenSSL's reasons never
        # quote key material.
        self.ssl_context(None)
        return self

    def ssl_context(self, ca_file: str | None) -> ssl.SSLContext:
        """A client TLS context presenting this certificate (host names and server certificates verified).

        Args:
            ca_file: Extra trusted authorities for the server (the ``tls_ca_file`` setting) when no ``ca_bundle``.

        Raises:
            ValueError: naming the field that could not be loaded.
        """
        for field, text in (("certificate", self.certificate), ("private_key", self.private_key.get_secret_value())):
            if _PEM_BEGIN not in text:
                raise ValueError(f"{field}: not PEM (no '-----BEGIN' line)")
        context = ssl.create_default_context()
        try:
            if self.ca_bundle is not None:
                context = ssl.create_default_context(cadata=self.ca_bundle)
            elif ca_file:
                context.load_verify_locations(cafile=ca_file)
        except (ssl.SSLError, ValueError) as exc:
            raise ValueError(f"ca_bundle: cannot be loaded: {_reason(exc)}") from None
        password = self.private_key_password.get_secret_value() if self.private_key_password else ""
        # The ssl module loads keys from files only: a private folder, removed as soon as the key is loaded.
        with tempfile.TemporaryDirectory(prefix="prefect-webhooks-tls-") as folder:
            certificate_file = _write_private(folder, "certificate.pem", self.certificate)
            key_file = _write_private(folder, "key.pem", self.private_key.get_secret_value())
            try:
                # A password (empty when none) keeps OpenSSL from prompting on a terminal for an encrypted key.
                context.load_cert_chain(certificate_file, key_file, password=password)
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(f"certificate/private_key: cannot be loaded: {_reason(exc)}") from None
        return context


def _write_private(folder: str, name: str, text: str) -> str:
    path = os.path.join(folder, name)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


def _reason(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or type(exc).__name__


EndpointAuth = Annotated[BearerToken | OAuth2ClientCredentials, Field(discriminator="type")]
"""The ways an endpoint can ask the sender to authenticate in a header."""
