"""One proxy endpoint per verl run: a gateway on the Ray head node, at the declared port, in front of every
rollout worker's own token-recording proxy.

`start_worker_proxy` (each worker) publishes its proxy through `publish`; `Gateway` forwards Messages calls.
"""

# verl places its agent-loop workers round-robin over all nodes, and each holds a proxy (its engine is that
# worker's server manager). Cloud sandboxes (E2B) cannot reach compute nodes on arbitrary ports, so, as in the
# recipe (one proxy on the head node at a fixed port, one URL), sandboxes reach ONE address:
# `train.proxy.public_url` -> the head node's `train.proxy.host:port`. Each worker registers its proxy with
# the gateway under a random route key and hands its sandboxes `<public_url>/w/<key>`; the gateway forwards
# the Anthropic Messages calls (and nothing else: sessions, trajectories and the admin API stay on the
# worker's own address, inside the cluster) to that worker, streaming the answer back.
# Registration goes through Ray (a named actor pinned to the head node), so it needs no credential of its
# own; a Messages call is still authenticated by the worker's proxy with the session's bearer token.

from __future__ import annotations

import http.client
import logging
import re
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("sweflow.train.gateway")

ACTOR_NAME = "sweflow-proxy-gateway"
NAMESPACE = "sweflow"  # one Ray cluster per run (the launch script starts it), so one gateway per namespace
HEAD_RESOURCE = "node:__internal_head__"  # the resource Ray gives its head node only
MAX_BODY_BYTES = 8 << 20  # the proxy's own limit (ProxyConfig.max_body_bytes)
CLIENT_TIMEOUT = 120.0  # the public side: seconds a request (headers, body) may take to arrive
UPSTREAM_TIMEOUT = 3600.0  # one generation may stream for minutes; a hung worker must not hold a thread
_ROUTE = re.compile(r"^/w/([A-Za-z0-9_-]{16,64})(/v1/messages(?:/count_tokens)?)(\?[^#]*)?$")
_HELD: list[Any] = []  # this process's handle to the gateway actor, for the process's lifetime
_FORWARD_HEADERS = ("authorization", "x-api-key", "content-type", "accept", "user-agent")
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class Gateway:
    """The HTTP side: `start()` listens on (host, port); `register(key, upstream)` adds a route."""

    def __init__(self, host: str, port: int) -> None:
        self.routes: dict[str, str] = {}
        self._lock = threading.Lock()
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = CLIENT_TIMEOUT  # a client that stalls mid-request does not hold its thread for long

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                gateway.forward(self)

            def do_GET(self) -> None:  # noqa: N802
                self._refuse()

            do_PUT = do_DELETE = do_PATCH = do_HEAD = do_GET  # noqa: N815

            def _refuse(self) -> None:
                gateway.reply(self, 404, b'{"type":"error","error":{"type":"not_found_error"}}')

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("gateway: " + fmt, *args)

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> Gateway:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="sweflow-gateway", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def register(self, key: str, upstream: str) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]{16,64}", key):
            raise ValueError("a route key is 16-64 characters of [A-Za-z0-9_-]")
        if urlsplit(upstream).scheme != "http" or not urlsplit(upstream).hostname:
            raise ValueError(f"a worker proxy is an http://host:port address, not {upstream!r}")
        with self._lock:
            self.routes[key] = upstream.rstrip("/")

    @staticmethod
    def reply(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def forward(self, h: BaseHTTPRequestHandler) -> None:
        """A Messages call for a registered worker, streamed through; anything else 404 / 413 / 502."""
        m = _ROUTE.match(h.path)
        with self._lock:
            upstream = self.routes.get(m.group(1)) if m else None
        if upstream is None:
            return self.reply(h, 404, b'{"type":"error","error":{"type":"not_found_error"}}')
        try:
            length = int(h.headers.get("Content-Length") or "-1")
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            h.close_connection = True
            return self.reply(
                h, 413 if length > 0 else 411, b'{"type":"error","error":{"type":"request_size"}}'
            )
        body = h.rfile.read(length)
        target = urlsplit(upstream)
        headers = {k: v for k in _FORWARD_HEADERS if (v := h.headers.get(k)) is not None}
        headers.update({k: v for k, v in h.headers.items() if k.lower().startswith("anthropic-")})
        conn = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=UPSTREAM_TIMEOUT)
        try:
            conn.request("POST", m.group(2) + (m.group(3) or ""), body=body, headers=headers)
            resp = conn.getresponse()
        except OSError as exc:
            conn.close()
            log.warning("gateway: worker %s did not answer: %s", upstream, exc)
            return self.reply(h, 502, b'{"type":"error","error":{"type":"api_error"}}')
        try:
            self._relay(h, resp)
        finally:
            conn.close()

    @staticmethod
    def _relay(h: BaseHTTPRequestHandler, resp: http.client.HTTPResponse) -> None:
        """The worker's answer, header by header; a body without a length goes on chunk by chunk (SSE)."""
        h.send_response(resp.status)
        length = resp.getheader("Content-Length")
        for k, v in resp.getheaders():
            if k.lower() not in _HOP and k.lower() != "content-length":
                h.send_header(k, v)
        if length is not None:
            h.send_header("Content-Length", length)
            h.end_headers()
            h.wfile.write(resp.read())
            return
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        while chunk := resp.read1(65536):
            h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            h.wfile.flush()
        h.wfile.write(b"0\r\n\r\n")


