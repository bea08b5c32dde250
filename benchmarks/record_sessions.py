"""Record real Claude Code sessions (every sample task, the gold and test_edit policies) as test fixtures.

    .venv/bin/python benchmarks/record_sessions.py                  # every sample task with a gold fix
    .venv/bin/python benchmarks/record_sessions.py --tasks sweflow__calclib-1 --out /tmp/sessions
    .venv/bin/python benchmarks/record_sessions.py --tasks sweflow__calclib-1 --caching  # cache_control on

Each session is the real Claude Code CLI in a local (bubblewrap) sandbox, its model calls answered by the
scripted policy of `sweflow.offline.policies` behind the token-recording proxy (the tiny tokenizer, messages
recorded), graded by the fresh evaluation as in the e2e check. Writes
``<out>/<instance_id>.<policy>.json.gz``: {"instance_id", "policy", "claude_version", "outcome", "turns"},
each turn what Claude Code sent (request: model, system, tools, messages, unstripped) and what the proxy
answered. Asserts that no proxy admin token, session token or sandbox token appears in a file. Prints per
session: turns, request sizes (characters of system + messages) and seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweflow.errors import DatasetError  # noqa: E402
from sweflow.offline.policies import gold_edits, gold_policy, tamper_policy  # noqa: E402
from sweflow.proxy import ProxyConfig  # noqa: E402
from sweflow.rollout.clients import HttpProxyClient  # noqa: E402
from sweflow.rollout.e2e import POLICIES, run_policy  # noqa: E402
from sweflow.rollout.types import RolloutConfig  # noqa: E402
from sweflow.util import atomic_write  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "sessions"
CLAUDE_VERSION = "2.1.332"
MAKERS = {"gold": gold_policy, "test_edit": tamper_policy}
TURN_KEYS = ("index", "model", "request", "response", "stop_reason", "tool_calls", "aborted")
# Credentials in any form a request could carry them; none may appear in a fixture.
SECRET_PATTERNS = re.compile(r"Bearer |sk-ant-|x-api-key|ANTHROPIC_(AUTH_TOKEN|API_KEY)=\S")


class RecordingProvider:
    """A provider that remembers the blackbox token of every sandbox it creates (to check for leaks)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.tokens: list[str] = []

    def create(self, *args: Any, **kwargs: Any) -> Any:
        sb = self.inner.create(*args, **kwargs)
        self.tokens.append(str(getattr(sb, "blackbox_token", "") or ""))
        return sb

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextlib.contextmanager
def session_tokens() -> Iterator[list[str]]:
    """Every session token the proxy hands out while inside (the agent's only credential)."""
    seen: list[str] = []
    original = HttpProxyClient.create_session

    def create_session(self: HttpProxyClient, *args: Any, **kwargs: Any) -> str:
        token = original(self, *args, **kwargs)
        seen.append(str(token))
        return token

    HttpProxyClient.create_session = create_session  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        HttpProxyClient.create_session = original  # type: ignore[method-assign]


def request_chars(req: dict[str, Any]) -> int:
    """Characters of the system prompt and messages as JSON (tools left out: they are the same each turn)."""
    return len(json.dumps(req.get("system"), ensure_ascii=False)) + len(
        json.dumps(req.get("messages"), ensure_ascii=False)
    )


def fixture(instance_id: str, policy: str, report: dict[str, Any], turns: list[dict]) -> dict[str, Any]:
    return {
        "instance_id": instance_id,
        "policy": policy,
        "claude_version": CLAUDE_VERSION,
        "outcome": {k: report[k] for k in ("status", "reward", "failure_reason", "num_turns")},
        # token_build/lineage: how the proxy (tiny tokenizer, tito mode) built each prompt when recorded
        "turns": [
            {
                **{k: t.get(k) for k in TURN_KEYS},
                "token_build": t.get("token_build"),
                "lineage": t.get("lineage"),
            }
            for t in turns
        ],
    }


def write_fixture(path: Path, record: dict[str, Any], secrets_: list[str]) -> int:
    """Gzip JSON (mtime 0); refuses to write a record holding a credential.

    Keys keep the order Claude Code sent them in (no sort_keys): a chat template renders tool inputs in
    that order, so sorting would change the very text whose tokens are measured.
    """
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    leaked = [s[:6] + "..." for s in secrets_ if s and s in text]
    assert not leaked, f"{path.name}: a token appears in the recorded session: {leaked}"
    assert not SECRET_PATTERNS.search(text), (
        f"{path.name}: a credential pattern appears: {SECRET_PATTERNS.search(text)}"
    )
    data = gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)
    atomic_write(path, data)
    return len(data)


