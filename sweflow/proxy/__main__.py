"""`python -m sweflow.proxy`: run the token-recording proxy in the foreground.

Examples:
    python -m sweflow.proxy --tokenizer models/qwen/hf --engine vllm --vllm-url http://127.0.0.1:8000 --model qwen
    python -m sweflow.proxy --tokenizer /tmp/tiny --engine transformers --model /tmp/tiny
    python -m sweflow.proxy --tokenizer /tmp/tiny --engine scripted --script turns.json   (a JSON list of texts)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from sweflow.errors import SweflowError
from sweflow.proxy.engines import ScriptedEngine, TransformersEngine, VLLMEngine
from sweflow.proxy.recorder import LinearizeConfig
from sweflow.proxy.server import ProxyConfig, ProxyServer


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
    p.add_argument("--max-drift-tokens", type=int, default=8)
    p.add_argument("--implicit-sessions", action="store_true", help="create sessions on first use")
    p.add_argument("--enable-thinking", choices=["true", "false"], default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
        if args.engine == "vllm":
            engine = VLLMEngine(args.vllm_url, args.model, timeout=args.engine_timeout)
        elif args.engine == "transformers":
            engine = TransformersEngine(args.model or args.tokenizer)
        else:
            if not args.script:
                raise SweflowError("--script is required with --engine scripted", field="--script")
            with open(args.script, encoding="utf-8") as fh:
                engine = ScriptedEngine(json.load(fh), tokenizer)
        kwargs = {} if args.enable_thinking is None else {"enable_thinking": args.enable_thinking == "true"}
        config = ProxyConfig(
            max_new_tokens=args.max_new_tokens,
            max_context_tokens=args.max_context_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            engine_timeout_s=args.engine_timeout,
            implicit_sessions=args.implicit_sessions,
            chat_template_kwargs=kwargs,
            linearize=LinearizeConfig(max_drift_tokens=args.max_drift_tokens),
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
