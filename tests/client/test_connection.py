"""The client's HTTP connection to the ingest API (the rest of the HTTP behaviour is in test_analytics.py)."""

from __future__ import annotations

import base64
import socket
import threading
import time

from prefect_webhooks.client.connection import BatchPoster, basic_auth, batch_url


def test_batch_url_and_basic_auth() -> None:
    assert batch_url("http://h:1/") == "http://h:1/v1/batch"
    assert batch_url("http://h:1/v1/batch") == "http://h:1/v1/batch"
    assert base64.b64decode(basic_auth("wk_1").removeprefix("Basic ")) == b"wk_1:"


def _one_request_per_connection_server(answered: list[int]) -> tuple[socket.socket, threading.Thread]:
    """A server that answers each connection's first request as keep-alive, then closes the connection."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += connection.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(body) < length:
                    body += connection.recv(65536)
                answered.append(length)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_a_kept_alive_connection_the_server_closed_is_replaced_in_the_same_post() -> None:
    answered: list[int] = []
    listener, _ = _one_request_per_connection_server(answered)
    poster = BatchPoster(f"http://127.0.0.1:{listener.getsockname()[1]}/v1/batch", {}, 5.0, False)
    try:
        for _ in range(3):
            time.sleep(0.05)  # the server has closed the previous connection by now
            assert poster.post(b'{"batch":[]}').status == 200
    finally:
        poster.close()
        listener.close()
    assert answered == [12, 12, 12]
