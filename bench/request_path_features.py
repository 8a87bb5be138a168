"""What delivery needs of its HTTP client, tried for real on delivery's transport (pycurl) and on pyreqwest.

    .venv/bin/python bench/request_path_features.py [--clients pycurl pyreqwest]

Companion of ``bench_request_path.py`` (which measures their CPU per request): local servers with certificates of
``trustme`` CAs, in a thread of this process (HTTPS with ALPN h2 + http/1.1; HTTPS demanding a client certificate;
HTTPS with a certificate of a CA nobody trusts; plain HTTP; a listener whose backlog is full, where a connect hangs),
and for each client one line per feature: ``yes`` / ``no``, and how (or what failed). The pycurl column is the
package's own ``CurlTransport`` (``delivery/sending/transport.py``), made and called as ``delivery/sending/sender.py``
does: one transport for every endpoint, ``ClientTls`` per endpoint, ``tls_ca_file``, ``block_private_networks``,
``limit`` (``READ_LIMIT`` by default), one ``timeout``, failures read from ``TransportError`` (``certificate_refused``,
``client_certificate_unusable``, ``timed_out``, ``blocked``) in the sender's order; the concurrency bounded by the
caller's slots, as the sender's. pyreqwest (the runner-up) is configured per endpoint (``ClientBuilder``), one
client per endpoint.

Features: TLS verified against the system store and an extra CA file at once (the system store stands in for a
CA installed in it: for the transport, ``SSL_CERT_FILE`` naming a file or ``SSL_CERT_DIR`` a hashed folder, as
``/etc/ssl/certs`` is, while it is made (it reads them through ``ssl.get_default_verify_paths``); for pyreqwest
``SSL_CERT_FILE`` in a child process, which is how rustls-platform-verifier reads Linux's store); a client
certificate and key given as PEM text, the key under a password, per endpoint on the same host without mixing
their connections (the transport: an endpoint's own ``ca_bundle`` too, and a certificate or key it cannot use told
apart); POST/PUT/PATCH with per-request headers; timeouts (the transport: one over the whole request, connecting
included, as delivery's contract is; pyreqwest: a connect timeout and a total timeout, told apart); a bounded read
of a 1 GB answer (the server counts what it could write; the transport at ``READ_LIMIT`` and at 1 KB, pyreqwest at
1 KB); ``Retry-After`` read; keep-alive under a per-endpoint concurrency limit (the server counts connections and
requests in flight); the private-network guard on the address actually connected to (a name resolving to loopback,
an IP literal, a public-looking name pinned to loopback as DNS rebinding would: ``CURLOPT_RESOLVE`` set on the
transport's handles by a subclass, the transport having no option for it); HTTP/1.1 only against a server
offering h2 by ALPN; a certificate verification failure (unknown CA, wrong host name) told apart from other
connection errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

BIG = 1 << 30  # the huge answer: 1 GB
KEY_PASSWORD = b"key-pass-0001"
# The CA bundle the libcurl of pycurl's manylinux wheels has built in (strings of pycurl.libs/libcurl-*.so).
WHEEL_BUNDLE = "/etc/pki/tls/certs/ca-bundle.crt"


# ------------------------------------------------------------------------------------------------- the servers


@dataclass
class Seen:
    """What the servers saw."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    big_written: int = 0


