"""How many recorded Claude Code sessions fit the SFT recipe's max_length, rendered as SFT rows.

Each recorded session (tests/fixtures/sessions, real Claude Code 2.1.332) goes through the same path as a
collected expert trajectory: `read_claude_code` -> tool-call row (Claude Code's system prompt and tool
schemas included) -> `build_example` with the tokenizer's chat template. Prints one JSON line: per session
its characters and tokens, and the share within `--max-length` (default 32,768, SWE-smith's max_seq_len).
The default tokenizer is the tiny test one (a small vocabulary, so more tokens per character than a real
model's); pass `--tokenizer <dir>` (e.g. a downloaded Qwen2.5-Coder) for the figure that matters.
Run: .venv/bin/python benchmarks/bench_sft_lengths.py [--tokenizer DIR] [--max-length 32768]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sweflow.train.sft import build_example  # noqa: E402
from sweflow.trajectories.claude_transcripts import read_claude_code, tool_call_row  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: the tiny test tokenizer)")
    ap.add_argument("--max-length", type=int, default=32_768)
    ap.add_argument("--sessions", default=str(ROOT / "tests" / "fixtures" / "sessions"))
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    if args.tokenizer is None:
        from sweflow.offline.tiny_model import tiny_tokenizer_path

        args.tokenizer = str(tiny_tokenizer_path())
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    sessions = []
    for path in sorted(Path(args.sessions).glob("*.json.gz")):
        data = json.loads(gzip.decompress(path.read_bytes()))
        record = {
            "id": path.name.removesuffix(".json.gz"),
            "instance_id": data["instance_id"],
            "turns": data["turns"],
        }
        row = tool_call_row(read_claude_code(record, where=str(path)))
        ex = build_example(row, tok, 10**9)
        chars = len(json.dumps(row["messages"], ensure_ascii=False)) + len(
            json.dumps(row["tools"], ensure_ascii=False)
        )
        sessions.append(
            {"id": record["id"], "chars": chars, "tokens": ex["tokens"], "messages": len(row["messages"])}
        )
    fits = [s for s in sessions if s["tokens"] <= args.max_length]
    print(json.dumps({
        "tokenizer": Path(args.tokenizer).name, "vocab": len(tok), "max_length": args.max_length,
        "sessions": len(sessions), "fit": len(fits), "share_fit": round(len(fits) / max(1, len(sessions)), 3),
        "tokens_min": min(s["tokens"] for s in sessions), "tokens_max": max(s["tokens"] for s in sessions),
        "chars_per_token": round(sum(s["chars"] for s in sessions) / sum(s["tokens"] for s in sessions), 2),
        "per_session": sessions,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
