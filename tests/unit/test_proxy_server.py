"""The proxy over real HTTP: Messages JSON/SSE, sessions, recording, errors, pause, isolation, disconnects.

The test client carries the admin token by default; `post` authenticates as a session with its token."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time

import httpx
import pytest

from sweflow.offline.scripted_engine import ScriptedEngine, scripted_logprob
from sweflow.proxy.engines import EngineTimeout, SamplingParams, VLLMEngine
from sweflow.proxy.server import ProxyConfig, ProxyServer
from sweflow.proxy.toolcalls import format_hermes, format_qwen_xml

try:
    from tests.unit.conftest_proxy import FakeVLLM, tiny_tokenizer
except ModuleNotFoundError:  # default import mode: tests/unit itself is on sys.path
    from conftest_proxy import FakeVLLM, tiny_tokenizer  # type: ignore[no-redef]

TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
    {
        "name": "Read",
        "description": "Read a file",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
        },
    },
]
SYSTEM = [{"type": "text", "text": "You are Claude Code."}, {"type": "text", "text": "Work in /testbed."}]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def admin_client(proxy, **kw) -> httpx.Client:
    """An httpx client that sends the proxy's admin token unless a call sets its own Authorization."""
    client = httpx.Client(
        base_url=proxy.url, timeout=30, headers={"Authorization": f"Bearer {proxy.admin_token}"}, **kw
    )
    client.tokens = TOKENS.setdefault(proxy.url, {})
    return client


TOKENS: dict[str, dict[str, str]] = {}  # proxy url -> session id -> session token


def create(client, sid) -> httpx.Response:
    resp = client.post("/session/create", json={"session_id": sid})
    if resp.status_code == 200:
        client.tokens[sid] = resp.json()["token"]
    return resp


@contextlib.contextmanager
def running(engine, tok, sessions=("s1",), **cfg):
    with ProxyServer(engine, tok, ProxyConfig(**cfg)) as proxy, admin_client(proxy) as client:
        for sid in sessions:
            assert create(client, sid).json()["created"] is True
        yield proxy, client
    TOKENS.pop(proxy.url, None)


def body(messages, **extra):
    return {
        "model": "tiny",
        "max_tokens": 200,
        "system": SYSTEM,
        "tools": TOOLS,
        "messages": messages,
        **extra,
    }


def post(client, sid, payload, path="/v1/messages?beta=true", **headers):
    """A Messages call as session `sid` (its token; an unknown id is sent as is)."""
    token = TOKENS.get(str(client.base_url).rstrip("/"), {}).get(sid, sid)
    return client.post(path, json=payload, headers={"Authorization": f"Bearer {token}", **headers})


def read(client, sid, drain=False):
    return client.post("/trajectory/read", json={"session_id": sid, "drain": drain}).json()


