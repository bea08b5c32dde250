"""Shared helpers for the proxy tests (imported explicitly): a fake vLLM server and the tiny tokenizer."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# Without a root conftest, pytest's default import mode puts only tests/unit on sys.path.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.fixtures.tiny_model import tiny_model_path, tiny_tokenizer_path  # noqa: E402

__all__ = ["FakeVLLM", "tiny_model_path", "tiny_tokenizer", "tiny_tokenizer_path"]


def tiny_tokenizer():
    """The tiny fixture tokenizer, loaded with the real AutoTokenizer code (built once per process)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_path())


class FakeVLLM:
    """A loopback server speaking vLLM's /v1/completions with token-id prompts.

    mode "token_ids": choices[0].token_ids + logprobs.tokens as "token_id:N" (vLLM >= 0.10.2);
    "tokens_only": ids only via logprobs.tokens; "error": HTTP 500; "slow": sleeps `delay` first.
    Output: `n_out` ids continuing from the last prompt id, ending in `stop_id` when it fits.
    """

    def __init__(self, mode: str = "token_ids", n_out: int = 4, stop_id: int = 2, delay: float = 0.0) -> None:
        self.mode, self.n_out, self.stop_id, self.delay = mode, n_out, stop_id, delay
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"path": self.path, "body": body})
                if fake.delay:
                    time.sleep(fake.delay)
                if fake.mode == "error":
                    data, status = b'{"error": "boom"}', 500
                else:
                    data, status = json.dumps(fake.completion(body)).encode(), 200
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def completion(self, body: dict) -> dict:
        prompt = body["prompt"]
        n = min(self.n_out, body["max_tokens"])
        ids = [(prompt[-1] + 1 + k) % 500 + 3 for k in range(n)]
        finish = "length"
        if n < body["max_tokens"] or n == self.n_out:
            ids[-1] = self.stop_id
            finish = "stop"
        lps = [-0.5 - 0.25 * k for k in range(n)]
        choice = {
            "index": 0,
            "text": "ignored",
            "finish_reason": finish,
            "stop_reason": None,
            "logprobs": {
                "tokens": [f"token_id:{i}" for i in ids],
                "token_logprobs": lps,
                "top_logprobs": [{f"token_id:{i}": lp} for i, lp in zip(ids, lps, strict=True)],
                "text_offset": list(range(n)),
            },
        }
        if self.mode == "token_ids":
            choice["token_ids"] = ids
        return {"id": "cmpl-1", "object": "text_completion", "model": body["model"], "choices": [choice]}

    def __enter__(self) -> FakeVLLM:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
