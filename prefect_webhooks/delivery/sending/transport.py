"""The request path: HTTP/1.1 requests through libcurl's multi interface (pycurl), driven by the running event loop.

A delivering process spends most of its CPU per message on the request itself. A raw keep-alive POST loop costs
about half as much CPU per request with libcurl as with aiohttp's client on this project's machine
(``bench/bench_request_path.py`` measures every candidate in one run), because libcurl writes the request, parses the
answer and keeps the connections in C: the Python work left per request is a few option calls and one future.

``CurlTransport`` is a thin layer over it, in the shape Tornado's ``curl_httpclient`` gave the same integration: the
multi handle tells the loop which sockets to watch (``add_reader``/``add_writer``) and when to call it back
(``call_later``); the loop hands it each socket's readiness (``socket_action``); finished transfers resolve their
futures. Everything runs on the loop's thread. What it keeps of delivery's contract:

- **TLS** verified against the system store (``ssl.get_default_verify_paths``: ``SSL_CERT_FILE`` is honoured) plus
  the ``tls_ca_file`` setting, or an endpoint's own ``ca_bundle``; host names checked; a client certificate per
  endpoint (``ClientTls``), from memory, never from a file.
- **Timeouts**: the whole request, connecting included, within ``timeout`` seconds, counted from when the request
  leaves the sender's own queue (its slots), not from when it was queued.
- **The answer's size**: at most ``limit`` bytes are read; a longer answer's transfer stops there (its connection is
  closed) and the status stands.
- **Connections** are kept alive per host for ``keepalive_seconds`` and shared by every request of the process; the
  number in use is the sender's concurrency limit (the transport itself does not queue).
- **The private-network guard** (``block_private_networks``) checks each address a connection is about to be made
  to, after resolution, so a public name resolving to an internal address (DNS rebinding) is refused too; a request
  on a connection kept alive reuses what was checked.
- No proxy from the environment, no redirects followed, no cookies, no decompression: the wire is what the
  destination spec lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pycurl

from prefect_webhooks.delivery.sending.network import is_blocked_address

_READING = frozenset({pycurl.POLL_IN, pycurl.POLL_INOUT})
_WRITING = frozenset({pycurl.POLL_OUT, pycurl.POLL_INOUT})

READ_LIMIT = 64 * 1024
"""Bytes read of an answer at most by default: a receiver's answer is kept only in part (``answers``)."""


@dataclass(frozen=True, slots=True)
class ClientTls:
    """An endpoint's client certificate (mTLS), PEM, held in memory; ``ca_bundle`` replaces the trusted authorities
    for that endpoint's server when given."""

    certificate: bytes
    private_key: bytes
    password: str | None = None
    ca_bundle: bytes | None = None


class TransportError(Exception):
    """A request that got no HTTP answer: ``code`` is libcurl's error number (``pycurl.E_*``), ``detail`` its
    message, ``blocked`` the address the private-network guard refused, if that is why."""

    def __init__(self, code: int, detail: str, blocked: str | None = None, *, with_certificate: bool = False) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.blocked = blocked
        self.with_certificate = with_certificate
        """Whether the request presented a client certificate (``ClientTls``)."""

    @property
    def timed_out(self) -> bool:
        return self.code == pycurl.E_OPERATION_TIMEDOUT

    @property
    def certificate_refused(self) -> bool:
        """The server's certificate failed verification: no request was sent."""
        return self.code == pycurl.E_PEER_FAILED_VERIFICATION

    @property
    def client_certificate_unusable(self) -> bool:
        """The endpoint's own certificate or key could not be used (not PEM, wrong password, key not matching:
        libcurl says the last two while setting the key up, as a bad option)."""
        return self.code == pycurl.E_SSL_CERTPROBLEM or (
            self.with_certificate and self.code == pycurl.E_BAD_FUNCTION_ARGUMENT)

    @property
    def in_handshake(self) -> bool:
        """The TLS handshake itself failed (over TLS 1.2, how a receiver refuses a client certificate)."""
        return self.code == pycurl.E_SSL_CONNECT_ERROR


class Answer:
    """What a receiver answered: the status, the first ``limit`` bytes of the body, the raw header block."""

    __slots__ = ("status", "body", "head")

    def __init__(self, status: int, body: bytes, head: bytes) -> None:
        self.status = status
        self.body = body
        self.head = head

    def header(self, name: bytes) -> str | None:
        """The value of header ``name`` (lower case, as bytes), or None; read only when asked (``Retry-After``)."""
        for line in self.head.split(b"\r\n"):
            key, colon, value = line.partition(b":")
            if colon and key.strip().lower() == name:
                return value.strip().decode("latin-1")
        return None


