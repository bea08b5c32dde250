"""The Qwen3.5 token building needs nothing the verl env lacks: it builds in an interpreter where `import trl`
fails and gives the recipe's ids there; when it cannot be built it says so (an error for build_model
qwen3_5, a warning for auto, which then uses the tokenizer's own template)."""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweflow.proxy import qwen35_template, replay, tito
from sweflow.proxy.server import ProxyConfig, ProxyServer

try:
    from tests.unit import test_proxy_recipe_tokens as recipe
    from tests.unit.conftest_proxy import tiny_tokenizer, tiny_tokenizer_path
except ModuleNotFoundError:
    import test_proxy_recipe_tokens as recipe  # type: ignore[no-redef]
    from conftest_proxy import tiny_tokenizer, tiny_tokenizer_path  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]

# Run in a fresh interpreter: a meta-path finder refuses `trl` (as in the verl env, which installs none), then
# the proxy replays the recorded session with build_model qwen3_5 and prints each call's prompt ids, and
# tries build_model qwen3_5 on a tokenizer whose template is not Qwen3.5's.
CHILD = """
import importlib.abc, json, sys

class NoTrl(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "trl" or name.startswith("trl."):
            raise ModuleNotFoundError(f"No module named {name!r} (not in this env)", name=name)
        return None

sys.meta_path.insert(0, NoTrl())
try:
    import trl  # noqa: F401
    sys.exit("trl is importable")
except ModuleNotFoundError:
    pass

import gzip
from transformers import AutoTokenizer
from sweflow.proxy import replay
from sweflow.proxy.server import ProxyConfig, ProxyServer

qwen_dir, tiny_dir, session, reasoning = sys.argv[1:5]
prompts = []
orig = replay.ReplayEngine.generate

def spy(self, prompt_ids, sampling):
    prompts.append(list(prompt_ids))
    return orig(self, prompt_ids, sampling)

replay.ReplayEngine.generate = spy
with gzip.open(session, "rt", encoding="utf-8") as fh:
    turns = json.load(fh)["turns"]
tok = AutoTokenizer.from_pretrained(qwen_dir)
out = replay.replay_session(turns, tok, mode="tito", family="qwen3_5", reasoning=reasoning)
try:
    ProxyServer(replay.ReplayEngine(), AutoTokenizer.from_pretrained(tiny_dir), ProxyConfig(token_build_model="qwen3_5"))
    error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"prompts": prompts, "samples": out["samples"], "error": error, "trl": "trl" in sys.modules}))
"""


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> Path:
    """A tokenizer folder like a Qwen3.5 checkpoint's: the tiny tokenizer with the stock Qwen3.5 template."""
    tok = recipe.qwen_tokenizer()
    path = tmp_path_factory.mktemp("qwen35-tokenizer")
    tok.save_pretrained(path)
    return path


def test_the_qwen3_5_runtime_builds_without_trl_and_gives_the_recipes_ids(qwen_dir, monkeypatch):
    session = recipe.sessions()[0]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(qwen_dir), tiny_tokenizer_path(), str(session), recipe.REASONING],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    child = json.loads(run.stdout.strip().splitlines()[-1])
    assert child["trl"] is False and child["samples"] == 1
    # without TRL and without a Qwen3.5 tokenizer there is nothing to derive from: a clear error
    assert child["error"].startswith("TemplateError") and "not installed" in child["error"], child["error"]
    # the same ids as here, and those are the recipe's
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen_dir)
    cap = recipe.Capture(monkeypatch)
    replay.replay_session(
        recipe.load(session), tok, mode="tito", family="qwen3_5", reasoning=recipe.REASONING
    )
    assert child["prompts"] == [c["prompt_ids"] for c in cap.calls]
    got = recipe.compare(cap.calls, tok)
    assert got["calls_agree"] == got["calls"] == len(child["prompts"]) >= 4, got


def _broken_qwen_tokenizer():
    """A Qwen3.5-looking template one of whose edits finds no anchor (the reminder block is gone)."""
    tok = copy.deepcopy(tiny_tokenizer())
    stock = recipe.qwen_tokenizer().chat_template
    start, end = stock.index("\\n\\n<IMPORTANT>"), stock.index("</IMPORTANT>") + len("</IMPORTANT>")
    tok.chat_template = stock[:start] + stock[end:]
    assert qwen35_template.looks_like_qwen35(tok.chat_template)
    return tok


def test_auto_says_so_when_a_qwen3_5_template_cannot_be_built_and_qwen3_5_refuses(caplog):
    tok = _broken_qwen_tokenizer()
    with caplog.at_level(logging.WARNING, logger="sweflow.proxy"):
        assert tito.suffix_template("auto", tok) is None
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "looks like Qwen3.5" in warning.getMessage() and "<IMPORTANT>" in warning.getMessage()
    server = ProxyServer(replay.ReplayEngine(), tok, ProxyConfig(token_build_model="auto"))
    try:
        assert server._suffix is not None and server._suffix.template is None and not server._suffix.recipe
    finally:
        server._httpd.server_close()
    with pytest.raises(qwen35_template.TemplateError, match="reminder"):
        ProxyServer(replay.ReplayEngine(), tok, ProxyConfig(token_build_model="qwen3_5"))


def test_qwen3_5_on_another_tokenizer_swaps_the_recipes_template_in_when_trl_has_the_stock_one():
    """The recipe renders with its template whatever the tokenizer's own; here the stock text comes from
    TRL (the verl env has none, where the error above applies)."""
    recipe.qwen_tokenizer()  # skips without TRL's copy
    tiny = tiny_tokenizer()
    assert tito.detect_family(tiny) == "generic"
    template = tito.suffix_template("qwen3_5", tiny)
    assert template == qwen35_template.derive(qwen35_template.trl_stock_template())
