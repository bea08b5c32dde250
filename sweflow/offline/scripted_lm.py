"""A local OpenAI- and Anthropic-compatible chat endpoint with scripted replies, and the offline "model".

`ScriptedLM` serves `POST /v1/chat/completions` and `POST /v1/messages` on 127.0.0.1 from a daemon thread,
each request normalised and answered by a responder; `offline_responder` is the deterministic stand-in for
the SWE-smith LM that the embedded default uses (it never touches the network).
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
import threading
import tokenize
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..smith.lm import code_block, fence_block

Responder = Callable[[dict], str | dict]


class ReplyStatus(Exception):
    """Raised by a responder (or put in a reply list) to answer with an HTTP error status instead."""

    def __init__(self, status: int, message: str = "scripted error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _normalise(api: str, body: dict) -> dict:
    if api == "openai":
        messages = body.get("messages") or []
        system = "\n".join(_content_text(m.get("content")) for m in messages if m.get("role") == "system")
        user = "\n".join(_content_text(m.get("content")) for m in messages if m.get("role") == "user")
    else:
        system = _content_text(body.get("system") or "")
        user = "\n".join(
            _content_text(m.get("content")) for m in body.get("messages") or [] if m.get("role") == "user"
        )
    return {
        "api": api,
        "model": body.get("model"),
        "system": system,
        "user": user,
        "temperature": body.get("temperature"),
        "max_tokens": body.get("max_tokens"),
    }


def _reply_body(api: str, model: str, text: str, n: int) -> dict:
    usage_in, usage_out = 0, len(text.split())
    if api == "openai":
        return {
            "id": f"chatcmpl-scripted-{n}",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": usage_in, "completion_tokens": usage_out, "total_tokens": usage_out},
        }
    return {
        "id": f"msg_scripted_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": usage_in, "output_tokens": usage_out},
    }


# Every request is normalised to `{"api", "model", "system", "user", "temperature", "max_tokens"}` before
# the responder sees it.
class ScriptedLM:
    """A scripted chat endpoint on 127.0.0.1; use as a context manager. `url` ends in /v1.

    `responder` is a function of the normalised request (which also holds the raw `body`) returning the
    reply text, or for the Anthropic API a dict of message fields (`content` blocks, `stop_reason`) that
    replace the defaults, or a list of replies used in order (the last one repeats). A reply that is a ReplyStatus (or a responder raising one) is
    answered with that HTTP status; any other responder exception is a 500. With `api_key`, requests
    without that key (Bearer for OpenAI; x-api-key or Bearer for Anthropic) get 401. `requests` holds the normalised
    requests that passed the key check, in order (`bodies`: their raw JSON bodies).
    """

    def __init__(self, responder: Responder | list, *, api_key: str | None = None) -> None:
        self._responder = responder
        self._api_key = api_key
        self._lock = threading.Lock()
        self._served = 0
        self.requests: list[dict] = []
        self.bodies: list[dict] = []  # the raw bodies of those requests
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def _answer(self, request: dict) -> str | dict:
        if callable(self._responder):
            reply = self._responder(request)
        else:
            replies = self._responder
            with self._lock:
                reply = replies[min(self._served, len(replies) - 1)] if replies else ""
                self._served += 1
        if isinstance(reply, ReplyStatus):
            raise reply
        return reply if isinstance(reply, dict) else str(reply)

    def _authorised(self, api: str, headers: Any) -> bool:
        if self._api_key is None:
            return True
        bearer = headers.get("Authorization", "") == f"Bearer {self._api_key}"
        if api == "openai":
            return bearer
        # Anthropic: x-api-key, or a bearer token (what newer SDKs send)
        return bearer or headers.get("x-api-key", "") == self._api_key

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        lm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read no server log
                pass

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                path = self.path.split("?", 1)[0].rstrip("/")
                routes = {
                    "/v1/chat/completions": "openai",
                    "/v1/messages": "anthropic",
                    "/v1/messages/count_tokens": "count",
                }
                api = routes.get(path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if api is None:
                    self._send(404, {"error": {"type": "not_found", "message": f"no route {path}"}})
                    return
                if not lm._authorised(api, self.headers):
                    self._send(401, {"error": {"type": "authentication_error", "message": "invalid key"}})
                    return
                try:
                    body = json.loads(raw or b"{}")
                    if not isinstance(body, dict):
                        raise ValueError("body is not an object")
                except ValueError as exc:
                    self._send(400, {"error": {"type": "invalid_request_error", "message": str(exc)}})
                    return
                if api == "count":  # a rough count: the endpoint has no tokenizer
                    self._send(200, {"input_tokens": len(json.dumps(body)) // 4})
                    return
                request = _normalise(api, body)
                with lm._lock:
                    lm.requests.append(request)
                    lm.bodies.append(body)
                    n = len(lm.requests)
                try:
                    text = lm._answer({**request, "body": body})
                    if isinstance(text, dict):  # a whole Anthropic message (content blocks, stop reason)
                        reply = _reply_body(api, str(body.get("model") or ""), "", n)
                        self._send(200, {**reply, **text})
                        return
                except ReplyStatus as exc:
                    self._send(exc.status, {"error": {"type": "scripted", "message": exc.message}})
                    return
                except Exception as exc:  # a responder bug is the server's failure: 500
                    self._send(500, {"error": {"type": "api_error", "message": type(exc).__name__}})
                    return
                self._send(200, _reply_body(api, str(body.get("model") or ""), text, n))

        return Handler

    def start(self) -> ScriptedLM:
        if self._server is None:
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
            self._server.daemon_threads = True
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="scripted-lm",
                daemon=True,
            )
            self._thread.start()
            self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._server = None
            self._thread = None

    def __enter__(self) -> ScriptedLM:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---- the offline "model"

# `offline_responder` recognises each synthesis prompt by its `Task: <name>` marker line and answers:
# - lm_modify: the function from the prompt's python block with one small bug (a seeded procedural mutation
#   when `sweflow.smith.procedural` is available, else the first comparison operator flipped or the first
#   integer constant changed by one; unchanged when neither applies);
# - lm_rewrite: the stubbed function given, with `raise NotImplementedError` replaced by `return None`. It does
#   not know the original, so this is an honest but wrong re-implementation, which breaks the tests that
#   exercise it;
# - pr_rewrite: the diff's hunks applied to the file from the prompt's python block by line content, as a
#   lenient `patch` would: context lines found in order anchor each hunk, lines to remove are removed where
#   they still are, lines to add go in after the last anchor (the file unchanged when nothing matches);
# - problem_statement: an issue-style text built from the failing output in the prompt: the symptoms
#   (exception and assertion lines) with file paths and test names removed, and the module and function the
#   bug diff touches (never its lines).
_TASK_RE = re.compile(r"^Task: (\w+)\s*$", re.M)
_FLIP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}
_DECIMAL_INT = re.compile(r"^(0|[1-9][0-9_]*)$")


def _seed_of(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:12], 16)


def _replace_token(source: str, tok: tokenize.TokenInfo, text: str) -> str:
    lines = source.splitlines(keepends=True)
    (row, col), (_, end) = tok.start, tok.end
    lines[row - 1] = lines[row - 1][:col] + text + lines[row - 1][end:]
    return "".join(lines)


def _small_change(source: str) -> str:
    """Flip the first comparison operator, else change the first decimal int constant by one."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return source
    for tok in tokens:
        if tok.type == tokenize.OP and tok.string in _FLIP:
            return _replace_token(source, tok, _FLIP[tok.string])
    for tok in tokens:
        if tok.type == tokenize.NUMBER and _DECIMAL_INT.match(tok.string):
            return _replace_token(source, tok, str(int(tok.string.replace("_", "")) + 1))
    return source


