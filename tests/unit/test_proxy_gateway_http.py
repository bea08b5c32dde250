"""The proxy gateway's HTTP side without Ray: routes by key, streams a worker's answer through, and passes
nothing but the Messages API (tests/integration/test_proxy_gateway.py runs it on a three-node Ray cluster)."""

from __future__ import annotations

import http.client
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sweflow.train.proxy_gateway import MAX_BODY_BYTES, Gateway

KEY = "k" * 32


class Worker:
    """A worker proxy stand-in: echoes the path and auth it got, as SSE chunks without a length."""

    def __init__(self) -> None:
        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for part in (self.path, self.headers.get("Authorization", ""), body.decode()):
                    self.wfile.write(f"data: {part}\n\n".encode())
                    self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def gateway():
    g = Gateway("127.0.0.1", 0).start()
    yield g
    g.stop()


def post(port: int, path: str, body: bytes = b"{}", headers: dict | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_a_registered_route_reaches_its_worker_streamed(gateway):
    worker = Worker()
    gateway.register(KEY, worker.url)
    status, body = post(
        gateway.port, f"/w/{KEY}/v1/messages?beta=true", b'{"x":1}', {"Authorization": "Bearer t"}
    )
    assert status == 200
    assert body.decode().split("\n\n")[:3] == [
        "data: /v1/messages?beta=true", "data: Bearer t", 'data: {"x":1}',
    ]  # fmt: skip


def test_only_the_messages_api_of_a_known_route_passes(gateway):
    gateway.register(KEY, Worker().url)
    for path in (
        f"/w/{KEY}/session/create",
        f"/w/{KEY}/pause",
        "/w/" + "x" * 32 + "/v1/messages",
        "/v1/messages",
    ):
        assert post(gateway.port, path)[0] == 404, path
    with pytest.raises(ValueError):
        gateway.register("short", "http://127.0.0.1:1")
    with pytest.raises(ValueError):
        gateway.register(KEY, "file:///etc/passwd")


def test_oversized_unsized_and_unreachable_requests_are_answered_not_forwarded(gateway):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    gateway.register(KEY, f"http://127.0.0.1:{dead}")
    assert post(gateway.port, f"/w/{KEY}/v1/messages")[0] == 502
    for length, status in ((MAX_BODY_BYTES + 1, 413), (None, 411)):  # refused before a body byte is read
        conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
        conn.putrequest("POST", f"/w/{KEY}/v1/messages")
        if length is not None:
            conn.putheader("Content-Length", str(length))
        conn.endheaders()
        assert conn.getresponse().status == status
