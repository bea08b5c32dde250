"""`python -m sweflow.proxy`: run the token-recording proxy in the foreground.

The admin token (every endpoint but Messages and /health needs it): read from --admin-token-file, else
$SWEFLOW_PROXY_ADMIN_TOKEN; with neither, a random one is generated, which needs --write-admin-token PATH
(written 0600, also usable to store a given token there). The token is never printed or logged.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import sys

from sweflow.errors import SweflowError
from sweflow.proxy.engines import TransformersEngine, VLLMEngine
from sweflow.proxy.recorder import LinearizeConfig
from sweflow.proxy.server import ProxyConfig, ProxyServer

ADMIN_TOKEN_ENV = "SWEFLOW_PROXY_ADMIN_TOKEN"


# Examples:
#     python -m sweflow.proxy --tokenizer models/qwen/hf --engine vllm --vllm-url http://127.0.0.1:8000 --model qwen
#     python -m sweflow.proxy --tokenizer /tmp/tiny --engine transformers --model /tmp/tiny
#     python -m sweflow.proxy --tokenizer /tmp/tiny --engine scripted --script turns.json   (a JSON list of texts)
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sweflow.proxy", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--tokenizer", required=True, help="path or name loadable by AutoTokenizer (local files only)"
    )
    p.add_argument("--engine", choices=["vllm", "transformers", "scripted"], default="vllm")
    p.add_argument("--vllm-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="", help="vLLM served model name, or the transformers model path")
    p.add_argument("--script", help="scripted engine: JSON file with a list of assistant turn texts")
    p.add_argument("--engine-timeout", type=float, default=600.0)
    p.add_argument("--max-new-tokens", type=int, default=16000)
    p.add_argument("--max-context-tokens", type=int, default=None)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-drift-tokens", type=int, default=8, help="render mode only")
    p.add_argument(
        "--token-build",
        choices=["tito", "render"],
        default="tito",
        help="tito: each call = the previous call's exact ids + the appended messages (the recipe's)",
    )
    p.add_argument(
        "--token-build-model",
        choices=["auto", "qwen3_5", "generic"],
        default="auto",
        help="the template family appended messages are tokenised with (auto: from the tokenizer)",
    )
    p.add_argument("--admin-token-file", help="read the admin token from this file")
    p.add_argument(
        "--write-admin-token", metavar="PATH", help="write the admin token to PATH (mode 0600) before serving"
    )
    p.add_argument("--max-body-bytes", type=int, default=ProxyConfig.max_body_bytes)
    p.add_argument("--max-prompt-tokens", type=int, default=ProxyConfig.max_prompt_tokens)
    p.add_argument("--enable-thinking", choices=["true", "false"], default=None)
    return p


def write_secret(path: str, secret: str) -> None:
    """Write `secret` to `path` readable by its owner only (replacing the file, never widening a mode)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(secret + "\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def admin_token(args: argparse.Namespace) -> str:
    """The admin token from --admin-token-file or $SWEFLOW_PROXY_ADMIN_TOKEN, else a new random one
    (which must then be written with --write-admin-token, or nobody could use the proxy)."""
    env_token = os.environ.pop(ADMIN_TOKEN_ENV, "").strip()
    if args.admin_token_file:
        try:
            with open(args.admin_token_file, encoding="utf-8") as fh:
                token = fh.read().strip()
        except OSError as exc:
            raise SweflowError(
                f"cannot read the admin token: {exc.strerror}", file=args.admin_token_file
            ) from None
        if not token:
            raise SweflowError("the admin token file is empty", file=args.admin_token_file)
    elif env_token:
        token = env_token
    elif args.write_admin_token:
        token = secrets.token_urlsafe(32)
    else:
        raise SweflowError(
            f"no admin token: pass --admin-token-file PATH, set ${ADMIN_TOKEN_ENV}, or --write-admin-token "
            "PATH to generate one",
            field="--admin-token-file",
        )
    if args.write_admin_token:
        write_secret(args.write_admin_token, token)
    return token


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        token = admin_token(args)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
        if args.engine == "vllm":
            engine = VLLMEngine(args.vllm_url, args.model, timeout=args.engine_timeout)
        elif args.engine == "transformers":
            engine = TransformersEngine(args.model or args.tokenizer)
        else:
            if not args.script:
                raise SweflowError("--script is required with --engine scripted", field="--script")
            from sweflow.offline.scripted_engine import ScriptedEngine

            with open(args.script, encoding="utf-8") as fh:
                engine = ScriptedEngine(json.load(fh), tokenizer)
        kwargs = {} if args.enable_thinking is None else {"enable_thinking": args.enable_thinking == "true"}
        config = ProxyConfig(
            max_new_tokens=args.max_new_tokens,
            max_context_tokens=args.max_context_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            engine_timeout_s=args.engine_timeout,
            admin_token=token,
            max_body_bytes=args.max_body_bytes,
            max_prompt_tokens=args.max_prompt_tokens,
            chat_template_kwargs=kwargs,
            linearize=LinearizeConfig(max_drift_tokens=args.max_drift_tokens),
            token_build_mode=args.token_build,
            token_build_model=args.token_build_model,
        )
        server = ProxyServer(engine, tokenizer, config, host=args.host, port=args.port)
    except (SweflowError, OSError, ValueError) as exc:
        print(f"sweflow.proxy: {exc}", file=sys.stderr)
        return 2
    print(f"sweflow.proxy listening on {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