def _modify(function: str) -> str:
    try:
        from ..smith.procedural import mutate_source

        mutations = [
            m
            for m in mutate_source(function, seed=_seed_of(function), min_complexity=1)
            if m.source != function
        ]
    except Exception:  # the procedural module is optional here; any failure falls back to the small change
        mutations = []
    if mutations:
        return random.Random(_seed_of(function)).choice(mutations).source
    return _small_change(function)


def _rewrite(stub: str) -> str:
    return re.sub(r"^(\s*)raise NotImplementedError\b.*$", r"\1return None", stub, count=1, flags=re.M)


# The sections of the problem_statement prompt (statements.py fills them between these lines).
BUG_DIFF_BEGIN, BUG_DIFF_END = "----- BEGIN BUG DIFF -----", "----- END BUG DIFF -----"
OUTPUT_BEGIN, OUTPUT_END = "----- BEGIN FAILING TEST OUTPUT -----", "----- END FAILING TEST OUTPUT -----"
_PATHISH = re.compile(r"[\w./\\-]*\.py\b(:\d+)?(:\s*in\s+\S+)?|\S+::\S+")
_TESTISH = re.compile(r"\btest\w*|\bTest\w+")
_EXC_LINE = re.compile(r"^\s*((?:\w+\.)*\w*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?)$")
_NOISE = re.compile(r"^(Use -v to get|Full diff:|Omitting \d+ identical|\.\.\.Full output truncated)")
_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR)\s+\S+(?:\s+-\s+(.*))?$")


def _section(text: str, begin: str, end: str) -> str:
    i = text.find(begin)
    j = text.find(end, i + len(begin)) if i >= 0 else -1
    return text[i + len(begin) : j].strip("\n") if i >= 0 and j >= 0 else ""


def _norm(s: str) -> str:
    return " ".join(s.split())


def _diff_location(diff: str) -> tuple[str | None, str | None]:
    """(dotted module, function) of the first Python file and function the diff changes."""
    module = function = None
    last_def = None
    for line in diff.splitlines():
        if line.startswith("+++ b/") and line.endswith(".py") and module is None:
            path = line[len("+++ b/") :]
            dotted = path[: -len(".py")].replace("/", ".")
            dotted = dotted.removeprefix("src.").removesuffix(".__init__")
            module = dotted
        elif line.startswith("@@"):
            m = re.search(r"@@[^@]*@@.*?\b(?:def|class)\s+(\w+)", line)
            last_def = m.group(1) if m else last_def
        elif module is not None and function is None:
            m = re.match(r"^[ +-]\s*(?:async\s+)?def\s+(\w+)", line)
            if m and not line.startswith("+"):
                last_def = m.group(1)
            if line[:1] in "+-" and not line.startswith(("+++", "---")):
                function = last_def
    return module, function


