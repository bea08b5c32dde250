"""From inside a real agent sandbox, the proxy is the one thing reachable, and it gives the agent nothing
beyond its own session: its admin API and other sessions answer 401/403 (Docker and local providers)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sweflow.offline.scripted_engine import ScriptedEngine
from sweflow.proxy.server import ProxyConfig, ProxyServer

# Without a root conftest, pytest's default import mode puts only this folder on sys.path.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

# The two backends' module fixtures: real templates (blackbox server and runtime) from the sample repo.
from tests.integration.test_sandbox_docker import env  # noqa: E402, F401
from tests.integration.test_sandbox_local import local  # noqa: E402, F401
from tests.unit.conftest_proxy import tiny_tokenizer  # noqa: E402

pytestmark = [pytest.mark.integration]

# Runs inside the sandbox with the image's python3: one JSON line of {probe: HTTP status or error}.
PROBE = r"""
import json, sys, urllib.request, urllib.error
base, own, other_sid = sys.argv[1], sys.argv[2], sys.argv[3]
def call(path, body=None, token=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="POST" if data is not None else "GET")
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return type(e).__name__
msg = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
out = {
    "health": call("/health"),
    "create": call("/session/create", {"session_id": "agent-made"}),
    "create_own_token": call("/session/create", {"session_id": "agent-made"}, own),
    "read_other": call("/trajectory/read", {"session_id": other_sid}, own),
    "delete_other": call("/session/delete", {"session_id": other_sid}, own),
    "pause": call("/pause", {}, own),
    "resume": call("/resume", {"weight_version": 99}, own),
    "messages_no_token": call("/v1/messages", msg),
    "messages_sid_as_token": call("/v1/messages", msg, other_sid),
    "other_path_own_token": call("/sessions/%s/v1/messages" % other_sid, msg, own),
    "messages_own": call("/v1/messages", msg, own),
}
print(json.dumps(out))
"""


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def world(request):
    """(provider, template) of an agent sandbox for each backend."""
    if request.param == "local":
        provider, template, _ = request.getfixturevalue("local")
        return provider, template
    e = request.getfixturevalue("env")
    return e["host"], e["template"]


def test_agent_reaches_only_its_own_session(world):
    provider, template = world
    tok = tiny_tokenizer()
    with ProxyServer(ScriptedEngine(["ok"], tok, cycle=True), tok, ProxyConfig()) as proxy:
        own = proxy.create_session("rollout-a:0:aaaa")["token"]
        proxy.create_session("rollout-b:0:bbbb")
        port = proxy.url.rsplit(":", 1)[1]
        with provider.create(template, timeout=300, egress=f"127.0.0.1:{port}") as sb:
            assert sb.egress_url, "a sandbox created with egress says where the proxy is"
            sb.write_file("/tmp/probe.py", PROBE)
            r = sb.run(f"python3 /tmp/probe.py {sb.egress_url} {own} rollout-b:0:bbbb", timeout=120)
            assert r.exit_code == 0, r.stderr[-1500:]
            got = json.loads(r.stdout.strip().splitlines()[-1])
        before = proxy.read_trajectory("rollout-b:0:bbbb")
    assert got["health"] == 200 and got["messages_own"] == 200, got
    for probe in ("create", "create_own_token", "read_other", "delete_other", "pause", "resume"):
        assert got[probe] == 401, (probe, got)
    assert got["messages_no_token"] == 401 and got["messages_sid_as_token"] == 401, got
    assert got["other_path_own_token"] == 403, got
    assert before["turns"] == [] and not proxy._paused, "nothing the agent sent changed another session"


HIJACK = r"""
import os, socket
out = {}
for name in ("blackbox.sock", "egress.sock"):
    path = "/run/sweflow/" + name
    try:
        os.unlink(path)
        out[name] = "unlinked"
    except OSError as e:
        out[name] = type(e).__name__
try:
    s = socket.socket(socket.AF_UNIX)
    s.bind("/run/sweflow/fake.sock")
    out["bind"] = "bound"
except OSError as e:
    out["bind"] = type(e).__name__
print(out)
"""


def test_agent_cannot_take_over_its_blackbox_route(world):
    """Replacing the socket the host reaches the blackbox server through would hand the agent the host's
    calls (and the blackbox token): the socket folder is read-only to sandbox processes."""
    import urllib.request

    provider, template = world
    with provider.create(template, timeout=300) as sb:
        sb.write_file("/tmp/hijack.py", HIJACK)
        r = sb.run("python3 /tmp/hijack.py", timeout=60)
        assert "unlinked" not in r.stdout and "bound" not in r.stdout, r.stdout + r.stderr
        req = urllib.request.Request(
            sb.port_url(31000) + "/v1/status", headers={"Authorization": f"Bearer {sb.blackbox_token}"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200, "the host still reaches the real server"