def parse_sse(text):
    events = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_tool_call_turn_json_and_recorded_tokens(tok):
    script = "Listing files.\n" + format_qwen_xml("Bash", {"command": "ls /testbed"})
    engine = ScriptedEngine([script], tok)
    with running(engine, tok) as (proxy, client):
        resp = post(client, "s1", body([{"role": "user", "content": "fix it"}]))
        assert resp.status_code == 200, resp.text
        msg = resp.json()
        assert msg["type"] == "message" and msg["role"] == "assistant" and msg["stop_reason"] == "tool_use"
        assert msg["content"][0] == {"type": "text", "text": "Listing files."}
        use = msg["content"][1]
        assert (
            use["type"] == "tool_use" and use["name"] == "Bash" and use["input"] == {"command": "ls /testbed"}
        )
        assert use["id"].startswith("toolu_")
        traj = read(client, "s1")
    [turn] = traj["turns"]
    expected_prompt = proxy.render(proxy_request(body([{"role": "user", "content": "fix it"}])))
    assert turn["prompt_ids"] == expected_prompt
    assert msg["usage"]["input_tokens"] == len(expected_prompt)
    # what was recorded decodes to exactly what the engine produced (plus its stop token)
    assert tok.decode(turn["output_ids"][:-1]) == script
    assert turn["output_ids"][-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert turn["logprobs"] == [scripted_logprob(t, i) for i, t in enumerate(turn["output_ids"])]
    assert turn["finish_reason"] == "stop" and turn["stop_reason"] == "tool_use"
    [sample] = traj["samples"]
    assert sample["token_ids"] == turn["prompt_ids"] + turn["output_ids"]
    assert sum(sample["loss_mask"]) == len(turn["output_ids"])


def proxy_request(payload):
    from sweflow.proxy.anthropic import parse_request

    return parse_request(payload)


def test_streaming_sse_sequence_and_end_turn(tok):
    engine = ScriptedEngine(["All done, the tests pass. " * 6], tok)
    with running(engine, tok) as (_, client):
        resp = post(client, "s1", body([{"role": "user", "content": "hi"}], stream=True))
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(resp.text)
    names = [e for e, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names[1] == "content_block_start" and names[-3] == "content_block_stop"
    text = "".join(d["delta"]["text"] for e, d in events if e == "content_block_delta")
    assert text == ("All done, the tests pass. " * 6).strip()
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_hermes_format_and_max_tokens_stop_reason(tok):
    engine = ScriptedEngine([format_hermes("Read", {"file_path": "/a"}), "x " * 100], tok)
    with running(engine, tok) as (_, client):
        first = post(client, "s1", body([{"role": "user", "content": "read"}])).json()
        assert first["content"][0]["input"] == {"file_path": "/a"} and first["stop_reason"] == "tool_use"
        cut = post(client, "s1", body([{"role": "user", "content": "more"}], max_tokens=5)).json()
        assert cut["stop_reason"] == "max_tokens" and cut["usage"]["output_tokens"] == 5
        assert read(client, "s1")["turns"][1]["finish_reason"] == "length"


def test_multi_turn_agent_loop_folds_into_one_sample(tok):
    turn1 = "Let me look.\n" + format_qwen_xml("Bash", {"command": "ls"})
    turn2 = format_qwen_xml("Read", {"file_path": "/testbed/a.py", "limit": 5})
    turn3 = "Fixed it."
    engine = ScriptedEngine([turn1, turn2, turn3], tok)
    with running(engine, tok) as (_, client):
        history = [{"role": "user", "content": "fix the bug"}]
        for _ in range(3):
            msg = post(client, "s1", body(history, stream=True))
            events = parse_sse(msg.text)
            # rebuild the assistant message the way an SDK client does, then answer its tool calls
            blocks = {}
            for e, d in events:
                if e == "content_block_start":
                    blocks[d["index"]] = dict(d["content_block"])
                    blocks[d["index"]]["_json"] = ""
                elif e == "content_block_delta" and d["delta"]["type"] == "text_delta":
                    blocks[d["index"]]["text"] += d["delta"]["text"]
                elif e == "content_block_delta":
                    blocks[d["index"]]["_json"] += d["delta"]["partial_json"]
            content = []
            for b in blocks.values():
                raw = b.pop("_json")
                if b["type"] == "tool_use":
                    b["input"] = json.loads(raw)
                content.append(b)
            history.append({"role": "assistant", "content": content})
            results = [
                {"type": "tool_result", "tool_use_id": b["id"], "content": f"output of {b['name']}"}
                for b in content
                if b["type"] == "tool_use"
            ]
            if results:
                history.append({"role": "user", "content": results})
        assert content == [{"type": "text", "text": "Fixed it."}]
        traj = read(client, "s1")
    assert len(traj["turns"]) == 3
    [sample] = traj["samples"]
    assert sample["num_turns"] == 3 and sample["finish_reason"] == "stop"
    outputs = [t["output_ids"] for t in traj["turns"]]
    assert sum(sample["loss_mask"]) == sum(len(o) for o in outputs)
    # the masked-in tokens are exactly the three outputs, in order
    picked = [t for t, m in zip(sample["token_ids"], sample["loss_mask"], strict=True) if m]
    assert picked == outputs[0] + outputs[1] + outputs[2]
    assert sample["token_ids"][: sample["prompt_length"]] == traj["turns"][0]["prompt_ids"]
    # a tool_use integer argument survives the round trip typed
    assert history[3]["content"][0]["input"] == {"file_path": "/testbed/a.py", "limit": 5}


def test_session_binding_paths_and_keys(tok):
    engine = ScriptedEngine(["ok"], tok, cycle=True)
    with running(engine, tok, sessions=("a", "b")) as (proxy, client):
        payload = body([{"role": "user", "content": "hi"}])
        ta, tb = client.tokens["a"], client.tokens["b"]
        assert ta != tb and "a" not in (ta, tb) and len(ta) >= 32
        with httpx.Client(base_url=proxy.url, timeout=30) as agent:
            ok = agent.post(
                "/sessions/a/v1/messages?beta=true", json=payload, headers={"Authorization": f"Bearer {ta}"}
            )
            assert ok.status_code == 200
            assert agent.post("/v1/messages", json=payload, headers={"x-api-key": tb}).status_code == 200
            count = agent.post(
                "/sessions/b/v1/messages/count_tokens",
                json={k: payload[k] for k in ("model", "messages")},
                headers={"x-api-key": tb},
            )
            assert count.status_code == 200 and count.json()["input_tokens"] > 0
            # the path prefix alone is no credential any more
            assert agent.post("/sessions/a/v1/messages", json=payload).status_code == 401
        assert len(read(client, "a")["turns"]) == 1 and len(read(client, "b")["turns"]) == 1


def test_session_errors(tok):
    engine = ScriptedEngine(["ok"], tok, cycle=True)
    with running(engine, tok) as (_, client):
        payload = body([{"role": "user", "content": "hi"}])
        missing = client.post("/v1/messages", json=payload)  # the admin token is no session token
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
        unknown = post(client, "nope", payload)
        assert unknown.status_code == 401 and unknown.json()["type"] == "error"
        again = client.post("/session/create", json={"session_id": "s1"}).json()
        assert again["created"] is False and again["token"] == client.tokens["s1"]
        assert client.post("/session/create", json={"session_id": "../x"}).status_code == 400
        assert client.post("/session/finalize", json={"session_id": "s1"}).json()["finalized"] is True
        assert post(client, "s1", payload).status_code == 409
        assert client.post("/session/create", json={"session_id": "s1"}).status_code == 409
        assert client.post("/trajectory/read", json={"session_id": "ghost"}).status_code == 404
        assert client.get("/health").json()["healthy"] is True


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "bot", "content": "x"}]}).encode(),
        json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode(),
        json.dumps({"model": "m", "max_tokens": 5}).encode(),
    ],
)
def test_malformed_requests_get_400_invalid_request(tok, raw):
    engine = ScriptedEngine(["ok"], tok, cycle=True)
    with running(engine, tok) as (_, client):
        resp = client.post(
            "/v1/messages", content=raw, headers={"Authorization": f"Bearer {client.tokens['s1']}"}
        )
        assert resp.status_code == 400
        err = resp.json()
        assert (
            err["type"] == "error"
            and err["error"]["type"] == "invalid_request_error"
            and err["error"]["message"]
        )
        assert read(client, "s1")["turns"] == [] and engine.calls == 0


