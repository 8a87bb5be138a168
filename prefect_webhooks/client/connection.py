"""One keep-alive HTTP connection to the ingest API, posting batch bodies: the client's only network code."""

from __future__ import annotations

import base64
import gzip
import http.client
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

BATCH_PATH = "/v1/batch"


def batch_url(endpoint: str) -> str:
    """The batch URL for an ingest API base URL (a URL already ending in ``/v1/batch`` is kept)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(BATCH_PATH) else endpoint + BATCH_PATH


def basic_auth(write_key: str) -> str:
    """The ``Authorization`` value: HTTP Basic with the write key as user and an empty password."""
    return "Basic " + base64.b64encode(f"{write_key}:".encode()).decode("ascii")


class UnusableUrl(ValueError):
    """An endpoint URL the client cannot send to (not http/https, no host)."""


@dataclass(frozen=True)
class PostResult:
    """The parts of an answer the client uses."""

    status: int
    retry_after: str | None
    text: str


# Errors of a request on a kept-alive connection that the server had already closed: sent again at once, once.
_STALE_CONNECTION = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class BatchPoster:
    """One keep-alive HTTP connection posting batch bodies; one per sender thread.

    Built on ``http.client``: a batch carries at most ``flush_at`` (20) messages, so a busy client makes thousands of
    requests a second, and httpx's per-request CPU (~0.5 ms measured here, against ~0.1 ms) took the GIL from the
    calling threads. TLS uses httpx's context (the same trust as before: certifi's bundle), built here, in the
    calling thread, not in the sender thread: an ``os.fork()`` landing mid-construction would leave OpenSSL's lock
    held in the child. HTTP proxies from the environment are not used: the client connects to the endpoint.
    """

    def __init__(self, url: str, headers: dict[str, str], timeout: float, use_gzip: bool) -> None:
        self.url = url
        self.use_gzip = use_gzip
        self.timeout = timeout
        self._headers = headers
        parts = urlsplit(url)
        self._scheme = parts.scheme.lower()
        self._host = parts.hostname or ""
        self._port = parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._ssl = httpx.create_ssl_context() if self._scheme == "https" else None
        self._connection: http.client.HTTPConnection | None = None
        self._used = False  # whether the open connection already carried a request

    def _connect(self) -> http.client.HTTPConnection:
        if self._scheme not in ("http", "https") or not self._host:
            raise UnusableUrl(f"{self.url!r} is not an http or https URL with a host")
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)

    def post(self, body: bytes) -> PostResult:
        """Send one request body (gzipped when configured); a stale kept-alive connection is replaced once.

        Raises:
            UnusableUrl: the endpoint URL cannot be used.
            OSError, http.client.HTTPException: the request did not get an answer.
        """
        headers = dict(self._headers)
        if self.use_gzip:
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        headers["Content-Length"] = str(len(body))
        try:
            return self._exchange(body, headers)
        except _STALE_CONNECTION:
            reused = self._used
            self.close()
            if not reused:
                raise
        except BaseException:
            self.close()
            raise
        try:
            return self._exchange(body, headers)
        except BaseException:
            self.close()
            raise

    def _exchange(self, body: bytes, headers: dict[str, str]) -> PostResult:
        if self._connection is None:
            self._connection = self._connect()
            self._used = False
        self._connection.request("POST", self._path, body=body, headers=headers)
        response = self._connection.getresponse()
        text = response.read(65_536).decode("utf-8", "replace")
        if response.will_close or not response.isclosed():
            # Not kept alive, or an answer longer than read: start afresh next time.
            self.close()
        else:
            self._used = True
        return PostResult(response.status, response.getheader("retry-after"), text)

    def close(self) -> None:
        """Close the connection (the next request opens a new one)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self._used = False