def setup(tmp: Path, ids: list[str], *, caching: bool = False) -> dict[str, Any]:
    """The sample repo, one local template per task, the Claude binary and each task's training row."""
    from sweflow.dataset.convert import ConvertOptions, convert_instance
    from sweflow.sample import load_task, materialize_repo
    from sweflow.sandbox.artifacts import artifact_paths, prepare_artifacts
    from sweflow.sandbox.build import build_and_record
    from sweflow.sandbox.images import cache_dir
    from sweflow.sandbox.local import LocalProvider
    from sweflow.sandbox.spec import TemplateSpec
    from sweflow.stages.data import harness_from_config

    art_dir = cache_dir().parent / "artifacts" / CLAUDE_VERSION
    paths = artifact_paths(art_dir, prepare_artifacts(art_dir, CLAUDE_VERSION))
    repo = materialize_repo(tmp / "calclib")
    provider = LocalProvider(tmp / "templates")
    harness = harness_from_config("swebench", "sample")
    opts = ConvertOptions(
        dataset="sample",
        split="train",
        provider="local",
        sandbox_timeout_sec=900,
        backend_options={
            "max_turns": 12,
            "permission_mode": "acceptEdits",
            "setting_sources": [],
            **({"prompt_caching": True} if caching else {}),
        },
    )
    rows = {}
    for iid in ids:
        inst = load_task(iid)
        image = f"sweflow-sample/{iid}:latest"
        spec = TemplateSpec(image=image, claude_binary=paths["claude"])
        rec = build_and_record(
            provider, image, tmp / f"{iid}.record.json", spec=spec, attempts=1,
            repo=repo.path, commit=inst["base_commit"],
        )  # fmt: skip
        assert rec["ok"], rec
        evaluator = harness.evaluator_command(inst, timeout_sec=300, marker="SWEFLOW_REWARD_JSON=")
        rows[iid] = convert_instance(inst, template=rec["template"], evaluator_cmd=evaluator, opts=opts)
    return {"provider": provider, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    from sweflow.sample import sample_rows
    from sweflow.stages.e2e import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tasks", nargs="*", help="instance ids (default: every train sample task with a gold fix)"
    )
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--caching",
        action="store_true",
        help="prompt caching on (cache_control in requests); files <id>.<policy>.cache.json.gz",
    )
    args = ap.parse_args(argv)
    ids = []
    for iid in args.tasks or [r["instance_id"] for r in sample_rows("train")]:
        try:
            gold_edits(iid)
            ids.append(iid)
        except DatasetError:
            print(f"{iid}: no gold policy, skipped")
    tokenizer = load_tokenizer(None)  # the tiny tokenizer (tests.fixtures.tiny_model)
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sweflow-record-sessions-") as tmp:
        t = time.monotonic()
        env = setup(Path(tmp), ids, caching=args.caching)
        print(f"setup: {len(ids)} local templates in {time.monotonic() - t:.1f}s")
        provider = RecordingProvider(env["provider"])
        print(
            f"{'session':<32} {'turns':>5} {'ok':>3} {'request chars (system+messages) per turn':<48} {'KB':>5} {'s':>5}"
        )
        total = 0
        for iid in ids:
            row = env["rows"][iid]
            for name in POLICIES:
                policy = MAKERS[name](iid, tokenizer, "/testbed")
                admin = secrets.token_urlsafe(32)
                pcfg = ProxyConfig(max_new_tokens=4096, record_messages=True, admin_token=admin)
                cfg = RolloutConfig(max_concurrency=1, session_prefix=f"rec-{name}.")
                turns: list[dict[str, Any]] = []
                t = time.monotonic()
                with session_tokens() as tokens:
                    report = run_policy(
                        row, policy, provider=provider, tokenizer=tokenizer, config=cfg,
                        proxy_config=pcfg, turns_out=turns,
                    )  # fmt: skip
                secs = time.monotonic() - t
                # a session that did not end as the e2e check expects is no fixture
                assert report["ok"] and tokens and turns and all(x.get("request") for x in turns), report
                rec = fixture(iid, name, report, turns)
                size = write_fixture(
                    args.out / f"{iid}.{name}{'.cache' if args.caching else ''}.json.gz",
                    rec,
                    [admin, *tokens, *provider.tokens],
                )
                total += size
                sizes = ",".join(str(request_chars(x["request"])) for x in turns)
                print(
                    f"{iid + '.' + name:<32} {len(turns):>5} {'y' if report['ok'] else 'n':>3} {sizes:<48} {size / 1024:>5.1f} {secs:>5.1f}"
                )
    print(f"total: {total / 1024:.1f} KB in {time.monotonic() - t_all:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
