"""Attacks a hostile agent can mount on the blackbox server and the proxy, and what they must get.

Blackbox: without the sandbox's own token nothing but /health answers (401), even /v1/status tells a
stranger no session id, a neighbour sandbox's token runs nothing, bad Content-Lengths are refused at once.
Proxy: admin endpoints need the admin token, a session's token reaches only that session (the session id
is no credential), a 10 MB request is refused without stalling other sessions, deep JSON is a 400.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from sweflow.blackbox import BlackboxServer
from sweflow.offline.scripted_engine import ScriptedEngine
from sweflow.proxy import ProxyConfig, ProxyServer
from sweflow.proxy import __main__ as proxy_cli
from sweflow.rollout import BlackboxClient, HttpStatusError

try:
    from tests.unit.conftest_proxy import tiny_tokenizer
except ModuleNotFoundError:  # default import mode: tests/unit itself is on sys.path
    from conftest_proxy import tiny_tokenizer  # type: ignore[no-redef]

TOKEN = "sandbox-a-secret-0123456789abcdef"
OTHER = "sandbox-b-secret-fedcba9876543210"
SID = "victim-session:0:abcd1234"


# ---------------------------------------------------------------------------------------------- helpers
def raw_request(url: str, head: str, body: bytes = b"", *, half_close: bool = False, timeout: float = 5):
    """Send raw bytes; return (status, answer bytes, seconds until the answer came)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        t0 = time.monotonic()
        sock.sendall(head.encode() + b"\r\n" + body)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        elapsed = time.monotonic() - t0
        head_part, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head_part.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    status = int(head_part.split(b" ")[1]) if head_part else 0
    return status, rest, elapsed