class GatewayActor:
    """The Ray actor around `Gateway` (created by `publish`, pinned to the head node)."""

    def __init__(self, host: str, port: int) -> None:
        import ray

        self.gateway = Gateway(host, port).start()
        self.node_id = ray.get_runtime_context().get_node_id()
        log.info("sweflow proxy gateway on %s:%d (node %s)", host, self.gateway.port, self.node_id)

    def register(self, key: str, upstream: str) -> None:
        self.gateway.register(key, upstream)

    def where(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "port": self.gateway.port, "routes": len(self.gateway.routes)}


def head_node_id() -> str:
    """The Ray head node's id (the node that holds Ray's head resource)."""
    import ray

    for node in ray.nodes():
        if node.get("Alive") and HEAD_RESOURCE in (node.get("Resources") or {}):
            return str(node["NodeID"])
    raise RuntimeError("no live Ray head node: the proxy gateway runs on the head node")


def gateway_actor(host: str, port: int) -> Any:
    """The run's gateway actor: created on the head node by the first worker, found by the others."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_concurrency=64)(GatewayActor)
    return remote.options(
        name=ACTOR_NAME,
        namespace=NAMESPACE,
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=head_node_id(), soft=False),
    ).remote(host, port)


def publish(local_url: str, *, host: str, port: int, public_url: str) -> str:
    """Register this worker's proxy (`local_url`, reachable from the head node) with the run's gateway;
    the URL its sandboxes use: `<public_url>/w/<key>`."""
    import ray

    if not port:
        raise ValueError("the proxy gateway needs a declared port (train.proxy.port), not 0")
    key = secrets.token_urlsafe(24)
    gateway = gateway_actor(host, port)
    ray.get(gateway.register.remote(key, local_url))
    _HELD.append(gateway)  # Ray ends a non-detached actor once no process holds a handle to it
    return f"{public_url.rstrip('/')}/w/{key}"


def start_worker_proxy(
    engine: Any, tokenizer: Any, config: Any, settings: Any
) -> tuple[Any, str, str | None]:
    """A rollout worker's proxy: (the started ProxyServer, its address for this process, the URL its
    sandboxes use or None).

    With `settings.public_url` (cloud sandboxes) the proxy listens on this node's cluster address at a free
    port and is published through the gateway at `settings.host:settings.port` on the head node; without
    it, on `settings.host:settings.port` as before (local and Docker sandboxes get a route to it).
    """
    from ..proxy.server import ProxyServer

    if not settings.public_url:
        proxy = ProxyServer(engine, tokenizer, config, host=settings.host, port=settings.port).start()
        port = proxy._httpd.server_address[1]
        local = f"http://127.0.0.1:{port}" if settings.host in ("0.0.0.0", "::", "") else proxy.url
        return proxy, local, None
    import ray

    node_ip = ray.util.get_node_ip_address()
    proxy = ProxyServer(engine, tokenizer, config, host=node_ip, port=0).start()
    local = f"http://{node_ip}:{proxy._httpd.server_address[1]}"
    try:
        router_url = publish(local, host=settings.host, port=settings.port, public_url=settings.public_url)
    except BaseException:
        proxy.stop()
        raise
    return proxy, local, router_url