class Servers:
    """The local servers, on an event loop in a thread of their own."""

    def __init__(self, folder: Path) -> None:
        import trustme

        self.folder = folder
        self.ca, self.client_ca, self.stranger = trustme.CA(), trustme.CA(), trustme.CA()
        self.ca_file = folder / "extra-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.clients = {name: self.client_ca.issue_cert(f"{name}.clients.example", common_name=name)
                        for name in ("client-a", "client-b")}
        self.seen = Seen()
        self.loop = asyncio.new_event_loop()
        self.ports: dict[str, int] = {}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._hang = socket.socket()

    def __enter__(self) -> Servers:
        self._thread.start()
        self._ready.wait(30)
        # The huge answer comes from a blocking server of its own: each send counts only once the kernel took it
        # (an asyncio transport goes on accepting writes after the peer has gone).
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("localhost").configure_cert(context)
        context.set_alpn_protocols(["http/1.1"])
        self._big = context.wrap_socket(socket.create_server(("127.0.0.1", 0)), server_side=True)
        self.ports["big"] = self._big.getsockname()[1]
        threading.Thread(target=self._serve_big, daemon=True).start()
        # A listener that never accepts, its backlog full: a connect to it hangs (SYNs dropped).
        self._hang.bind(("127.0.0.1", 0))
        self._hang.listen(0)
        self.ports["hang"] = self._hang.getsockname()[1]
        self._fill = []
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", self.ports["hang"]))
            self._fill.append(filler)
        time.sleep(0.1)
        return self

    def _serve_big(self) -> None:
        while True:
            try:
                connection, _ = self._big.accept()
            except OSError:
                return
            threading.Thread(target=self._send_big, args=(connection,), daemon=True).start()

    def _send_big(self, connection: socket.socket) -> None:
        with connection:
            received = b""
            while b"\r\n\r\n" not in received:
                data = connection.recv(65536)
                if not data:
                    return
                received += data
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % BIG)
            chunk = b"x" * 65536
            try:
                while self.seen.big_written < BIG:
                    connection.sendall(chunk)
                    self.seen.big_written += len(chunk)
            except OSError:
                pass

    def __exit__(self, *exc: object) -> None:
        self._big.close()
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        for sock in (self._hang, *self._fill):
            sock.close()

    def url(self, site: str, path: str = "/echo", host: str = "localhost") -> str:
        scheme = "http" if site == "plain" else "https"
        return f"{scheme}://{host}:{self.ports[site]}{path}"

    def client_pems(self, name: str, password: bytes | None = KEY_PASSWORD) -> tuple[bytes, bytes]:
        """A client certificate chain and its key as PEM text, the key encrypted under ``password``."""
        from cryptography.hazmat.primitives import serialization

        issued = self.clients[name]
        chain = b"".join(blob.bytes() for blob in issued.cert_chain_pems)
        key = serialization.load_pem_private_key(issued.private_key_pem.bytes(), None)
        encryption = (serialization.BestAvailableEncryption(password) if password
                      else serialization.NoEncryption())
        return chain, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)

    def _run(self) -> None:
        import logging

        # "socket.send() raised exception." for every write after the client dropped the huge answer.
        logging.getLogger("asyncio").setLevel(logging.ERROR)
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        from aiohttp import web

        self._stop = asyncio.Event()
        seen = self.seen

        async def echo(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            transport = request.transport
            assert transport is not None
            ssl_object = transport.get_extra_info("ssl_object")
            certificate = transport.get_extra_info("peercert") or {}
            subject = dict(pair[0] for pair in certificate.get("subject", ()))
            seen.requests.append({
                "site": request.url.port, "method": request.method, "headers": dict(request.headers),
                "body": len(body), "connection": transport.get_extra_info("peername")[1],
                "alpn": ssl_object.selected_alpn_protocol() if ssl_object else None,
                "client": subject.get("commonName"), "version": f"{request.version.major}.{request.version.minor}",
            })
            seen.in_flight += 1
            seen.most_in_flight = max(seen.most_in_flight, seen.in_flight)
            try:
                await asyncio.sleep(float(request.query.get("delay", 0)))
            finally:
                seen.in_flight -= 1
            return web.Response(text="ok")

        async def retry(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(status=429, text="slow down", headers={"Retry-After": "7"})

        async def slow(request: web.Request) -> web.Response:
            await request.read()
            await asyncio.sleep(3)
            return web.Response(text="late")

        app = web.Application()
        for path, handler in (("/echo", echo), ("/retry", retry), ("/slow", slow)):
            app.router.add_route("*", path, handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()

        def server_context(ca: Any, mtls: bool = False) -> ssl.SSLContext:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            # No IP address among its names: https://127.0.0.1 is a wrong host name.
            ca.issue_cert("localhost", "public.example").configure_cert(context)
            context.set_alpn_protocols(["h2", "http/1.1"])
            if mtls:
                context.verify_mode = ssl.CERT_REQUIRED
                self.client_ca.configure_trust(context)
            return context

        sites = {"tls": server_context(self.ca), "mtls": server_context(self.ca, mtls=True),
                 "stranger": server_context(self.stranger), "plain": None}
        for name, context in sites.items():
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
            await site.start()
            self.ports[name] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()


# ------------------------------------------------------------------------------------------------- the clients


@dataclass
class Outcome:
    status: int | None = None
    answer: bytes = b""
    retry_after: str | None = None
    error: str | None = None
    """None, or one of: certificate, connect-timeout, timeout, refused-by-guard, connection."""
    detail: str = ""
    seconds: float = 0.0


@contextlib.contextmanager
def system_store(file: str | None = None, folder: str | None = None) -> Iterator[None]:
    """The system store as ``ssl.get_default_verify_paths`` reads it: ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` name
    ``file`` / ``folder`` (one that is None names nothing), for the ``CurlTransport`` made inside."""
    saved = {name: os.environ.get(name) for name in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    os.environ["SSL_CERT_FILE"] = file or "/nonexistent/ca-file.pem"
    os.environ["SSL_CERT_DIR"] = folder or "/nonexistent/ca-folder"
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class PycurlEndpoints:
    """pycurl: the package's ``CurlTransport`` (``delivery/sending/transport.py``), made and called as
    ``delivery/sending/sender.py`` does: one transport (one CurlMulti, one connection cache) for every endpoint, an
    endpoint's client certificate as its ``ClientTls``, the concurrency bounded by the caller's slots (the transport
    does not queue).

    ``system_dir``, when given, stands for the system store (``SSL_CERT_DIR``, the real ``SSL_CERT_FILE`` named
    nothing) while the transport is made: it reads the store once, there. ``connect_timeout`` is not the
    transport's: its ``timeout`` covers the whole request, connecting included. ``resolve`` pins names to addresses
    (``CURLOPT_RESOLVE``, a DNS answer's stand-in): the transport has no option for it, so a subclass sets it on
    each handle it makes.
    """

    def __init__(self, *, ca_file: str | None, system_dir: str | None, concurrency: int = 8,
                 guard: bool = False, connect_timeout: float = 5.0, timeout: float = 5.0,
                 resolve: list[str] | None = None, limit: int | None = None) -> None:
        import pycurl

        from prefect_webhooks.delivery.sending.transport import READ_LIMIT, ClientTls, CurlTransport, TransportError

        self.client_tls, self.transport_error = ClientTls, TransportError
        self.limit = READ_LIMIT if limit is None else limit
        self.tls: dict[str, Any] = {}
        self.slots = asyncio.Semaphore(concurrency)
        made = CurlTransport
        if resolve:
            class Pinned(CurlTransport):
                def _new_handle(self, tls: Any) -> Any:
                    handle = super()._new_handle(tls)
                    handle.setopt(pycurl.RESOLVE, resolve)
                    return handle

            made = Pinned
        with system_store(folder=system_dir) if system_dir else contextlib.nullcontext():
            self.transport = made(timeout=timeout, tls_ca_file=ca_file, block_private_networks=guard,
                                  keepalive_seconds=30, connections=concurrency)

    def certificate(self, name: str, chain: bytes, key: bytes, password: bytes | None,
                    ca_bundle: bytes | None = None) -> None:
        self.tls[name] = self.client_tls(chain, key, password.decode() if password else None, ca_bundle)

    async def send(self, url: str, method: str = "POST", headers: dict[str, str] | None = None,
                   body: bytes = b"{}", endpoint: str | None = None) -> Outcome:
        started = time.perf_counter()
        outcome = Outcome()
        try:
            async with self.slots:  # the sender's slots
                answer = await self.transport.request(method, url, body, headers or {},
                                                      tls=self.tls[endpoint] if endpoint else None, limit=self.limit)
        except self.transport_error as exc:
            # In the order of the sender's ``_failure``.
            outcome.detail = f"curl {exc.code}: {exc.detail}"
            if exc.blocked is not None:
                outcome.error = "refused-by-guard"
                outcome.detail += f" (blocked: {exc.blocked})"
            elif exc.certificate_refused:
                outcome.error = "certificate"
            elif exc.client_certificate_unusable:
                outcome.error = "client-certificate"
            elif exc.timed_out:
                outcome.error = "timeout"
            else:
                outcome.error = "connection"
        else:
            outcome.status, outcome.answer = answer.status, answer.body
            outcome.retry_after = answer.header(b"retry-after") if answer.status in (429, 503) else None
        outcome.seconds = time.perf_counter() - started
        return outcome

    async def close(self) -> None:
        await self.transport.close()


class PyreqwestEndpoints:
    """pyreqwest: a Client per endpoint (its CA roots, client identity, concurrency, pinned addresses)."""

    def __init__(self, *, ca_file: str | None, system_dir: str | None, concurrency: int = 8,
                 guard: bool = False, connect_timeout: float = 5.0, timeout: float = 5.0,
                 resolve: list[str] | None = None) -> None:
        self.settings = {"ca_file": ca_file, "concurrency": concurrency, "guard": guard,
                         "connect_timeout": connect_timeout, "timeout": timeout, "resolve": resolve or []}
        self.identities: dict[str, bytes] = {}
        self.clients: dict[tuple[str | None, str], Any] = {}

    def certificate(self, name: str, chain: bytes, key: bytes, password: bytes | None) -> None:
        from cryptography.hazmat.primitives import serialization

        # reqwest's rustls identity takes an unencrypted key: the layer decrypts it (cryptography) first.
        if password:
            loaded = serialization.load_pem_private_key(key, password)
            key = loaded.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption())
        self.identities[name] = chain + key

    def _client(self, endpoint: str | None, url: str) -> Any:
        from urllib.parse import urlsplit

        from pyreqwest.client import ClientBuilder

        parts = urlsplit(url)
        key = (endpoint, f"{parts.scheme}://{parts.netloc}")
        if key in self.clients:
            return self.clients[key]
        s = self.settings
        builder = (ClientBuilder().max_connections(s["concurrency"]).http1_only().follow_redirects(False)
                   .gzip(False).brotli(False).zstd(False).deflate(False).referer(False)
                   .timeout(timedelta(seconds=s["timeout"]))
                   .connect_timeout(timedelta(seconds=s["connect_timeout"])))
        if s["ca_file"]:
            builder = builder.add_root_certificate_pem(Path(s["ca_file"]).read_bytes())
        if endpoint is not None:
            builder = builder.identity_pem(self.identities[endpoint])
        for host, address in [entry.split(":", 1) for entry in s["resolve"]]:
            builder = builder.resolve(host, address, 0)
        if s["guard"]:
            # No resolver hook: the layer resolves the name itself, checks every address, and pins the client to
            # the addresses checked (ClientBuilder.resolve), so a connection can go nowhere else.
            host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
            pinned = dict(entry.split(":", 1) for entry in s["resolve"])
            addresses = [pinned[host]] if host in pinned else sorted(
                {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})
            # The guard's own test of an address (delivery/sending/network.py), as CurlTransport asks it.
            from prefect_webhooks.delivery.sending.network import blocked_reason, is_blocked_address

            refusals = [blocked_reason(host, address) for address in addresses if is_blocked_address(address)]
            if refusals:
                self.clients[key] = refusals[0]
                return refusals[0]
            for address in addresses:
                builder = builder.resolve(host, address, port)
        self.clients[key] = builder.build()
        return self.clients[key]

    async def send(self, url: str, method: str = "POST", headers: dict[str, str] | None = None,
                   body: bytes = b"{}", endpoint: str | None = None) -> Outcome:
        from pyreqwest.exceptions import ConnectError, ConnectTimeoutError, RequestError, RequestTimeoutError

        started = time.perf_counter()
        client = self._client(endpoint, url)
        if isinstance(client, str):
            return Outcome(error="refused-by-guard", detail=client)
        outcome = Outcome()
        try:
            request = client.request(method, url).headers(headers or {}).body_bytes(body).build_streamed()
            async with request as response:
                outcome.status = response.status
                outcome.answer = bytes(await response.body_reader.read(1024) or b"")
                outcome.retry_after = response.get_header("Retry-After") if response.status in (429, 503) else None
        except ConnectTimeoutError as exc:
            # pyreqwest raises ConnectTimeoutError also when the total timeout ends a wait for the answer's
            # headers on a connection made: only the time taken tells them apart.
            elapsed = time.perf_counter() - started
            outcome.error = "connect-timeout" if elapsed < 0.95 * self.settings["timeout"] else "timeout"
            outcome.detail = f"{type(exc).__name__} after {elapsed:.2f} s: {_causes(exc)}"
        except RequestTimeoutError as exc:
            outcome.error, outcome.detail = "timeout", f"{type(exc).__name__}: {_causes(exc)}"
        except ConnectError as exc:
            detail = _causes(exc)
            outcome.error = "certificate" if "invalid peer certificate" in detail else "connection"
            outcome.detail = f"ConnectError: {detail}"
        except RequestError as exc:
            outcome.error, outcome.detail = "connection", f"{type(exc).__name__}: {_causes(exc)}"
        outcome.seconds = time.perf_counter() - started
        return outcome

    async def close(self) -> None:
        for client in self.clients.values():
            if not isinstance(client, str):
                await client.close()


def _causes(exc: Any) -> str:
    causes = (getattr(exc, "details", None) or {}).get("causes") or []
    return " / ".join(cause["message"] for cause in causes[1:]) or str(exc)


CLIENTS: dict[str, type] = {"pycurl": PycurlEndpoints, "pyreqwest": PyreqwestEndpoints}
LIMITS = {"pycurl": "the caller's slots, as the sender's: the transport does not queue; connections= kept alive",
          "pyreqwest": "max_connections of the endpoint's client"}


# ------------------------------------------------------------------------------------------------- the checks


def hashed_folder(folder: Path, ca_pem: bytes) -> str:
    """A CA folder as /etc/ssl/certs is (c_rehash: ``<subject hash>.0``), holding one CA."""
    folder.mkdir(exist_ok=True)
    (folder / "ca.pem").write_bytes(ca_pem)
    digest = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(folder / "ca.pem")],
                            capture_output=True, text=True, check=True).stdout.strip()
    (folder / f"{digest}.0").write_bytes(ca_pem)
    return str(folder)


async def check(kind: str, servers: Servers, folder: Path) -> list[tuple[str, bool, str]]:
    """Every feature for one client: ``(feature, yes, how or what failed)``."""
    lines: list[tuple[str, bool, str]] = []
    seen = servers.seen
    make = CLIENTS[kind]
    ca_file = str(servers.ca_file)
    # The system store's stand-in: a second CA, in a file and a hashed folder named by SSL_CERT_FILE / SSL_CERT_DIR
    # (pycurl: read by the transport through ssl.get_default_verify_paths; pyreqwest: a child process, below).
    import trustme

    system_ca = trustme.CA()
    system_dir = hashed_folder(folder / f"system-{kind}", system_ca.cert_pem.bytes())
    system_file = str(Path(system_dir) / "ca.pem")

    def add(feature: str, yes: bool, how: str) -> None:
        lines.append((feature, yes, how))
        print(f"  {kind:10s} {feature:38s} {'yes' if yes else 'NO '}  {how}", flush=True)

    # --- TLS: system store + extra CA file, verification failures told apart
    if kind == "pycurl":
        import pycurl

        # The real system store (as this machine has it) and no tls_ca_file: the test CA is refused.
        alone = PycurlEndpoints(ca_file=None, system_dir=None)
        refused_by_system = await alone.send(servers.url("tls"))
        await alone.close()
        real = ssl.get_default_verify_paths().cafile
        answers: dict[str, tuple[int | str | None, int | str | None]] = {}
        async with _served_by(system_ca) as system_url:
            for form, store in (("SSL_CERT_FILE", system_store(file=system_file)),
                                ("SSL_CERT_DIR", system_store(folder=system_dir)),
                                ("SSL_CERT_FILE=real + SSL_CERT_DIR", system_store(file=real, folder=system_dir))):
                with store:
                    client = PycurlEndpoints(ca_file=ca_file, system_dir=None)
                extra_answer, system_answer = await client.send(servers.url("tls")), await client.send(system_url)
                answers[form] = (extra_answer.status or extra_answer.error, system_answer.status or system_answer.error)
                await client.close()
        add("TLS: system store + tls_ca_file", answers["SSL_CERT_FILE"] == answers["SSL_CERT_DIR"] == (200, 200)
            and refused_by_system.error == "certificate",
            f"CurlTransport(tls_ca_file=...) with the system store named by SSL_CERT_FILE (a file): the extra CA's "
            f"server / the system CA's {answers['SSL_CERT_FILE']}; by SSL_CERT_DIR (a hashed folder): "
            f"{answers['SSL_CERT_DIR']}; the real system store alone refuses the test CA ({refused_by_system.error}). "
            f"Both set, the real file and the folder: {answers['SSL_CERT_FILE=real + SSL_CERT_DIR']} (with "
            f"tls_ca_file the transport bundles the file with it and keeps the folder as CAPATH). The wheel's libcurl "
            f"({pycurl.version.split()[1]}) has {WHEEL_BUNDLE} built in (exists here: "
            f"{os.path.exists(WHEEL_BUNDLE)}): the transport sets CAINFO/CAPATH from ssl.get_default_verify_paths()")
        both = PycurlEndpoints(ca_file=ca_file, system_dir=system_dir)
    else:
        extra = PyreqwestEndpoints(ca_file=ca_file, system_dir=None)
        extra_ok = await extra.send(servers.url("tls"))
        await extra.close()
        none = PyreqwestEndpoints(ca_file=None, system_dir=None)
        untrusted = await none.send(servers.url("tls"))
        await none.close()
        system_server, extra_server = _pyreqwest_with_system_store(servers, system_ca, folder)
        add("TLS: system store + tls_ca_file", extra_ok.status == 200 and untrusted.error == "certificate"
            and system_server == "200" and extra_server == "200",
            f"add_root_certificate_pem(tls_ca_file): {extra_ok.status}; without it: {untrusted.error}; in a child "
            f"with SSL_CERT_FILE=<another CA> (how rustls-platform-verifier reads Linux's store) + the extra CA: "
            f"that CA's server {system_server}, the extra CA's {extra_server}")
        both = PyreqwestEndpoints(ca_file=ca_file, system_dir=None)
    stranger = await both.send(servers.url("stranger"))
    wrong_name = await both.send(servers.url("tls", host="127.0.0.1"))
    refused = await both.send(f"http://127.0.0.1:{_closed_port()}/x")
    add("certificate failure told apart", stranger.error == "certificate" and wrong_name.error == "certificate"
        and refused.error == "connection",
        f"unknown CA -> {stranger.detail[:120]!r}; wrong name -> {wrong_name.detail[:120]!r}; a refused "
        f"connection -> {refused.error}")

    # --- method, headers
    marks = []
    for method in ("POST", "PUT", "PATCH"):
        before = len(seen.requests)
        outcome = await both.send(servers.url("tls"), method, {"X-Api-Key": f"key-{method}",
                                                               "User-Agent": "prefect-webhooks/1.0",
                                                               "Content-Type": "application/json"}, b'{"a":1}')
        got = seen.requests[before:]
        marks.append(outcome.status == 200 and len(got) == 1 and got[0]["method"] == method
                     and got[0]["headers"].get("X-Api-Key") == f"key-{method}" and got[0]["body"] == 7
                     and got[0]["headers"].get("User-Agent") == "prefect-webhooks/1.0")
    add("method (POST/PUT/PATCH) + headers", all(marks), f"the server saw each method, its headers and body: {marks}")

    # --- HTTP/1.1 only (the server offers h2 by ALPN)
    last = seen.requests[-1]
    add("HTTP/1.1 only", last["alpn"] == "http/1.1" and last["version"] == "1.1",
        f"ALPN chosen {last['alpn']!r} (server offers h2, http/1.1), request HTTP/{last['version']}")

    # --- Retry-After
    retry = await both.send(servers.url("tls", "/retry"))
    add("Retry-After", retry.status == 429 and retry.retry_after == "7",
        f"429, Retry-After {retry.retry_after!r}, answer {retry.answer!r}")

    # --- bounded read of a huge answer
    if kind == "pycurl":
        from prefect_webhooks.delivery.sending.transport import READ_LIMIT

        # Delivery's limit (READ_LIMIT, the transport's default) and a 1 KB one (limit=).
        reads = [(both, READ_LIMIT), (PycurlEndpoints(ca_file=ca_file, system_dir=system_dir, limit=1024), 1024)]
    else:
        reads = [(both, 1024)]
    bounded, told = True, []
    for client, limit in reads:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        seen.big_written = 0
        huge = await client.send(servers.url("big", "/big"))
        await asyncio.sleep(0.3)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
        # libcurl hands the answer over in pieces of up to CURL_MAX_WRITE_SIZE (16 KiB): the transport stops at the
        # piece that passes its limit, and keeps it whole.
        bounded &= (huge.status == 200 and len(huge.answer) <= limit + (16384 if kind == "pycurl" else 0)
                    and seen.big_written < BIG // 10)
        told.append(f"limit {limit:,} B: status {huge.status}, kept {len(huge.answer):,} B in {huge.seconds:.2f} s; "
                    f"the server wrote {seen.big_written / 1e6:.1f} MB of 1,074 before the client closed; peak RSS "
                    f"+{grown / 1024:.0f} MB")
        if client is not both:
            await client.close()
    add("a bounded read of a 1 GB answer", bounded,
        ("CurlTransport.request(limit=...), READ_LIMIT by default: the write callback stops the transfer; "
         if kind == "pycurl" else "build_streamed + body_reader.read(1024): ") + "; ".join(told))
    await both.close()

    # --- client certificate per endpoint, PEM text, key under a password
    mtls = make(ca_file=ca_file, system_dir=system_dir)
    for name in ("client-a", "client-b"):
        chain, key = servers.client_pems(name)
        mtls.certificate(name, chain, key, KEY_PASSWORD)
    before = len(seen.requests)
    results = [await mtls.send(servers.url("mtls"), endpoint=name) for name in ("client-a", "client-b", "client-a")]
    without = await mtls.send(servers.url("mtls"))
    got = seen.requests[before:]
    names = [request["client"] for request in got]
    more, also = True, ""
    if kind == "pycurl":
        # An endpoint's own ca_bundle, on a transport without tls_ca_file.
        chain, key = servers.client_pems("client-a")
        own = PycurlEndpoints(ca_file=None, system_dir=system_dir)
        own.certificate("own-ca", chain, key, KEY_PASSWORD, ca_bundle=servers.ca.cert_pem.bytes())
        with_bundle = await own.send(servers.url("mtls"), endpoint="own-ca")
        not_trusted = await own.send(servers.url("tls"))
        await own.close()
        more = with_bundle.status == 200 and not_trusted.error == "certificate"
        also = (f"; ClientTls.ca_bundle on a transport without tls_ca_file: {with_bundle.status} (the same server "
                f"without it: {not_trusted.error})")
    how = "ClientTls(password=): KEYPASSWD" if kind == "pycurl" else "decrypted with cryptography first"
    add("client certificate per endpoint", more and [r.status for r in results] == [200] * 3 and names ==
        ["client-a", "client-b", "client-a"] and without.status is None and len(got) == 3,
        f"PEM text, key encrypted ({how}): server saw {names} on connections "
        f"{[request['connection'] for request in got]}; no certificate on the same host: {without.error} "
        f"({without.detail[:80]})" + also)
    if kind == "pycurl":
        # The sender fails a request as permanent when the endpoint's own certificate or key cannot be used
        # (TransportError.client_certificate_unusable): a retry would fail alike.
        chain, key = servers.client_pems("client-a")
        _, other_key = servers.client_pems("client-b")
        unusable = {"a wrong key password": (chain, key, b"not-the-password"),
                    "the key of another certificate": (chain, other_key, KEY_PASSWORD),
                    "a certificate that is not PEM": (b"not a certificate", key, KEY_PASSWORD)}
        errors = {}
        for case, (case_chain, case_key, password) in unusable.items():
            mtls.certificate(case, case_chain, case_key, password)
            outcome = await mtls.send(servers.url("mtls"), endpoint=case)
            errors[case] = f"{outcome.error} ({outcome.detail[:75]})"
        add("unusable client certificate told apart", all(e.startswith("client-certificate") for e in errors.values()),
            "client_certificate_unusable (E_SSL_CERTPROBLEM, or E_BAD_FUNCTION_ARGUMENT with a ClientTls): "
            + "; ".join(f"{case} -> {error}" for case, error in errors.items()))
    await mtls.close()

    # --- connect and total timeouts
    timing = make(ca_file=ca_file, system_dir=system_dir, connect_timeout=0.5, timeout=1.0)
    hang = await timing.send(f"http://127.0.0.1:{servers.ports['hang']}/x")
    slow = await timing.send(servers.url("tls", "/slow"))
    if kind == "pycurl":
        # Delivery's contract: one timeout over the whole request, connecting included (the old aiohttp sender's
        # ClientTimeout(total=) too); both end as TransportError.timed_out.
        add("timeouts (whole request)", hang.error == slow.error == "timeout" and 0.9 < hang.seconds < 1.5
            and 0.9 < slow.seconds < 1.5,
            f"timeout 1 s, connecting included: a connect that hangs -> {hang.error} after {hang.seconds:.2f} s; a "
            f"slow answer -> {slow.error} after {slow.seconds:.2f} s ({slow.detail[:100]}); no connect timeout of "
            "its own, and TransportError does not say whether a connection was made")
    else:
        add("connect + total timeouts, told apart", hang.error == "connect-timeout" and slow.error == "timeout"
            and 0.4 < hang.seconds < 0.9 and 0.9 < slow.seconds < 1.5,
            f"connect 0.5 s: {hang.error} after {hang.seconds:.2f} s; total 1 s: {slow.error} after "
            f"{slow.seconds:.2f} s ({slow.detail[:120]})")
    await timing.close()

    # --- keep-alive under a per-endpoint concurrency limit
    limited = make(ca_file=ca_file, system_dir=system_dir, concurrency=4)
    before, seen.most_in_flight = len(seen.requests), 0
    url = servers.url("plain", "/echo?delay=0.05")
    first = await asyncio.gather(*(limited.send(url) for _ in range(40)))
    second = await asyncio.gather(*(limited.send(url) for _ in range(40)))
    got = seen.requests[before:]
    first_connections = {request["connection"] for request in got[:40]}
    all_connections = {request["connection"] for request in got}
    add("keep-alive, per-endpoint limit", all(o.status == 200 for o in first + second) and len(got) == 80
        and seen.most_in_flight <= 4 and len(all_connections) <= 4 and all_connections == first_connections,
        f"limit 4, 2 x 40 requests: at most {seen.most_in_flight} in flight, {len(all_connections)} connections "
        f"({LIMITS[kind]})")
    await limited.close()

    # --- the private-network guard at connect time
    guarded = make(ca_file=ca_file, system_dir=system_dir, guard=True,
                   resolve=[f"public.example:{servers.ports['plain']}:127.0.0.1"] if kind == "pycurl"
                   else ["public.example:127.0.0.1"])
    before = len(seen.requests)
    by_name = await guarded.send(servers.url("plain", host="localhost"))
    literal = await guarded.send(servers.url("plain", host="127.0.0.1"))
    rebound = await guarded.send(servers.url("plain", host="public.example"))
    reached = len(seen.requests) - before
    open_client = make(ca_file=ca_file, system_dir=system_dir, guard=False)
    allowed = await open_client.send(servers.url("plain", host="localhost"))
    await open_client.close()
    add("private-network guard at connect", all(o.error == "refused-by-guard" for o in (by_name, literal, rebound))
        and reached == 0 and allowed.status == 200,
        ("block_private_networks: OPENSOCKETFUNCTION sees the address about to be connected (after resolution, "
         "CURLOPT_RESOLVE pins included), refuses it, TransportError.blocked names it" if kind == "pycurl" else
         "no resolver hook: resolve in Python, check, pin the endpoint's client to the checked addresses "
         "(ClientBuilder.resolve); re-resolving means a new client") +
        f": localhost, 127.0.0.1 and public.example->127.0.0.1 refused ({by_name.detail[:70]!r}), the server got "
        f"{reached} requests; unguarded: {allowed.status}")
    await guarded.close()
    return lines


@contextlib.asynccontextmanager
async def _served_by(ca: Any) -> AsyncIterator[str]:
    """The URL of a server on loopback whose certificate ``ca`` issued."""
    from aiohttp import web

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/echo", ok)
    runner = web.AppRunner(app, access_log=None)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"https://localhost:{port}/echo"
    finally:
        await runner.cleanup()


SYSTEM_STORE_CHILD = """
import asyncio, ssl, sys
from datetime import timedelta
from aiohttp import web
from pyreqwest.client import ClientBuilder
import trustme

async def main():
    extra_pem = open(sys.argv[1], "rb").read()
    ports = []
    runner = None
    async def ok(request):
        return web.Response(text="ok")
    app = web.Application()
    app.router.add_route("*", "/echo", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    for cert, key in ((sys.argv[2], sys.argv[3]), (sys.argv[4], sys.argv[5])):
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])
    client = ClientBuilder().add_root_certificate_pem(extra_pem).timeout(timedelta(seconds=5)).build()
    answers = []
    for port in ports:
        try:
            answers.append(str((await client.get(f"https://localhost:{port}/echo").build().send()).status))
        except Exception as exc:
            answers.append(type(exc).__name__)
    print(" ".join(answers))
    await runner.cleanup()

asyncio.run(main())
"""


def _pyreqwest_with_system_store(servers: Servers, system_ca: Any, folder: Path) -> tuple[str, str]:
    """In a child with SSL_CERT_FILE naming ``system_ca`` (the platform store as rustls-platform-verifier reads it
    on Linux), a pyreqwest client with the extra CA added: the answers of a server of each CA."""
    files = []
    for name, ca in (("system", system_ca), ("extra", servers.ca)):
        issued = ca.issue_cert("localhost", "127.0.0.1")
        cert, key = folder / f"{name}-server.pem", folder / f"{name}-server.key"
        issued.cert_chain_pems[0].write_to_path(str(cert))
        issued.private_key_pem.write_to_path(str(key))
        files += [str(cert), str(key)]
    system_pem = folder / "system-ca.pem"
    system_ca.cert_pem.write_to_path(str(system_pem))
    env = {**os.environ, "SSL_CERT_FILE": str(system_pem)}
    env.pop("SSL_CERT_DIR", None)
    done = subprocess.run([sys.executable, "-c", SYSTEM_STORE_CHILD, str(servers.ca_file), *files],
                          capture_output=True, text=True, timeout=60, env=env)
    words = (done.stdout.split() + ["failed", "failed"])[:2] if done.returncode == 0 else ["failed", "failed"]
    return words[0], words[1]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", nargs="+", choices=sorted(CLIENTS), default=list(CLIENTS))
    args = parser.parse_args()
    failed = []
    with tempfile.TemporaryDirectory() as folder, Servers(Path(folder)) as servers:
        for kind in args.clients:
            print(f"{kind}:", flush=True)
            lines = asyncio.run(check(kind, servers, Path(folder)))
            failed += [f"{kind}: {feature}" for feature, yes, _ in lines if not yes]
    print(f"feature matrix: {len(args.clients)} clients checked; missing: {', '.join(failed) or 'none'}")


if __name__ == "__main__":
    main()