def test_prompt_too_long_is_400(tok):
    engine = ScriptedEngine(["ok"], tok, cycle=True)
    with running(engine, tok, max_context_tokens=20) as (_, client):
        resp = post(client, "s1", body([{"role": "user", "content": "hi"}]))
        assert resp.status_code == 400 and "prompt is too long" in resp.json()["error"]["message"]


def test_engine_error_502_and_timeouts_504(tok):
    with running(ScriptedEngine(["x"], tok, fail_with=RuntimeError("gpu fell over")), tok) as (_, client):
        resp = post(client, "s1", body([{"role": "user", "content": "hi"}]))
        assert resp.status_code == 502 and resp.json()["error"]["type"] == "api_error"
        assert "gpu fell over" in resp.json()["error"]["message"]
    with running(ScriptedEngine(["x"], tok, fail_with=EngineTimeout("vllm slow")), tok) as (_, client):
        assert post(client, "s1", body([{"role": "user", "content": "hi"}])).status_code == 504
    with running(ScriptedEngine(["x"], tok, delay_s=2.0), tok, engine_timeout_s=0.2) as (_, client):
        t0 = time.monotonic()
        resp = post(client, "s1", body([{"role": "user", "content": "hi"}]))
        assert resp.status_code == 504 and resp.json()["error"]["type"] == "timeout_error"
        assert time.monotonic() - t0 < 1.5
        assert read(client, "s1")["turns"] == []


