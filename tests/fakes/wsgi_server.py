"""A small threaded HTTP/1.1 server that runs a WSGI app on 127.0.0.1 and streams its answers.

wsgiref's server is single-threaded, speaks HTTP/1.0 and cannot decode chunked request bodies; the
e2b SDK (pyqwest) keeps connections alive and the envd fake must stream process events while other
requests (kill, signal, file reads) arrive. So: one thread per connection, the request body read
whole (Content-Length or chunked), the answer written chunk by chunk with chunked encoding.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _read_chunked(rfile: Any) -> bytes:
    out = bytearray()
    while True:
        line = rfile.readline(65537)
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            # trailers (usually none) end with an empty line
            while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                pass
            return bytes(out)
        out += rfile.read(size)
        rfile.readline(65537)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.server.verbose:
            sys.stderr.write("fake-http: " + (format % args) + "\n")

    def _handle(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = _read_chunked(self.rfile)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path, _, query = self.path.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": self.command,
            "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_LENGTH": str(len(body)),
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": str(self.server.server_address[1]),
            "SERVER_PROTOCOL": self.request_version,
            "REMOTE_ADDR": self.client_address[0],
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        if self.headers.get("Content-Type"):
            environ["CONTENT_TYPE"] = self.headers["Content-Type"]
        for key, value in self.headers.items():
            name = "HTTP_" + key.upper().replace("-", "_")
            if name not in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"):
                environ[name] = value

        status_headers: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            status_headers[:] = [status, headers]
            return lambda data: None

        result = self.server.app(environ, start_response)
        try:
            it = iter(result)
            first = next(it, None)  # apps may call start_response lazily
            status, headers = status_headers
            code = int(status.split()[0])
            self.send_response(code, status.partition(" ")[2])
            for k, v in headers:
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(k, v)
            if code in (204, 304) or self.command == "HEAD":
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            chunk = first
            while chunk is not None:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                chunk = next(it, None)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, app: WSGIApp, verbose: bool = False) -> None:
        self.app = app
        self.verbose = verbose
        super().__init__(("127.0.0.1", 0), _Handler)


class WSGIServer:
    """Serve `app` on 127.0.0.1 on a free port in a daemon thread; `url` is its base URL."""

    def __init__(self, app: WSGIApp, *, verbose: bool = False) -> None:
        self._server = _Server(app, verbose)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="fake-http"
        )

    def start(self) -> WSGIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