def system_ca_file(extra: str | None = None) -> tuple[str | None, str | None]:
    """The CA file and folder the system trusts (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` honoured, as Python's ``ssl``
    does); with ``extra``, a file holding the system's authorities and those of ``extra`` (made once, private)."""
    paths = ssl.get_default_verify_paths()
    cafile = paths.cafile if paths.cafile and os.path.exists(paths.cafile) else None
    capath = paths.capath if paths.capath and os.path.isdir(paths.capath) else None
    if not extra:
        return cafile, capath
    with open(extra, "rb") as added:
        authorities = added.read()
    system = b""
    if cafile:
        with open(cafile, "rb") as trusted:
            system = trusted.read()
    # The system's folder stays trusted beside the file (a CA may be in SSL_CERT_DIR only), as Python's ssl does.
    return _bundle(system + b"\n" + authorities), capath


def _bundle(pem: bytes) -> str:
    handle, path = tempfile.mkstemp(prefix="prefect-webhooks-ca-", suffix=".pem")
    with os.fdopen(handle, "wb") as bundle:
        bundle.write(pem)
    return path


class CurlTransport:
    """HTTP/1.1 requests through one libcurl multi handle on the running event loop (see the module's notes)."""

    def __init__(
        self,
        *,
        timeout: float,
        tls_ca_file: str | None = None,
        block_private_networks: bool = False,
        keepalive_seconds: int = 30,
        connections: int = 64,
    ) -> None:
        self.timeout_ms = max(int(timeout * 1000), 1)
        self.block_private_networks = block_private_networks
        self.keepalive_seconds = keepalive_seconds
        self._ca_file, self._ca_path = system_ca_file(tls_ca_file)
        self._made_ca_file = self._ca_file if tls_ca_file else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._watch_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._set_timer)
        # Connections kept alive: at least as many as may be in use at once.
        self._multi.setopt(pycurl.M_MAXCONNECTS, max(connections, 1))
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0
        self._idle: dict[ClientTls | None, list[pycurl.Curl]] = {}
        self._running: set[pycurl.Curl] = set()
        self._watched: dict[int, int] = {}
        """The sockets the loop watches for libcurl, and for what (``pycurl.POLL_*``)."""

    async def request(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        tls: ClientTls | None = None,
        limit: int = READ_LIMIT,
    ) -> Answer:
        """Send one request and return its answer; raises ``TransportError`` when no HTTP answer came, and
        ``ValueError`` for a header that would break the request (a line break in a name or value)."""
        lines = [f"{name}: {value}" for name, value in headers.items()]
        joined = "\0".join(lines)
        if "\n" in joined or "\r" in joined:
            raise ValueError("a request header holds a line break")
        lines.append("Expect:")  # no 100-continue round trip before a large body
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        handle = self._take(tls)
        # A handle is reused mostly for the same URL and method: those are set only when they change.
        if handle.url != url:
            handle.setopt(pycurl.URL, url)
            handle.url = url
        if handle.method != method:
            handle.setopt(pycurl.CUSTOMREQUEST, method)
            handle.method = method
        handle.setopt(pycurl.POSTFIELDS, body)
        handle.setopt(pycurl.HTTPHEADER, lines)
        handle.answer.clear()
        handle.head.clear()
        handle.limit = limit
        handle.blocked = None
        future = handle.future = loop.create_future()
        self._multi.add_handle(handle)
        self._running.add(handle)
        try:
            failure = await future
        except BaseException:
            # Cancelled: the transfer stops here (its connection is closed) and the handle is not reused.
            self._drop(handle)
            raise
        if failure is not None and failure[0] != pycurl.E_WRITE_ERROR:
            self._give_back(handle, tls)
            code, detail = failure
            raise TransportError(code, detail, handle.blocked, with_certificate=tls is not None)
        # E_WRITE_ERROR: the answer passed ``limit`` and reading stopped there (within the piece that crossed it,
        # which is cut); its status stands.
        answer = Answer(handle.getinfo(pycurl.RESPONSE_CODE), bytes(handle.answer[:limit]), bytes(handle.head))
        self._give_back(handle, tls)
        return answer

    async def close(self) -> None:
        """Stop every transfer, close every connection and stop watching the loop."""
        for handle in list(self._running):
            self._drop(handle)
            if not handle.future.done():
                handle.future.cancel()
        for handles in self._idle.values():
            for handle in handles:
                handle.close()
        self._idle.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._multi.close()
        if self._loop is not None:
            for fd, event in self._watched.items():
                if event in _READING:
                    self._loop.remove_reader(fd)
                if event in _WRITING:
                    self._loop.remove_writer(fd)
        self._watched.clear()
        if self._made_ca_file:
            with contextlib.suppress(OSError):
                os.unlink(self._made_ca_file)

    # Easy handles: one per request in flight, reused, kept apart by client certificate (their TLS options differ).

    def _take(self, tls: ClientTls | None) -> pycurl.Curl:
        idle = self._idle.get(tls)
        if idle:
            return idle.pop()
        return self._new_handle(tls)

    def _give_back(self, handle: pycurl.Curl, tls: ClientTls | None) -> None:
        handle.future = None
        self._idle.setdefault(tls, []).append(handle)

    def _drop(self, handle: pycurl.Curl) -> None:
        if handle in self._running:
            self._running.discard(handle)
            with contextlib.suppress(pycurl.error):
                self._multi.remove_handle(handle)
        handle.close()

    def _new_handle(self, tls: ClientTls | None) -> pycurl.Curl:
        handle = pycurl.Curl()
        answer, head = bytearray(), bytearray()
        handle.answer, handle.head, handle.limit, handle.blocked, handle.future = answer, head, READ_LIMIT, None, None
        handle.url = handle.method = None

        def write(chunk: bytes) -> int | None:
            answer.extend(chunk)
            # Returning a short count stops the transfer (E_WRITE_ERROR): enough of the answer is read.
            return 0 if len(answer) > handle.limit else None

        handle.setopt(pycurl.WRITEFUNCTION, write)
        handle.setopt(pycurl.HEADERFUNCTION, head.extend)
        handle.setopt(pycurl.NOSIGNAL, 1)
        handle.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        handle.setopt(pycurl.TIMEOUT_MS, self.timeout_ms)
        handle.setopt(pycurl.CONNECTTIMEOUT_MS, self.timeout_ms)
        handle.setopt(pycurl.MAXAGE_CONN, self.keepalive_seconds)
        handle.setopt(pycurl.PROXY, "")  # never a proxy from the environment
        handle.setopt(pycurl.FOLLOWLOCATION, 0)
        handle.setopt(pycurl.SSL_VERIFYPEER, 1)
        handle.setopt(pycurl.SSL_VERIFYHOST, 2)
        if tls is not None and tls.ca_bundle is not None:
            handle.setopt(pycurl.CAINFO_BLOB, tls.ca_bundle)
            handle.setopt(pycurl.CAPATH, None)
        else:
            if self._ca_file:
                handle.setopt(pycurl.CAINFO, self._ca_file)
            if self._ca_path:
                handle.setopt(pycurl.CAPATH, self._ca_path)
        if tls is not None:
            handle.setopt(pycurl.SSLCERT_BLOB, tls.certificate)
            handle.setopt(pycurl.SSLCERTTYPE, "PEM")
            handle.setopt(pycurl.SSLKEY_BLOB, tls.private_key)
            handle.setopt(pycurl.SSLKEYTYPE, "PEM")
            # A password (empty when none) keeps OpenSSL from prompting on a terminal for an encrypted key.
            handle.setopt(pycurl.KEYPASSWD, tls.password or "")
        if self.block_private_networks:
            handle.setopt(pycurl.OPENSOCKETFUNCTION, self._guarded_socket(handle))
        return handle

    @staticmethod
    def _guarded_socket(handle: pycurl.Curl) -> Any:
        def open_socket(purpose: int, address: Any) -> Any:
            host = address.addr[0]
            if is_blocked_address(host):
                handle.blocked = host
                return pycurl.SOCKET_BAD
            return socket.socket(address.family, address.socktype, address.protocol)

        return open_socket

    # The multi handle's side of the event loop.

    def _watch_socket(self, event: int, fd: int, multi: Any, data: Any) -> None:
        # Called about twice a request (watch for the answer; stop watching a connection put back in the cache):
        # only what changes is told to the loop.
        loop = self._loop
        assert loop is not None
        was = self._watched.get(fd, pycurl.POLL_REMOVE)
        now = event if event != pycurl.POLL_NONE else pycurl.POLL_REMOVE
        if now == pycurl.POLL_REMOVE:
            self._watched.pop(fd, None)
        else:
            self._watched[fd] = now
        reads, read = was in _READING, now in _READING
        writes, write = was in _WRITING, now in _WRITING
        if read and not reads:
            loop.add_reader(fd, self._act, fd, pycurl.CSELECT_IN)
        elif reads and not read:
            loop.remove_reader(fd)
        if write and not writes:
            loop.add_writer(fd, self._act, fd, pycurl.CSELECT_OUT)
        elif writes and not write:
            loop.remove_writer(fd)

    def _set_timer(self, milliseconds: int) -> None:
        # libcurl asks for its timer after nearly every call (twice a request). A pending timer that fires no later
        # than asked is kept: firing early costs one call that finds nothing due, and libcurl asks again.
        loop = self._loop
        if milliseconds < 0 or loop is None:
            return
        due = loop.time() + milliseconds / 1000
        if self._timer is not None:
            if self._timer_due <= due:
                return
            self._timer.cancel()
        self._timer, self._timer_due = loop.call_at(due, self._act, pycurl.SOCKET_TIMEOUT, 0), due

    def _act(self, fd: int, event: int) -> None:
        if fd == pycurl.SOCKET_TIMEOUT:
            self._timer = None
        multi = self._multi
        while multi.socket_action(fd, event)[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass
        while True:
            queued, done, failed = multi.info_read()
            for handle in done:
                self._finished(handle, None)
            for handle, code, detail in failed:
                self._finished(handle, (code, detail))
            if not queued:
                break

    def _finished(self, handle: pycurl.Curl, failure: tuple[int, str] | None) -> None:
        self._running.discard(handle)
        self._multi.remove_handle(handle)
        future = handle.future
        if future is not None and not future.done():
            future.set_result(failure)