def test_vllm_engine_behind_proxy(tok):
    with FakeVLLM(n_out=6, stop_id=tok.convert_tokens_to_ids("<|im_end|>")) as fake:
        engine = VLLMEngine(fake.url, "served", timeout=5)
        with running(engine, tok, temperature=0.6) as (_, client):
            resp = post(client, "s1", body([{"role": "user", "content": "hi"}], temperature=0.0))
            assert resp.status_code == 200
            turn = read(client, "s1")["turns"][0]
    sent = fake.requests[0]["body"]
    assert sent["prompt"] == turn["prompt_ids"]
    assert sent["temperature"] == 0.6  # the trainer's sampling wins over the agent's
    assert turn["output_ids"] == fake.completion(sent)["choices"][0]["token_ids"]
    assert turn["logprobs"] == [-0.5 - 0.25 * k for k in range(6)]


def test_concurrent_sessions_are_isolated(tok):
    # the engine echoes the session marker it finds in the prompt, so any cross-talk shows up as a foreign marker
    def echo(ids):
        return "echo " + re.findall(r"MARK\w+", tok.decode(ids))[-1]

    names = [f"sess{i}" for i in range(6)]
    engine = ScriptedEngine(echo, tok, delay_s=0.02)
    with running(engine, tok, sessions=names) as (proxy, client):
        errors = []

        def agent(sid):
            with admin_client(proxy) as own:
                for k in range(4):
                    r = post(
                        own, sid, body([{"role": "user", "content": f"MARK{sid}x{k}"}], stream=k % 2 == 0)
                    )
                    if r.status_code != 200 or f"MARK{sid}x{k}" not in r.text:
                        errors.append((sid, r.status_code, r.text[:200]))

        threads = [threading.Thread(target=agent, args=(s,)) for s in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        for sid in names:
            traj = read(client, sid)
            assert len(traj["turns"]) == 4
            text = "".join(tok.decode(s["token_ids"]) for s in traj["samples"])
            assert set(re.findall(r"MARK(sess\d+)", text)) == {sid}


def test_pause_holds_new_requests_until_resume(tok):
    engine = ScriptedEngine(["ok"], tok, cycle=True)
    with running(engine, tok) as (proxy, client):
        assert client.post("/pause", json={}).json()["paused"] is True
        done = threading.Event()
        result = {}

        def call():
            result["status"] = post(
                admin_client(proxy),
                "s1",
                body([{"role": "user", "content": "hi"}]),
            ).status_code
            done.set()

        threading.Thread(target=call).start()
        assert not done.wait(0.4) and engine.calls == 0
        assert client.get("/health").json()["paused"] is True
        assert client.post("/resume", json={"weight_version": 7}).json()["weight_version"] == 7
        assert done.wait(5) and result["status"] == 200
        assert read(client, "s1")["turns"][0]["weight_version"] == 7


def test_pause_lets_in_flight_finish(tok):
    engine = ScriptedEngine(["ok"], tok, cycle=True, delay_s=0.5)
    with running(engine, tok) as (proxy, client):
        out = {}
        th = threading.Thread(
            target=lambda: out.setdefault(
                "r",
                post(
                    admin_client(proxy),
                    "s1",
                    body([{"role": "user", "content": "hi"}]),
                ),
            )
        )
        th.start()
        time.sleep(0.15)  # the request is now inside the engine
        paused = client.post("/pause", json={"wait_idle": True, "timeout": 5}).json()
        assert paused == {"paused": True, "in_flight": 0}
        th.join(5)
        assert out["r"].status_code == 200 and len(read(client, "s1")["turns"]) == 1
        client.post("/resume", json={})


def test_drain_removes_read_data(tok):
    engine = ScriptedEngine(["ok"], tok, cycle=True)
    with running(engine, tok) as (_, client):
        post(client, "s1", body([{"role": "user", "content": "hi"}]))
        assert len(read(client, "s1", drain=True)["samples"]) == 1
        assert read(client, "s1") == {**read(client, "s1"), "turns": [], "samples": []}


def test_client_disconnect_mid_stream_is_recorded_and_harmless(tok):
    long_text = "word " * 4000
    engine = ScriptedEngine(lambda ids: long_text, tok, delay_s=0.3)
    with running(engine, tok, sessions=("gone", "other")) as (proxy, client):
        payload = json.dumps(
            body([{"role": "user", "content": "hi"}], stream=True, max_tokens=20000)
        ).encode()
        host, port = proxy.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        head = (
            f"POST /v1/messages?beta=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {client.tokens['gone']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        sock.sendall(head + payload)
        sock.close()  # gone before the answer is written
        deadline = time.monotonic() + 5
        while not read(client, "gone")["turns"] and time.monotonic() < deadline:
            time.sleep(0.05)
        [turn] = read(client, "gone")["turns"]
        assert tok.decode(turn["output_ids"][:-1]) == long_text
        deadline = time.monotonic() + 5
        while not read(client, "gone")["turns"][0]["aborted"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert read(client, "gone")["turns"][0]["aborted"] is True
        assert read(client, "gone")["samples"] == []  # never seen by the agent: not trained on
        ok = post(client, "other", body([{"role": "user", "content": "hi"}], stream=True))
        assert ok.status_code == 200 and parse_sse(ok.text)[-1][0] == "message_stop"
        assert read(client, "other")["turns"][0]["aborted"] is False


def test_a_retry_after_a_disconnect_extends_the_lineage_as_it_was(tok):
    """The answer that never reached the agent is rolled back out of the lineage: the agent's retry of the
    same request appends to the first call's exact ids, and the session stays one sample."""
    answers = iter(["first answer", "word " * 4000, "retried answer"])
    engine = ScriptedEngine(lambda ids: next(answers), tok, delay_s=0.3)
    with running(engine, tok, sessions=("s",)) as (proxy, client):
        first = [{"role": "user", "content": "hi"}]
        one = post(client, "s", body(first)).json()
        second = [*first, {"role": "assistant", "content": one["content"]}, {"role": "user", "content": "go"}]
        payload = json.dumps(body(second, stream=True, max_tokens=20000)).encode()
        host, port = proxy.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.sendall(
            (
                f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {client.tokens['s']}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
            ).encode()
            + payload
        )
        sock.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            turns = read(client, "s")["turns"]
            if len(turns) == 2 and turns[1]["aborted"]:
                break
            time.sleep(0.05)
        assert [t["aborted"] for t in read(client, "s")["turns"]] == [False, True]
        assert post(client, "s", body(second)).status_code == 200
        traj = read(client, "s")
    assert [t["token_build"] for t in traj["turns"]] == ["first", "append", "append"]
    [sample] = traj["samples"]
    assert sample["turn_indices"] == [0, 2] and sample["lineage_reason"] == "first"
    t0, t2 = traj["turns"][0], traj["turns"][2]
    assert (
        t2["prompt_ids"][: len(t0["prompt_ids"]) + len(t0["output_ids"])]
        == t0["prompt_ids"] + t0["output_ids"]
    )
    assert "word word" not in tok.decode(sample["token_ids"])


def test_sampling_params_reach_engine(tok):
    seen: list[SamplingParams] = []

    class Spy:
        def generate(self, prompt_ids, sampling):
            seen.append(sampling)
            return ScriptedEngine(["ok"], tok).generate(prompt_ids, sampling)

    with running(Spy(), tok, max_new_tokens=50, honor_request_sampling=True) as (_, client):
        post(
            client,
            "s1",
            body([{"role": "user", "content": "hi"}], max_tokens=999, temperature=0.3, top_p=0.9),
        )
    s = seen[0]
    assert s.max_tokens == 50 and s.temperature == 0.3 and s.top_p == 0.9
    assert tok.convert_tokens_to_ids("<|im_end|>") in s.stop_token_ids


def test_admin_token_guards_admin_endpoints(tok):
    engine = ScriptedEngine(["ok"], tok, cycle=True)
    cfg = ProxyConfig(admin_token="adm-secret")
    with ProxyServer(engine, tok, cfg) as proxy, httpx.Client(base_url=proxy.url, timeout=10) as client:
        assert proxy.admin_token == "adm-secret"
        admin = {"Authorization": "Bearer adm-secret"}
        assert client.post("/session/create", json={"session_id": "s1"}).status_code == 401
        created = client.post("/session/create", json={"session_id": "s1"}, headers=admin)
        assert created.status_code == 200
        token = created.json()["token"]
        ok = client.post(
            "/v1/messages",
            json=body([{"role": "user", "content": "hi"}]),
            headers={"Authorization": f"Bearer {token}"},
        )
        assert ok.status_code == 200
        # an agent holding its session token cannot read trajectories, its own or others'
        for bearer in ("s1", token):
            denied = client.post(
                "/trajectory/read", json={"session_id": "s1"}, headers={"Authorization": f"Bearer {bearer}"}
            )
            assert denied.status_code == 401
        turns = client.post("/trajectory/read", json={"session_id": "s1"}, headers=admin).json()["turns"]
        assert len(turns) == 1


def test_generated_admin_token_is_random_per_server(tok):
    engine = ScriptedEngine(["ok"], tok, cycle=True)
    with ProxyServer(engine, tok) as one, ProxyServer(engine, tok) as two:
        assert one.admin_token != two.admin_token and len(one.admin_token) >= 32
        assert httpx.post(one.url + "/session/create", json={"session_id": "x"}).status_code == 401


def test_stop_releases_paused_requests_with_503(tok):
    engine = ScriptedEngine(["ok"], tok, cycle=True)
    proxy = ProxyServer(engine, tok, ProxyConfig()).start()
    create(admin_client(proxy), "s1")
    proxy.pause()
    out = {}

    def call():
        with admin_client(proxy) as c:
            out["r"] = post(c, "s1", body([{"role": "user", "content": "hi"}]))

    th = threading.Thread(target=call)
    th.start()
    time.sleep(0.2)
    with proxy._gate:  # simulate shutdown reaching the waiting request before the socket closes
        proxy._stopping = True
        proxy._gate.notify_all()
    th.join(5)
    proxy.stop()
    assert out["r"].status_code == 503 and out["r"].json()["error"]["type"] == "overloaded_error"
    assert engine.calls == 0


def test_template_refusing_midlist_system_falls_back_to_user(tok):
    from transformers import AutoTokenizer

    strict = AutoTokenizer.from_pretrained(tok.name_or_path)
    guard = "{%- for m in messages[1:] %}{%- if m.role == 'system' %}{{ raise_exception('System message must be at the beginning.') }}{%- endif %}{%- endfor %}"
    strict.chat_template = guard + tok.chat_template
    engine = ScriptedEngine(["ok"], strict, cycle=True)
    with running(engine, strict) as (proxy, client):
        msgs = [
            {"role": "user", "content": "a"},
            {"role": "system", "content": "REMINDER"},
            {"role": "user", "content": "b"},
        ]
        assert post(client, "s1", body(msgs)).status_code == 200
        prompt = strict.decode(read(client, "s1")["turns"][0]["prompt_ids"])
        assert "<|im_start|>user\nREMINDER<|im_end|>" in prompt
        bad = body([{"role": "user", "content": "a"}])
        strict.chat_template = "{{ raise_exception('nope') }}"
        resp = post(client, "s1", bad)
        assert resp.status_code == 400 and "chat template rejected" in resp.json()["error"]["message"]


def test_client_reserialised_tool_calls_still_fold_into_one_sample(tok):
    """Claude Code re-sends earlier calls with extra keys first (Edit gains `replace_all: false`); the
    session's own calls are restored to what the model wrote, so the history still extends the last prompt."""
    turn1 = format_qwen_xml("Read", {"file_path": "/testbed/a.py"})
    turn2 = "Done."
    engine = ScriptedEngine([turn1, turn2], tok)
    with running(engine, tok) as (_, client):
        first = post(client, "s1", body([{"role": "user", "content": "fix"}])).json()
        call = first["content"][0]
        assert call["type"] == "tool_use" and call["input"] == {"file_path": "/testbed/a.py"}
        rewritten = {**call, "input": {"limit": 2000, **call["input"]}}  # what the agent sends back
        history = [
            {"role": "user", "content": "fix"},
            {"role": "assistant", "content": [rewritten]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "x = 1"}],
            },
        ]
        post(client, "s1", body(history))
        # a call the session never produced is rendered as sent
        foreign = [
            *history[:1],
            {"role": "assistant", "content": [{**rewritten, "id": "toolu_foreign"}]},
            history[2],
        ]
        foreign[2] = {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_foreign", "content": "x"}],
        }
        traj = read(client, "s1")
    [sample] = traj["samples"]
    assert sample["num_turns"] == 2
    assert "<parameter=limit>" not in tok.decode(sample["token_ids"])
    with running(ScriptedEngine([turn2], tok), tok, sessions=("s2",)) as (_, client):
        post(client, "s2", body(foreign))
        prompt = read(client, "s2")["turns"][0]["prompt_ids"]
    assert "<parameter=limit>" in tok.decode(prompt)
