"""Benchmark the token-recording proxy over real HTTP with a zero-latency engine.

Prints: per-call overhead for one session (p50/p99, JSON and SSE), calls/s and latency with N concurrent
sessions (default 64), and a leak check: every session's recorded tokens must contain only its own marker.
Exits 1 on a leak or a failed call. Run: .venv/bin/python benchmarks/bench_proxy.py [--sessions 64]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOKENS: dict[str, str] = {}  # session id -> its bearer token
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sweflow.proxy.engines import GenerateResult, SamplingParams  # noqa: E402
from sweflow.proxy.server import ProxyConfig, ProxyServer  # noqa: E402


class TailEchoEngine:
    """Zero-latency engine: answers with the prompt's last `n` tokens and a stop token (no model work)."""

    def __init__(self, n: int = 24) -> None:
        self.n = n

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        out = list(prompt_ids[-self.n :]) + sampling.stop_token_ids[:1]
        return GenerateResult(out, [-0.5] * len(out), "stop")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_session(
    client: httpx.Client, sid: str, calls: int, stream: bool, system: str, lat: list[float]
) -> list[str]:
    """One agent: a growing conversation; returns error strings."""
    errors = []
    history: list[dict] = []
    for k in range(calls):
        history.append({"role": "user", "content": f"MARK{sid}Q{k} please continue"})
        payload = {
            "model": "bench",
            "max_tokens": 64,
            "system": system,
            "messages": history,
            "stream": stream,
        }
        t0 = time.perf_counter()
        resp = client.post(
            "/v1/messages?beta=true", json=payload, headers={"Authorization": f"Bearer {TOKENS[sid]}"}
        )
        lat.append(time.perf_counter() - t0)
        if resp.status_code != 200:
            errors.append(f"{sid} call {k}: HTTP {resp.status_code} {resp.text[:120]}")
            break
        if stream:
            text = "".join(re.findall(r'"text_delta","text":"((?:[^"\\]|\\.)*)"', resp.text))
            text = text.encode().decode("unicode_escape")
        else:
            text = "".join(b.get("text", "") for b in resp.json()["content"])
        history.append({"role": "assistant", "content": text or "."})
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--calls", type=int, default=8, help="calls per session in the concurrent phase")
    ap.add_argument("--seq-calls", type=int, default=100, help="calls in the single-session phase")
    ap.add_argument(
        "--system-chars", type=int, default=4000, help="system prompt size (Claude Code's is ~40k)"
    )
    ap.add_argument(
        "--token-build",
        choices=("tito", "render"),
        default="tito",
        help="tito: exact ids + the appended messages only; render: the whole conversation per call",
    )
    ap.add_argument("--tokenizer", default=None, help="tokenizer dir (default: the tiny test tokenizer)")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    if args.tokenizer:
        tok_dir = args.tokenizer
    else:
        from tests.fixtures.tiny_model import tiny_tokenizer_path

        tok_dir = tiny_tokenizer_path()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    system = ("You are a coding agent. Follow the rules. " * (args.system_chars // 42 + 1))[
        : args.system_chars
    ]
    names = [f"b{i:03d}" for i in range(args.sessions)]
    failures: list[str] = []

    print(f"token build {args.token_build}, system prompt {args.system_chars} characters")
    with ProxyServer(TailEchoEngine(), tok, ProxyConfig(token_build_mode=args.token_build)) as proxy:
        limits = httpx.Limits(max_connections=args.sessions + 8, max_keepalive_connections=args.sessions + 8)
        admin = {"Authorization": f"Bearer {proxy.admin_token}"}
        with httpx.Client(base_url=proxy.url, timeout=120, limits=limits) as client:
            for sid in ["seq-json", "seq-sse", *names]:
                created = client.post("/session/create", json={"session_id": sid}, headers=admin)
                TOKENS[sid] = created.raise_for_status().json()["token"]

            for label, stream in (("json", False), ("sse", True)):
                lat: list[float] = []
                failures += run_session(client, f"seq-{label}", args.seq_calls, stream, system, lat)
                print(
                    f"single session {label:4s}: {len(lat)} calls  p50 {percentile(lat, 0.5) * 1e3:7.2f} ms  "
                    f"p99 {percentile(lat, 0.99) * 1e3:7.2f} ms  mean {statistics.mean(lat) * 1e3:7.2f} ms"
                )

            lat = []
            threads = []
            errors: list[list[str]] = [[] for _ in names]
            t0 = time.perf_counter()
            for i, sid in enumerate(names):
                th = threading.Thread(
                    target=lambda i=i, sid=sid: errors[i].extend(
                        run_session(client, sid, args.calls, i % 2 == 1, system, lat)
                    )
                )
                th.start()
                threads.append(th)
            for th in threads:
                th.join()
            wall = time.perf_counter() - t0
            for errs in errors:
                failures += errs
            print(
                f"{args.sessions} concurrent sessions: {len(lat)} calls in {wall:.2f} s = {len(lat) / wall:7.1f} calls/s  "
                f"p50 {percentile(lat, 0.5) * 1e3:7.2f} ms  p99 {percentile(lat, 0.99) * 1e3:7.2f} ms"
            )

            leaks = 0
            folded = 0
            for sid in names:
                traj = client.post("/trajectory/read", json={"session_id": sid}, headers=admin).json()
                if len(traj["turns"]) != args.calls:
                    failures.append(f"{sid}: {len(traj['turns'])} turns recorded, expected {args.calls}")
                folded += len(traj["samples"]) == 1
                for sample in traj["samples"]:
                    marks = set(re.findall(r"MARK(b\d{3})", tok.decode(sample["token_ids"])))
                    if marks != {sid}:
                        leaks += 1
                        failures.append(f"{sid}: sample holds markers {sorted(marks)}")
            print(
                f"leak check: {leaks} leaking samples over {args.sessions} sessions; {folded} folded into one sample"
            )

    for line in failures[:20]:
        print("FAIL", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
