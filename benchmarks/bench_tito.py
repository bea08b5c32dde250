"""Recorded Claude Code sessions through the proxy, re-rendered (before) and token-in/token-out (after).

Replays every session in tests/fixtures/sessions/ (and the recorded prediction) with `sweflow.proxy.replay`
under the tiny tokenizer with TRL's Qwen3.5 template, each as recorded, with a system reminder from call 2 on
(a user text block after the tool results, as Claude Code adds them) and compacted at call 2; per variant:
samples, drift realignments, exact extension, the model's own tokens kept. One JSON line per session.
With a Qwen3.5 template the tito replays are also checked against the recipe's method
(tests/unit/test_proxy_recipe_tokens.py): "recipe" gives, per variant, [calls agreeing, calls, prompt ids
agreeing, prompt ids].
Run: .venv/bin/python benchmarks/bench_tito.py [--template qwen3_5_think|tiny]
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sweflow.proxy import replay, tito  # noqa: E402
from tests.fixtures.tiny_model import tiny_tokenizer_path  # noqa: E402
from tests.unit import test_proxy_recipe_tokens as recipe  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
REASONING = "I look at the code before I act."


def sessions() -> list[Path]:
    return [
        FIXTURES / "trajectories" / "claude_code_prediction.json.gz",
        *sorted((FIXTURES / "sessions").glob("*.json.gz")),
    ]


class _Patch:
    """The `setattr` half of pytest's monkeypatch, for `recipe.Capture` outside pytest."""

    def __init__(self) -> None:
        self._saved: list[tuple[object, str, object]] = []

    def setattr(self, target: object, name: str, value: object) -> None:
        self._saved.append((target, name, getattr(target, name)))
        setattr(target, name, value)

    def undo(self) -> None:
        while self._saved:
            target, name, value = self._saved.pop()
            setattr(target, name, value)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--template", default="qwen3_5_think", help="a TRL chat template name, or 'tiny'")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_path())
    reasoning = ""
    if args.template != "tiny":
        tok = copy.deepcopy(tok)
        tok.chat_template = tito.trl_template(args.template)
        reasoning = REASONING
    variants = {
        "recorded": lambda turns: turns,
        "reminder": lambda turns: replay.with_user_note(
            turns, 1, "<system-reminder>Keep going.</system-reminder>"
        ),
        "compacted": lambda turns: replay.compacted(turns, 2),
    }
    totals = {
        f"{v}/{m}": {"samples": 0, "drift_realignments": 0, "model_tokens": 0, "kept": 0, "inexact": 0}
        for v in variants
        for m in ("render", "tito")
    }
    check = args.template != "tiny"
    recipe_totals = dict.fromkeys(variants, (0, 0, 0, 0))
    for path in sessions():
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            recorded = json.load(fh)["turns"]
        row = {"session": path.name.split(".json")[0], "calls": sum(not t.get("aborted") for t in recorded)}
        for variant, edit in variants.items():
            turns = edit(recorded)
            for mode in ("render", "tito"):
                patch = _Patch()
                cap = recipe.Capture(patch) if check and mode == "tito" else None
                try:
                    out = replay.replay_session(turns, tok, mode=mode, reasoning=reasoning)
                finally:
                    patch.undo()
                if cap is not None:
                    got = recipe.compare(cap.calls, tok)
                    agree = (got["calls_agree"], got["calls"], got["ids_agree"], got["ids"])
                    row.setdefault("recipe", {})[variant] = list(agree)
                    recipe_totals[variant] = tuple(map(sum, zip(recipe_totals[variant], agree, strict=True)))
                row[f"{variant}/{mode}"] = [out["samples"], out["drift_realignments"], out["exact_extension"]]
                t = totals[f"{variant}/{mode}"]
                t["samples"] += out["samples"]
                t["drift_realignments"] += out["drift_realignments"]
                t["model_tokens"] += out["model_tokens"]
                t["kept"] += out["model_tokens_in_samples"]
                t["inexact"] += not out["exact_extension"]
        print(json.dumps(row), flush=True)  # variant/mode: [samples, drift realignments, exact extension]
    summary = {"template": args.template, "sessions": len(sessions()), "totals": totals}
    if check:
        summary["recipe"] = {v: list(t) for v, t in recipe_totals.items()}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
