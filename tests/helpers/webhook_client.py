"""The tests' one way to send an AdmissionReview to a webhook over TLS, as the API server does."""

from __future__ import annotations

import socket
import ssl
import time


def post_review(
    port: int, body: bytes, ca: bytes, source: str | None = None, timeout: float = 30, host: str = "127.0.0.1"
) -> tuple[int, bytes, float]:
    """(HTTP status, response body, seconds from the first byte sent to the last read) for one
    POST /mutate to the webhook on `host` (loopback by default) and `port`, from the address
    `source` when given."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    ctx.check_hostname = False
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.settimeout(timeout)
    if source is not None:
        raw.setsockopt(socket.IPPROTO_IP, 24, 1)  # IP_BIND_ADDRESS_NO_PORT: the port is picked at connect
        raw.bind((source, 0))
    started = time.monotonic()
    raw.connect((host, port))
    with raw, ctx.wrap_socket(raw) as tls:
        tls.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, _, answer = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), answer, time.monotonic() - started
