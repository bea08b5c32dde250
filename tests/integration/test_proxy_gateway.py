"""One proxy endpoint per verl run on a real multi-node Ray cluster (one machine, three Ray nodes): rollout
workers on two worker nodes start their proxies with `start_worker_proxy`, the gateway lands on the head
node at the declared port, and every sandbox-side call goes through that one address to the worker that
owns its session, streamed; nothing but the Messages API is reachable through it."""

from __future__ import annotations

import json
import socket
import sys

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from sweflow.train.proxy_gateway import ACTOR_NAME, NAMESPACE  # noqa: E402
from sweflow.train.proxy_settings import ProxySettings  # noqa: E402
from tests.fixtures.tiny_model import tiny_tokenizer_path  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RolloutWorker:
    """What one verl agent-loop worker does at its first sample: its engine, its proxy, published."""

    def __init__(self, name: str, tokenizer_path: str, settings: dict) -> None:
        from transformers import AutoTokenizer

        from sweflow.offline.scripted_engine import ScriptedEngine
        from sweflow.proxy.server import ProxyConfig
        from sweflow.train.proxy_gateway import start_worker_proxy

        tok = AutoTokenizer.from_pretrained(tokenizer_path)
        engine = ScriptedEngine(lambda ids: f"answer from {name}", tok)
        self.proxy, self.local, self.router = start_worker_proxy(
            engine, tok, ProxyConfig(token_build_model="generic"), ProxySettings(**settings)
        )

    def session(self, session_id: str) -> dict:
        admin = {"Authorization": f"Bearer {self.proxy.admin_token}"}
        made = httpx.post(self.local + "/session/create", json={"session_id": session_id}, headers=admin)
        return {
            "router": self.router,
            "local": self.local,
            "token": made.json()["token"],
            "node": ray.get_runtime_context().get_node_id(),
        }


@pytest.fixture(scope="module")
def cluster():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for name in ("w1", "w2"):
        c.add_node(num_cpus=1, resources={name: 1})
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="ERROR")
    yield c
    ray.shutdown()
    c.shutdown()


def messages(url: str, token: str, *, stream: bool) -> httpx.Response:
    body = {"model": "m", "max_tokens": 32, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(
        url + "/v1/messages?beta=true", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def test_every_worker_is_reached_through_one_head_node_endpoint(cluster):
    port = free_port()
    public = f"http://127.0.0.1:{port}"
    settings = {
        "host": "0.0.0.0",
        "port": port,
        "public_url": public,
        "build_mode": "tito",
        "build_model": "generic",
    }
    workers = {
        name: ray.remote(num_cpus=0, resources={name: 1})(RolloutWorker).remote(
            name, tiny_tokenizer_path(), settings
        )
        for name in ("w1", "w2")
    }
    sessions = {name: ray.get(w.session.remote(f"s-{name}")) for name, w in workers.items()}

    # placement: the gateway on the head node, the workers on their own nodes
    head = next(n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n["Resources"])
    where = ray.get(ray.get_actor(ACTOR_NAME, namespace=NAMESPACE).where.remote())
    assert where["node_id"] == head and where["port"] == port and where["routes"] == 2
    assert len({s["node"] for s in sessions.values()} | {head}) == 3

    # one endpoint: every router URL is the public URL plus a route, no per-worker port
    for s in sessions.values():
        assert s["router"].startswith(public + "/w/") and s["local"].rsplit(":", 1)[1] != str(port)

    for name, s in sessions.items():
        plain = messages(s["router"], s["token"], stream=False)
        assert plain.status_code == 200, plain.text
        assert json.loads(plain.text)["content"][0]["text"] == f"answer from {name}"
        streamed = messages(s["router"], s["token"], stream=True)
        assert streamed.status_code == 200 and "text/event-stream" in streamed.headers["content-type"]
        assert f"answer from {name}" in "".join(
            json.loads(line[5:]).get("delta", {}).get("text", "")
            for line in streamed.text.splitlines()
            if line.startswith("data:")
        )

    # a session's token opens its own worker only; nothing but the Messages API passes the gateway
    w1, w2 = sessions["w1"], sessions["w2"]
    assert messages(w2["router"], w1["token"], stream=False).status_code == 401
    assert messages(public + "/w/" + "x" * 32, w1["token"], stream=False).status_code == 404
    route = w1["router"]
    for path in ("/session/create", "/session/s-w1/trajectory", "/pause", "/v1/models"):
        assert httpx.post(route + path, json={"session_id": "evil"}, timeout=10).status_code == 404
        assert httpx.get(route + path, timeout=10).status_code == 404
    assert httpx.get(public + "/", timeout=10).status_code == 404
