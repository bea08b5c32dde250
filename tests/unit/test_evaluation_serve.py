"""The evaluation's vLLM server (sweflow.evaluation.serve): started, asked until ready, used through the
proxy's VLLMEngine, stopped with its process group; a server that dies or never gets ready is one clear error
with the end of its log. A stand-in server script plays vLLM's /health and /v1/completions here (no GPU)."""

from __future__ import annotations

import socket
import sys
import textwrap

import pytest

from sweflow.errors import EvalError
from sweflow.evaluation.serve import served, vllm_command
from sweflow.proxy.engines import EngineError, SamplingParams, VLLMEngine
from sweflow.schema import defaults

STAND_IN = textwrap.dedent(
    """
    import http.server, json, sys, time
    time.sleep(float(sys.argv[2]))  # loading the model
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            self._send(200 if self.path == "/health" else 404, {})
        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids = [len(req["prompt"]), req.get("seed", -1)]
            self._send(200, {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-0.5, -0.25]},
                                          "finish_reason": "length"}]})
    print("serving", flush=True)
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_server_is_waited_for_used_and_stopped(tmp_path):
    script, port = tmp_path / "server.py", _port()
    script.write_text(STAND_IN)
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "vllm.log"
    with served([sys.executable, str(script), str(port), "1.5"], url, log_path=log, startup_timeout=30,
                poll=0.2) as base:  # fmt: skip
        got = VLLMEngine(base, "grpo").generate([1, 2, 3], SamplingParams(max_tokens=2, seed=7))
        assert got.output_ids == [3, 7] and got.logprobs == [-0.5, -0.25] and got.finish_reason == "length"
    assert "serving" in log.read_text()
    with pytest.raises(EngineError, match="unreachable"):  # stopped: nothing answers any more
        VLLMEngine(url, "grpo", timeout=2).generate([1], SamplingParams(max_tokens=1))


def test_a_server_that_dies_or_never_gets_ready_is_one_error_with_its_log(tmp_path):
    dies = [sys.executable, "-c", "import sys; print('CUDA out of memory'); sys.exit(3)"]
    with pytest.raises(EvalError) as exc:
        with served(
            dies, f"http://127.0.0.1:{_port()}", log_path=tmp_path / "a.log", startup_timeout=30, poll=0.1
        ):
            pytest.fail("not ready")
    assert "status 3" in str(exc.value) and "CUDA out of memory" in str(exc.value)
    assert exc.value.field == "evaluate.vllm"
    hangs = [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(60)"]
    with pytest.raises(EvalError) as exc:
        with served(
            hangs, f"http://127.0.0.1:{_port()}", log_path=tmp_path / "b.log", startup_timeout=1, poll=0.1
        ):
            pytest.fail("not ready")
    assert "not ready within 1 s" in str(exc.value) and exc.value.field == "evaluate.vllm.startup_timeout_sec"


def test_the_command_is_vllms_openai_server_with_the_configured_options():
    opts = defaults(
        "evaluate.vllm",
        {"tensor_parallel_size": 2, "max_model_len": 32768, "extra_args": ["--enforce-eager"]},
    )
    cmd = vllm_command("/m/grpo", name="grpo", seed=3, options=opts)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    pairs = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert pairs["--model"] == "/m/grpo" and pairs["--served-model-name"] == "grpo" and pairs["--seed"] == "3"
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == str(opts["port"])
    assert pairs["--tensor-parallel-size"] == "2" and pairs["--max-model-len"] == "32768"
    assert cmd[-1] == "--enforce-eager"