def _symptoms(output: str, forbidden: list[str]) -> list[str]:
    """Exception and assertion lines of a test run, without paths, test names or any line of the diff."""
    found: list[str] = []
    for raw in output.splitlines():
        line = raw.rstrip()
        if line.startswith("E ") or line == "E":
            text = line[1:].strip()
        elif m := _FAILED_LINE.match(line):
            text = (m.group(1) or "").strip()
        elif m := _EXC_LINE.match(line):
            text = m.group(1).strip()
        else:
            continue
        text = _PATHISH.sub("", text)
        text = _TESTISH.sub("", text).strip(" -:")
        if len(text) < 3 or not re.search(r"\w", text) or _NOISE.match(text):
            continue
        if any(f and f in _norm(text) for f in forbidden):
            continue
        text = text[:200]
        # pytest's summary cuts long messages with "..."; keep the full one from the traceback
        stem = text.removesuffix("...")
        if any(f.startswith(stem) or stem.startswith(f.removesuffix("...")) for f in found):
            continue
        found.append(text)
    return found[:8]


def _statement(user: str) -> str:
    diff = _section(user, BUG_DIFF_BEGIN, BUG_DIFF_END)
    output = _section(user, OUTPUT_BEGIN, OUTPUT_END) or user
    changed = [
        _norm(ln[1:])
        for ln in diff.splitlines()
        if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and len(_norm(ln[1:])) >= 8
    ]
    symptoms = _symptoms(output, changed)
    module, function = _diff_location(diff)
    if function and function.startswith("_"):
        function = None  # a private helper or a dunder method: users meet the module, not the helper
    if module and function:
        where = f"`{function}` in `{module}`"
    elif module:
        where = f"the `{module}` module"
    else:
        where = "the library"
    raised = sorted(
        {m.group(1) for s in symptoms if (m := re.match(r"((?:\w+\.)*\w*(?:Error|Exception))\b", s))}
        - {"AssertionError"}
    )
    if raised:
        behaviour = f"raises {', '.join(raised)} for input that used to work"
    elif symptoms:
        behaviour = "returns results that differ from the documented ones"
    else:
        behaviour = "no longer behaves as documented"
    title = f"{where[0].upper()}{where[1:]} {behaviour}"
    body = [title, "", f"After a recent change, {where} {behaviour}.", ""]
    if symptoms:
        body += ["What I see when I use it:", "", *(f"    {s}" for s in symptoms), ""]
    body.append("Expected: the behaviour described in the documentation, as before the change.")
    return "\n".join(body) + "\n"


_DIFF_BLOCK_RE = re.compile(r"```diff\n(.*?)\n```", re.S)


def _diff_block(user: str) -> str:
    m = _DIFF_BLOCK_RE.search(user)
    return m.group(1) if m else ""


def _lenient_apply(text: str, diff: str) -> str:
    """Apply a unified diff's hunks to `text` by line content, ignoring line numbers (see pr_rewrite)."""
    lines = text.splitlines(keepends=True)
    for hunk in re.split(r"^@@[^\n]*@@[^\n]*\n", diff, flags=re.M)[1:]:
        anchor = 0
        for raw in hunk.splitlines():
            if not raw or raw.startswith("\\"):
                continue
            tag, body = raw[0], raw[1:] + "\n"
            if tag == " ":
                found = next((i for i in range(anchor, len(lines)) if lines[i] == body), None)
                if found is not None:
                    anchor = found + 1
            elif tag == "-":
                found = next((i for i in range(anchor, len(lines)) if lines[i] == body), None)
                if found is not None:
                    del lines[found]
                    anchor = found
            elif tag == "+":
                lines.insert(anchor, body)
                anchor += 1
    return "".join(lines)


def offline_responder(request: dict) -> str:
    """The deterministic offline "model" of the embedded default (see the comment above `_TASK_RE`)."""
    text = f"{request.get('system', '')}\n{request.get('user', '')}"
    m = _TASK_RE.search(text)
    task = m.group(1) if m else ""
    user = str(request.get("user", ""))
    if task == "problem_statement":
        return _statement(user)
    block = code_block(user)
    if block is not None and block.endswith("\n\n"):
        block = block[:-1]  # the prompt puts a newline of its own between the text and the closing fence
    if task in ("lm_modify", "lm_rewrite", "pr_rewrite") and block is None:
        return "I could not find the code in the prompt."
    if task == "lm_modify":
        return fence_block(_modify(block))
    if task == "lm_rewrite":
        return fence_block(_rewrite(block))
    if task == "pr_rewrite":
        return fence_block(_lenient_apply(block, _diff_block(user)))
    return "I do not recognise this task."