def bb_call(url: str, method: str, path: str, body: object = None, token: str | None = TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = httpx.request(method, url + path, json=body, headers=headers, timeout=30)
    return resp.status_code, resp.text


@pytest.fixture()
def bb(tmp_path: Path):
    """A blackbox server holding one registered session; yields (url, workdir)."""
    workdir = tmp_path / "testbed"
    workdir.mkdir()
    with BlackboxServer(runtime_dir=str(tmp_path / "rt"), token=TOKEN, read_timeout=1.0) as server:
        register = {
            "agent_type": "claude_code",
            "session_id": SID,
            "router_url": "http://127.0.0.1:9",
            "router_token": "proxy-token",
            "backend_options": {"working_directory": str(workdir)},
        }
        assert bb_call(server.url, "POST", "/v1/rollout/register", register)[0] == 200
        yield server.url, workdir


ROUTES = [
    ("GET", "/v1/status"),
    ("POST", "/v1/rollout/register"),
    ("GET", f"/v1/sessions/{SID}"),
    ("POST", f"/v1/sessions/{SID}/messages"),
    ("POST", f"/v1/sessions/{SID}/execute_cmd"),
    ("POST", f"/v1/sessions/{SID}/abort"),
    ("POST", f"/v1/sessions/{SID}/close"),
    ("DELETE", f"/v1/sessions/{SID}"),
    ("GET", "/v1/no-such-route"),
]


# ---------------------------------------------------------------------------------------------- blackbox
@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("token", [None, "wrong", OTHER, "", f"{TOKEN}x"])
def test_blackbox_refuses_every_route_but_health_without_its_token(bb, method, path, token):
    url, _ = bb
    body = {"content": "hi", "cmd": "echo pwned"} if method == "POST" else None
    status, text = bb_call(url, method, path, body, token=token)
    assert status == 401, text
    assert SID not in text and "victim" not in text
    assert bb_call(url, "GET", "/health", token=token)[0] == 200
    # the session is untouched: still registered and idle
    status, text = bb_call(url, "GET", f"/v1/sessions/{SID}?events=0")
    assert status == 200 and json.loads(text)["state"] == "idle"


def test_blackbox_status_tells_a_stranger_nothing(bb):
    url, _ = bb
    status, text = bb_call(url, "GET", "/v1/status", token=None)
    assert status == 401 and SID not in text and "session" not in json.loads(text)
    status, text = bb_call(url, "GET", "/v1/status")
    assert status == 200 and SID in text


def test_neighbour_token_cannot_write_into_this_sandbox(bb, tmp_path):
    url, workdir = bb
    target = workdir / "pwned"
    with BlackboxServer(runtime_dir=str(tmp_path / "rt-b"), token=OTHER) as neighbour:
        cmd = {"cmd": f"echo owned > {target}", "timeout": 5}
        status, _ = bb_call(url, "POST", f"/v1/sessions/{SID}/execute_cmd", cmd, token=OTHER)
        assert status == 401
        # the client used by the dispatcher, pointed at the wrong sandbox with its own token
        with pytest.raises(HttpStatusError) as err:
            BlackboxClient(url, token=OTHER).execute_cmd(SID, cmd["cmd"], timeout=5)
        assert err.value.status == 401
        assert neighbour.url != url
    time.sleep(0.2)
    assert not target.exists()
    out = BlackboxClient(url, token=TOKEN).execute_cmd(SID, "echo ok", timeout=5)
    assert out["returncode"] == 0 and out["stdout"] == "ok\n"


def test_no_token_anywhere_fails_closed_with_503(tmp_path, monkeypatch):
    monkeypatch.delenv("SWEFLOW_BLACKBOX_TOKEN", raising=False)
    monkeypatch.delenv("SWEFLOW_BLACKBOX_TOKEN_FILE", raising=False)
    token_file = tmp_path / "run" / "blackbox.token"
    with BlackboxServer(runtime_dir=str(tmp_path / "rt"), token_file=str(token_file)) as server:
        health = httpx.get(server.url + "/health").json()
        assert health["healthy"] is True and health["token_configured"] is False
        for token in (None, "anything"):
            status, text = bb_call(server.url, "GET", "/v1/status", token=token)
            assert status == 503 and "token" in json.loads(text)["error"]["message"]
        # E2B writes the file after the server started: it is picked up on the next request
        token_file.parent.mkdir()
        token_file.write_text(TOKEN + "\n")
        assert bb_call(server.url, "GET", "/v1/status", token="anything")[0] == 401
        assert bb_call(server.url, "GET", "/v1/status")[0] == 200


def test_env_token_is_removed_and_never_reaches_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("SWEFLOW_BLACKBOX_TOKEN", TOKEN)
    monkeypatch.setenv("SWEFLOW_BLACKBOX_TOKEN_FILE", str(tmp_path / "unused"))
    workdir = tmp_path / "w"
    workdir.mkdir()
    with BlackboxServer(runtime_dir=str(tmp_path / "rt")) as server:
        assert "SWEFLOW_BLACKBOX_TOKEN" not in os.environ
        assert "SWEFLOW_BLACKBOX_TOKEN_FILE" not in os.environ
        os.environ["SWEFLOW_BLACKBOX_TOKEN_LEAK"] = "set-later"  # whatever lands in the env later
        try:
            client = BlackboxClient(server.url, token=TOKEN)
            client.register(
                {
                    "agent_type": "claude_code",
                    "session_id": "s",
                    "router_url": "http://127.0.0.1:9",
                    "backend_options": {"working_directory": str(workdir)},
                }
            )
            out = client._call(
                "/v1/sessions/s/execute_cmd", {"cmd": "env", "env": {"SWEFLOW_BLACKBOX_TOKEN": "x"}}
            )
        finally:
            del os.environ["SWEFLOW_BLACKBOX_TOKEN_LEAK"]
    assert out["returncode"] == 0 and "PATH=" in out["stdout"]
    assert "SWEFLOW_BLACKBOX_TOKEN" not in out["stdout"] and TOKEN not in out["stdout"]


@pytest.mark.parametrize(
    ("length", "sent", "half_close", "expected"),
    [
        ("1000", b'{"cmd": "x"}', True, 400),  # shorter than announced, then EOF
        ("1000", b'{"cmd": "x"}', False, 400),  # shorter than announced, connection left open
        ("-1", b"", False, 400),
        ("abc", b"", False, 400),
        ("1e3", b"", False, 400),
        (str(10**12), b"", False, 413),
        (str(64 << 20), b"x" * 1000, False, 413),
    ],
)
def test_blackbox_bad_content_length_is_refused_at_once(bb, length, sent, half_close, expected):
    url, _ = bb
    head = (
        f"POST /v1/sessions/{SID}/execute_cmd HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
    )
    status, body, elapsed = raw_request(url, head, sent, half_close=half_close)
    assert status == expected, body
    # the open-connection case waits for the server's read timeout (1 s here, 10 s by default), no more
    assert elapsed < 2.0
    assert httpx.get(url + "/health").status_code == 200


def test_blackbox_unauthenticated_huge_body_is_refused_before_reading(bb):
    url, _ = bb
    head = f"POST /v1/rollout/register HTTP/1.1\r\nHost: x\r\nContent-Length: {1 << 30}\r\n"
    status, _, elapsed = raw_request(url, head, b"{" * 1000)
    assert status == 401 and elapsed < 1.0


def test_blackbox_deeply_nested_json_is_400(bb):
    url, _ = bb
    for raw in (
        b"[" * 100_000 + b"]" * 100_000,
        json.dumps({"cmd": "true", "env": [[[[[[]]]]]] * 1}).encode(),
    ):
        resp = httpx.post(
            url + f"/v1/sessions/{SID}/execute_cmd",
            content=raw,
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert resp.status_code == 400, resp.text
    nested = {"cmd": "true", "x": json.loads("[" * 500 + "]" * 500)}
    resp = httpx.post(
        url + f"/v1/sessions/{SID}/execute_cmd", json=nested, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert resp.status_code == 400 and "deeper" in resp.text


# ---------------------------------------------------------------------------------------------- proxy
@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def msg(text: str = "hi") -> dict:
    return {"model": "tiny", "max_tokens": 20, "messages": [{"role": "user", "content": text}]}


@pytest.fixture()
def proxy(tok):
    """A proxy with sessions a and b; yields (proxy, admin headers, {sid: token})."""
    with ProxyServer(ScriptedEngine(["ok"], tok, cycle=True), tok, ProxyConfig()) as server:
        admin = {"Authorization": f"Bearer {server.admin_token}"}
        tokens = {}
        for sid in ("a", "b"):
            answer = httpx.post(
                server.url + "/session/create", json={"session_id": sid}, headers=admin
            ).json()
            assert answer["created"] is True and set(answer) == {"session_id", "created", "token"}
            tokens[sid] = answer["token"]
        yield server, admin, tokens


ADMIN_CALLS = [
    ("/session/create", {"session_id": "mine"}),
    ("/session/finalize", {"session_id": "b"}),
    ("/trajectory/read", {"session_id": "b"}),
    ("/session/delete", {"session_id": "b"}),
    ("/pause", {}),
    ("/resume", {"weight_version": 999}),
]


@pytest.mark.parametrize(("path", "payload"), ADMIN_CALLS)
def test_proxy_admin_endpoints_need_the_admin_token(proxy, path, payload):
    server, admin, tokens = proxy
    for headers in ({}, {"Authorization": f"Bearer {tokens['a']}"}, {"x-api-key": server.admin_token},
                    {"Authorization": "Bearer b"}, {"Authorization": f"Bearer {server.admin_token}x"}):  # fmt: skip
        resp = httpx.post(server.url + path, json=payload, headers=headers)
        assert resp.status_code == 401, (headers, resp.text)
        assert resp.json()["error"]["type"] == "authentication_error"
    # nothing happened: b is live and unread, nothing paused, no weight version set
    assert httpx.get(server.url + "/health").json()["paused"] is False
    assert server.weight_version is None and "mine" not in server._sessions
    traj = httpx.post(server.url + "/trajectory/read", json={"session_id": "b"}, headers=admin).json()
    assert traj["finalized"] is False and "token" not in json.dumps(traj)


def test_a_session_token_reaches_only_its_own_session(proxy):
    server, admin, tokens = proxy
    a = {"Authorization": f"Bearer {tokens['a']}"}
    for path in ("/sessions/b/v1/messages", "/sessions/b/v1/messages/count_tokens"):
        resp = httpx.post(server.url + path, json=msg("steal"), headers=a)
        assert resp.status_code == 403 and resp.json()["error"]["type"] == "permission_error"
    assert httpx.post(server.url + "/sessions/a/v1/messages", json=msg(), headers=a).status_code == 200
    assert httpx.post(server.url + "/v1/messages", json=msg(), headers=a).status_code == 200
    read = lambda sid: httpx.post(  # noqa: E731
        server.url + "/trajectory/read", json={"session_id": sid}, headers=admin
    ).json()
    assert len(read("a")["turns"]) == 2 and read("b")["turns"] == []
    assert "steal" not in json.dumps(read("b"))


def test_the_session_id_is_no_credential(proxy):
    server, admin, tokens = proxy
    for headers in ({"Authorization": "Bearer b"}, {"x-api-key": "b"}, {}, {"Authorization": "Basic b"}):
        for path in ("/v1/messages", "/sessions/b/v1/messages", "/v1/messages/count_tokens"):
            resp = httpx.post(server.url + path, json=msg(), headers=headers)
            assert resp.status_code == 401, (headers, path)
    # a deleted session's token is dead too
    httpx.post(server.url + "/session/delete", json={"session_id": "b"}, headers=admin)
    resp = httpx.post(server.url + "/v1/messages", json=msg(), headers={"x-api-key": tokens["b"]})
    assert resp.status_code == 401


@pytest.mark.parametrize(
    ("length", "expected"), [("-1", 400), ("abc", 400), (str(10**12), 413), (str(9 << 20), 413)]
)
def test_proxy_bad_content_length_is_refused_at_once(proxy, length, expected):
    server, _, tokens = proxy
    head = (
        f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tokens['a']}\r\n"
        f"Content-Length: {length}\r\n"
    )
    status, _, elapsed = raw_request(server.url, head, b'{"model": ')
    assert status == expected and elapsed < 1.0


def _other_session_latencies(server, token, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {token}"}) as c:
        while not stop.is_set():
            t0 = time.monotonic()
            assert c.post("/v1/messages", json=msg()).status_code == 200
            out.append(time.monotonic() - t0)


@pytest.mark.parametrize("mb", [10, 3])
def test_huge_request_is_413_and_never_stalls_other_sessions(proxy, mb):
    """10 MB: over max_body_bytes, refused from its Content-Length. 3 MB: under the body limit and the
    sound char bound, so it is counted in bounded chunks until clearly over max_prompt_tokens."""
    server, _, tokens = proxy
    huge = json.dumps(msg("word " * (mb * 200_000)))
    latencies: list[float] = []
    stop = threading.Event()
    other = threading.Thread(target=_other_session_latencies, args=(server, tokens["b"], stop, latencies))
    other.start()
    time.sleep(0.2)
    try:
        t0 = time.monotonic()
        resp = httpx.post(
            server.url + "/v1/messages",
            content=huge,
            headers={"Authorization": f"Bearer {tokens['a']}", "Content-Type": "application/json"},
            timeout=30,
        )
        elapsed = time.monotonic() - t0
        time.sleep(0.2)
    finally:
        stop.set()
        other.join(30)
    assert resp.status_code == 413 and resp.json()["error"]["type"] == "request_too_large", resp.text[:300]
    assert elapsed < 5.0, f"refusing {mb} MB took {elapsed:.2f} s"
    assert latencies and max(latencies) < 2.0, f"the other session waited {max(latencies):.2f} s"


def exact_count(tok, text: str) -> int:
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return len(tok.encode(rendered, add_special_tokens=False))


@pytest.mark.parametrize("limit", [300, 2000])
def test_prompt_token_limit_is_exact_at_the_edge_and_cheap_far_above(tok, limit):
    """2000 tokens is more than the prompt's bytes only for the small texts; 300 forces chunk counting."""
    cfg = ProxyConfig(max_prompt_tokens=limit)
    with ProxyServer(ScriptedEngine(["ok"], tok, cycle=True), tok, cfg) as server:
        admin = {"Authorization": f"Bearer {server.admin_token}"}
        created = httpx.post(server.url + "/session/create", json={"session_id": "s"}, headers=admin)
        auth = {"Authorization": f"Bearer {created.json()['token']}"}

        def count(text: str) -> httpx.Response:
            return httpx.post(server.url + "/v1/messages/count_tokens", json=msg(text), headers=auth)

        k = 1
        while exact_count(tok, "ab " * (k + 1)) <= limit:
            k += 1
        at, over = "ab " * k, "ab " * (k + 1)  # the longest prompt that fits, and one token more (or so)
        assert count(at).status_code == 200 and count(at).json()["input_tokens"] == exact_count(tok, at)
        assert exact_count(tok, over) > limit and count(over).status_code == 413
        assert httpx.post(server.url + "/v1/messages", json=msg(over), headers=auth).status_code == 413
        t0 = time.monotonic()
        assert count("hello " * 1_000_000).status_code == 413  # past the sound byte bound: not tokenised
        assert time.monotonic() - t0 < 1.0


def test_proxy_deeply_nested_json_is_400(proxy):
    server, admin, tokens = proxy
    auth = {"Authorization": f"Bearer {tokens['a']}"}
    deep_raw = b"[" * 100_000 + b"]" * 100_000
    for path, headers in (("/v1/messages", auth), ("/session/create", admin)):
        resp = httpx.post(server.url + path, content=deep_raw, headers=headers)
        assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"
    # valid JSON the parser accepts, but nested deep inside a tool schema that later code recurses into
    schema: dict = {"type": "string"}
    for _ in range(400):
        schema = {"type": "object", "properties": {"x": schema}}
    payload = {**msg(), "tools": [{"name": "T", "description": "d", "input_schema": schema}]}
    resp = httpx.post(server.url + "/v1/messages", json=payload, headers=auth)
    assert resp.status_code == 400 and "deeper" in resp.json()["error"]["message"]
    assert httpx.post(server.url + "/v1/messages", json=msg(), headers=auth).status_code == 200


# ---------------------------------------------------------------------------------------------- proxy CLI
def test_proxy_cli_admin_token_sources(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(proxy_cli.ADMIN_TOKEN_ENV, raising=False)
    # no token source at all: refuse to start (an unknowable generated token would lock everyone out)
    assert proxy_cli.main(["--tokenizer", str(tmp_path / "none")]) == 2
    assert "admin token" in capsys.readouterr().err
    parse = proxy_cli.build_parser().parse_args
    out = tmp_path / "admin.token"
    generated = proxy_cli.admin_token(parse(["--tokenizer", "t", "--write-admin-token", str(out)]))
    assert len(generated) >= 32 and out.read_text().strip() == generated
    assert out.stat().st_mode & 0o777 == 0o600
    assert proxy_cli.admin_token(parse(["--tokenizer", "t", "--admin-token-file", str(out)])) == generated
    monkeypatch.setenv(proxy_cli.ADMIN_TOKEN_ENV, "from-env")
    assert proxy_cli.admin_token(parse(["--tokenizer", "t"])) == "from-env"
    assert proxy_cli.ADMIN_TOKEN_ENV not in os.environ
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(proxy_cli.SweflowError):
        proxy_cli.admin_token(parse(["--tokenizer", "t", "--admin-token-file", str(tmp_path / "empty")]))
