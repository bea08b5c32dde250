"""The synthesis LM: the two-API client, the scripted endpoint and offline model, the LM bug strategies,
the problem-statement writer and its leak checker. Nothing leaves 127.0.0.1."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sweflow.errors import SmithError
from sweflow.offline.scripted_lm import (
    BUG_DIFF_BEGIN,
    OUTPUT_BEGIN,
    OUTPUT_END,
    ReplyStatus,
    ScriptedLM,
    _small_change,
    offline_responder,
)
from sweflow.sample import materialize_repo
from sweflow.smith import gitrepo, lm
from sweflow.smith.lm import LMSettings, code_block, complete, fence_block, lm_settings
from sweflow.smith.lm_strategies import lm_candidates
from sweflow.smith.statements import (
    PROMPTS,
    leaks,
    prompt_sha256,
    render_prompt,
    smith_prompt,
    write_statement,
)
from sweflow.util import free_port, sha256_bytes

# A key in a variable whose name has no secret marker, so only the client's own redaction can hide it.
KEY_ENV = "SMITH_LM_PASS"
KEY = "not-a-token-shape-0123456789"


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch):
    monkeypatch.setattr(lm, "_BACKOFF", 0.001)


# ---- the client


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_complete_sends_the_request_shape_of_each_api(api):
    with ScriptedLM(["the answer"]) as server:
        settings = LMSettings(server.url, api=api, model="m-1", temperature=0.25, max_tokens=77)
        assert complete(settings, "be brief", "what is it?") == "the answer"
    assert server.requests == [
        {
            "api": api,
            "model": "m-1",
            "system": "be brief",
            "user": "what is it?",
            "temperature": 0.25,
            "max_tokens": 77,
        }
    ]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_the_key_comes_from_the_named_variable_and_is_required_by_the_server(api, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    with ScriptedLM(["ok"], api_key=KEY) as server:
        assert complete(LMSettings(server.url, api=api, api_key_env=KEY_ENV), "s", "u") == "ok"
        with pytest.raises(SmithError) as err:
            complete(LMSettings(server.url, api=api), "s", "u")
        monkeypatch.setenv("SMITH_LM_OTHER", "wrong-value-0123456789")
        with pytest.raises(SmithError) as wrong:
            complete(LMSettings(server.url, api=api, api_key_env="SMITH_LM_OTHER"), "s", "u")
    assert "HTTP 401" in str(err.value) and server.url in str(err.value)
    assert "HTTP 401" in str(wrong.value) and "wrong-value" not in str(wrong.value)
    assert len(server.requests) == 1  # only the authorised request reached the responder


def test_a_missing_key_variable_is_named_not_sent(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(SmithError, match=KEY_ENV):
        complete(LMSettings("http://127.0.0.1:9/v1", api_key_env=KEY_ENV), "s", "u")


def test_a_500_is_retried_then_succeeds():
    with ScriptedLM([ReplyStatus(500, "overloaded"), "fine"]) as server:
        assert complete(LMSettings(server.url, attempts=3), "s", "u") == "fine"
    assert len(server.requests) == 2
    with ScriptedLM([ReplyStatus(503)]) as server, pytest.raises(SmithError, match="HTTP 503"):
        complete(LMSettings(server.url, attempts=2), "s", "u")
    assert len(server.requests) == 2


def test_a_400_is_one_line_without_the_key_and_not_retried(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    with ScriptedLM([ReplyStatus(400, f"bad request\nfrom key {KEY}")]) as server:
        with pytest.raises(SmithError) as err:
            complete(LMSettings(server.url, api_key_env=KEY_ENV, attempts=3), "s", "u")
    msg = str(err.value)
    assert "\n" not in msg and "HTTP 400" in msg and server.url in msg and "bad request" in msg
    assert KEY not in msg
    assert len(server.requests) == 1


def test_a_connection_failure_is_retried_and_named():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(SmithError, match="no HTTP status") as err:
        complete(LMSettings(url, attempts=2, timeout_sec=5), "s", "u")
    assert url in str(err.value)


def test_the_anthropic_sdk_talks_to_the_scripted_endpoint():
    anthropic = pytest.importorskip("anthropic")
    with ScriptedLM(["hi there"], api_key="k-123") as server:
        client = anthropic.Anthropic(base_url=server.url.removesuffix("/v1"), api_key="k-123", max_retries=0)
        msg = client.messages.create(
            model="claude-x", max_tokens=10, system="sys", messages=[{"role": "user", "content": "hello"}]
        )
    assert msg.content[0].text == "hi there"
    assert server.requests[0]["system"] == "sys" and server.requests[0]["user"] == "hello"


def test_lm_settings_validates_and_the_record_hides_credentials():
    s = lm_settings({"endpoint": "https://u:pw@lm.example/v1/", "api": "anthropic", "api_key_env": "LM_KEY"})
    assert s.endpoint == "https://u:pw@lm.example/v1" and s.api == "anthropic" and s.attempts == 3
    rec = s.record()
    assert set(rec) == {"endpoint", "api", "model", "temperature", "max_tokens"}
    assert "pw" not in rec["endpoint"] and "LM_KEY" not in str(rec)
    bad = [
        ({"endpoint": "http://x/v1", "api": "gemini"}, "api"),
        ({"endpoint": "ftp://x/v1"}, "endpoint"),
        ({"endpoint": "http://x/v1", "temperature": "hot"}, "temperature"),
        ({"endpoint": "http://x/v1", "max_tokens": True}, "max_tokens"),
        ({"endpoint": "http://x/v1", "attempts": 0}, "attempts"),
        ({"endpoint": "http://x/v1", "api_key_env": "sk-pasted key"}, "api_key_env"),
        ({"endpoint": "http://x/v1", "api_key": "sk-secret-value"}, "api_key"),
        ({"endpoint": "http://x/v1", "modle": "typo"}, "modle"),
    ]
    for cfg, field in bad:
        with pytest.raises(SmithError) as err:
            lm_settings(cfg)
        assert err.value.field == field, cfg
        assert "pasted" not in str(err.value) and "sk-secret" not in str(err.value)


def test_code_block_takes_the_first_python_or_bare_block():
    assert code_block("x\n```python\na = 1\n```\n```python\nb = 2\n```") == "a = 1\n"
    assert code_block("```diff\n-a\n+b\n```\n```\nc = 3\n```\n") == "c = 3\n"
    assert code_block("```py\nd = 4\n```") == "d = 4\n"
    assert code_block("```js\nx\n```") is None
    assert code_block("no code here") is None
    assert code_block("```python\nunclosed = 1\n") is None
    inner = 'doc = """\n```python\nx\n```\n"""\n'
    assert code_block(fence_block(inner)) == inner
    assert code_block("```diff\n-a\n```", "diff") == "-a\n"


# ---- prompts


def test_prompts_are_versioned_files_with_their_markers():
    for name in PROMPTS:
        text = smith_prompt(name)
        assert f"Task: {name}\n" in text
        assert prompt_sha256(name) == sha256_bytes(text.encode("utf-8"))
        assert smith_prompt(f"{name}.md") == text
    assert OUTPUT_BEGIN in smith_prompt("problem_statement") and BUG_DIFF_BEGIN in smith_prompt(
        "problem_statement"
    )
    filled = render_prompt("lm_modify", path="a.py", name="f", function="def f():\n    return '$x {y}'")
    assert "return '$x {y}'" in filled and "$function" not in filled
    with pytest.raises(SmithError, match=r"\$function"):
        render_prompt("lm_modify", path="a.py", name="f")
    with pytest.raises(SmithError, match="unknown prompt"):
        smith_prompt("../../etc/passwd")


# ---- the offline model


def test_the_offline_fallback_change_flips_a_comparison_or_bumps_an_int():
    assert _small_change("def f(a):\n    return a < 3\n") == "def f(a):\n    return a <= 3\n"
    assert _small_change("def f(a):\n    return a != 'x<y'\n") == "def f(a):\n    return a == 'x<y'\n"
    assert _small_change("def f(a):\n    return a + 2\n") == "def f(a):\n    return a + 3\n"
    assert _small_change("def f(a):\n    return a\n") == "def f(a):\n    return a\n"


def test_the_offline_model_answers_each_task_from_its_marker():
    stub = 'def f(a):\n    """Doc."""\n    raise NotImplementedError\n'
    user = render_prompt("lm_rewrite", path="m.py", name="f", stub=stub, context="x = 1\n" + stub)
    assert (
        code_block(offline_responder({"system": "", "user": user}))
        == 'def f(a):\n    """Doc."""\n    return None\n'
    )
    file = "A = 1\n\ndef g():\n    return A\n"
    # no hunk header: nothing to apply, the file comes back unchanged
    user = render_prompt("pr_rewrite", path="m.py", diff="-A = 2\n+A = 1", file=file)
    assert code_block(offline_responder({"system": "", "user": user})) == file
    # a hunk whose line numbers and part of whose context no longer match still applies by content
    file = "import os\nimport sys\nfrom x import a, b\nfrom x import c\n\nVERSION = '2'\n"
    diff = "@@ -10,4 +10,3 @@\n import sys\n-from x import c\n+from x import d\n gone_line()\n"
    user = render_prompt("pr_rewrite", path="m.py", diff=diff, file=file)
    got = code_block(offline_responder({"system": "", "user": user}))
    assert got == "import os\nimport sys\nfrom x import a, b\nfrom x import d\n\nVERSION = '2'\n"
    assert "recognise" in offline_responder({"system": "", "user": "hello"})


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    base = tmp_path_factory.mktemp("sample")
    info = materialize_repo(base / "r")
    tree = gitrepo.checkout(info.path, info.head, base / "w")
    return info, tree, gitrepo.source_files(tree)


def _apply(work, patch, reverse=False):
    gitrepo.run_git(work, "apply", *(["-R"] if reverse else []), "-", input=patch)


def _run(strategy, sample, responder=offline_responder, **kw):
    info, tree, files = sample
    with ScriptedLM(responder) as server:
        settings = LMSettings(server.url, model="offline")
        cands, failures = lm_candidates(
            tree,
            files,
            repo="sweflow/calclib",
            commit=info.head,
            strategy=strategy,
            settings=settings,
            seed=7,
            **kw,
        )
    return cands, failures, server.requests


@pytest.mark.parametrize("strategy", ["lm_modify", "lm_rewrite"])
def test_lm_candidates_on_the_sample_repository(strategy, sample, tmp_path):
    info, tree, files = sample
    cands, failures, requests = _run(strategy, sample)
    assert len(cands) >= 5 and failures == []
    assert len(requests) == len(cands)
    id_re = re.compile(rf"^sweflow__calclib\.{info.head[:8]}\.{strategy}__[0-9a-f]{{8}}$")
    from sweflow.smith.procedural import entities

    work = gitrepo.checkout(info.path, info.head, tmp_path / "work")
    for c in cands:
        assert id_re.match(c.instance_id), c.instance_id
        assert gitrepo.applies(tree, c.patch)
        assert c.meta["model"] == "offline" and c.meta["prompt_sha256"] == prompt_sha256(strategy)
        path, qualname = c.meta["entity"].split("::")
        assert c.files == (path,) and qualname in c.meta["explanation"]
        # only the entity's lines change: everything before and after it is byte-identical
        _apply(work, c.patch)
        old = (tree / path).read_text().splitlines(keepends=True)
        new = (work / path).read_text().splitlines(keepends=True)
        _apply(work, c.patch, reverse=True)
        node = dict(entities("".join(old), min_complexity=0))[qualname]
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        tail = len(old) - node.end_lineno
        assert new[: start - 1] == old[: start - 1] and new[len(new) - tail :] == old[node.end_lineno :]
        ast.parse("".join(new))
    again, _, _ = _run(strategy, sample)
    assert [c.to_dict() for c in again] == [c.to_dict() for c in cands]


def test_lm_rewrite_never_shows_the_original_body(sample):
    cands, _, requests = _run("lm_rewrite", sample)
    convert = [r for r in requests if "name `convert`" in r["user"] or "`convert`" in r["user"]]
    assert convert, "convert is one of the sample's entities"
    assert all("table[from_unit] / table[to_unit]" not in r["user"] for r in convert)
    assert all("raise NotImplementedError" in r["user"] for r in requests)
    assert any("return None" in c.patch for c in cands)


def test_shards_partition_and_max_candidates_samples(sample):
    everything = {c.instance_id for c in _run("lm_modify", sample)[0]}
    parts = [{c.instance_id for c in _run("lm_modify", sample, shard=i, shards=2)[0]} for i in range(2)]
    assert parts[0] | parts[1] == everything and not parts[0] & parts[1]
    few = _run("lm_modify", sample, max_candidates=3)[0]
    assert len(few) == 3 and {c.instance_id for c in few} <= everything
    assert [c.instance_id for c in _run("lm_modify", sample, max_candidates=3)[0]] == [
        c.instance_id for c in few
    ]


def test_bad_replies_become_failure_records(sample):
    cands, failures, requests = _run("lm_modify", sample, responder=lambda r: "Sure! Here is the code.")
    assert cands == [] and len(failures) == len(requests) > 0
    assert {f["reason"] for f in failures} == {"no python code block in the reply"}
    assert all("::" in f["entity"] for f in failures)
    wrong = "```python\ndef something_else():\n    return 1\n```"
    _, failures, _ = _run("lm_rewrite", sample, responder=lambda r: wrong)
    assert failures and all("not" in f["reason"] and "something_else" in f["reason"] for f in failures)
    _, failures, _ = _run("lm_modify", sample, responder=lambda r: "```python\ndef (:\n```")
    assert failures and all(f["reason"].startswith("the reply does not parse") for f in failures)
    _, failures, _ = _run("lm_modify", sample, responder=[ReplyStatus(400, "no")])
    assert failures and all("request failed" in f["reason"] and "HTTP 400" in f["reason"] for f in failures)
    echo = _run("lm_modify", sample, responder=lambda r: "```python\n" + code_block(r["user"]) + "```")
    assert echo[0] == [] and {f["reason"] for f in echo[1]} == {"no change"}


def test_an_unknown_strategy_is_refused(sample):
    with pytest.raises(SmithError, match="strategy"):
        _run("procedural", sample)


# ---- leaks and statements

FIX = """diff --git a/calclib/evaluator.py b/calclib/evaluator.py
--- a/calclib/evaluator.py
+++ b/calclib/evaluator.py
@@ -1,4 +1,4 @@
 def sub(a, b):
-    return a + b
+    return a - b
+    else:
+    return None
+    result = compute_total(a, b)
"""
TESTS = ["tests/test_evaluator.py::test_sub", "tests/test_evaluator.py::test_many[3-4]"]


def test_leaks_finds_each_kind_and_passes_a_clean_text():
    assert leaks("Subtracting gives the sum: sub(5, 3) is 8, expected 2.", patch=FIX, tests=TESTS) == []
    assert leaks("Maybe it should be `return   a - b`?", patch=FIX, tests=TESTS) == [
        "fix line: 'return a - b'"
    ]
    assert leaks("see result = compute_total(a, b)", patch=FIX, tests=TESTS) == [
        "fix line: 'result = compute_total(a, b)'"
    ]
    # short lines, keyword-only lines and context/removed lines are not leaks
    assert leaks("it should return None or else: fail; return a + b", patch=FIX, tests=TESTS) == []
    assert leaks("test_sub fails", patch=FIX, tests=TESTS) == ["test name: test_sub"]
    assert leaks("test_many is red", patch=FIX, tests=TESTS) == ["test name: test_many"]
    assert leaks("in tests/test_evaluator.py", patch=FIX, tests=TESTS) == [
        "test file: tests/test_evaluator.py"
    ]
    assert leaks("look at calclib/evaluator.py", patch=FIX, tests=[]) == ["file path: calclib/evaluator.py"]
    assert leaks("look at evaluator.py", patch=FIX, tests=[]) == ["file path: evaluator.py"]
    short = FIX.replace("evaluator.py", "stats.py")
    assert (
        leaks("the stats.py module", patch=short, tests=[]) == []
    )  # a basename of 8 characters is too common
    assert leaks("calclib.evaluator.sub is wrong", patch=FIX, tests=["test_other"]) == []


TASK = {
    "instance_id": "sweflow__calclib.abcdef12.lm_modify__00000000",
    "patch": FIX,
    "bug_patch": FIX.replace("+    return a - b", "+    return a + b"),
    "FAIL_TO_PASS": TESTS,
}
CLEAN = "Subtraction is broken\n\nCalling `calclib.evaluator.sub(5, 3)` returns 8, but 2 is expected."


def test_write_statement_retries_after_a_leak():
    leaking = "test_sub fails: the function should do `return a - b` in calclib/evaluator.py, as before."
    with ScriptedLM([leaking, CLEAN]) as server:
        settings = LMSettings(server.url, model="m-s", temperature=0.5)
        out = write_statement(TASK, settings=settings, failing_output="E   assert 8 == 2")
    assert out["problem_statement"] == CLEAN and out["attempts"] == 2
    assert [r["attempt"] for r in out["rejected"]] == [1]
    assert set(out["rejected"][0]["reasons"]) == {
        "fix line: 'return a - b'",
        "test name: test_sub",
        "file path: calclib/evaluator.py",
    }
    assert out["model"] == "m-s" and out["temperature"] == 0.5 and out["endpoint"] == server.url
    assert out["prompt_sha256"] == prompt_sha256("problem_statement")
    first, second = server.requests
    assert "E   assert 8 == 2" in first["user"] and "test name: test_sub" not in first["user"]
    assert "test name: test_sub" in second["user"]


def test_write_statement_gives_up_after_its_attempts():
    with ScriptedLM(
        ["short", "test_sub is failing and nobody knows why, please have a look at it"]
    ) as server:
        out = write_statement(TASK, settings=LMSettings(server.url), failing_output="boom", attempts=3)
    assert out["problem_statement"] is None and out["attempts"] == 3 and len(server.requests) == 3
    assert out["rejected"][0]["reasons"][0].startswith("too short")
    assert [r["reasons"] for r in out["rejected"][1:]] == [["test name: test_sub"]] * 2


def test_write_statement_bounds_the_output():
    with ScriptedLM([CLEAN]) as server:
        write_statement(TASK, settings=LMSettings(server.url), failing_output="x" * 50_000 + "\nTHE END")
    user = server.requests[0]["user"]
    section = user[user.index(OUTPUT_BEGIN) : user.index(OUTPUT_END)]
    assert len(section) < 8200 and "THE END" in section and "omitted" in section


REALISTIC = """============================= test session starts ==============================
platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0
rootdir: /tmp/work/calclib
collected 30 items

tests/test_evaluator.py ..F.                                             [ 13%]
tests/test_parser.py ......                                              [ 33%]

=================================== FAILURES ===================================
___________________________________ test_sub ___________________________________

    def test_sub():
>       assert calc("5 - 3") == 2
E       AssertionError: assert 8 == 2
E        +  where 8 = calc('5 - 3')

tests/test_evaluator.py:14: AssertionError
________________________________ test_many[3-4] ________________________________

a = 3, b = 4

    def test_many(a, b):
>       Evaluator().evaluate(parse(f"{a} - {b}"))

calclib/evaluator.py:52: in evaluate
    return a + b
E   ZeroDivisionError: division by zero

tests/test_evaluator.py:30: ZeroDivisionError
=========================== short test summary info ============================
FAILED tests/test_evaluator.py::test_sub - AssertionError: assert 8 == 2
FAILED tests/test_evaluator.py::test_many[3-4] - ZeroDivisionError: division by zero
========================= 2 failed, 28 passed in 0.12s =========================
"""


def test_the_offline_statement_for_a_realistic_output_does_not_leak():
    with ScriptedLM(offline_responder) as server:
        out = write_statement(TASK, settings=LMSettings(server.url), failing_output=REALISTIC)
    text = out["problem_statement"]
    assert text is not None and out["attempts"] == 1, out["rejected"]
    assert leaks(text, patch=TASK["patch"], tests=TASK["FAIL_TO_PASS"]) == []
    assert "assert 8 == 2" in text and "ZeroDivisionError" in text and "calclib.evaluator" in text
    assert "After a recent change" in text and "test_" not in text and ".py" not in text


def test_offline_statements_for_real_sample_bugs_do_not_leak(sample, tmp_path):
    """Bugs the offline model makes in the sample, their real pytest output, and the statements for them."""
    info, tree, _ = sample
    cands, _, _ = _run("lm_modify", sample)
    work = gitrepo.checkout(info.path, info.head, tmp_path / "work")
    checked = 0
    for c in cands:
        _apply(work, c.patch)
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=120,
        )
        path = c.files[0]
        bugged = (work / path).read_text()
        _apply(work, c.patch, reverse=True)
        failing = re.findall(r"^FAILED (\S+)", run.stdout, re.M)
        if run.returncode != 1 or not failing:
            continue
        task = {
            "instance_id": c.instance_id,
            "patch": gitrepo.file_patch(path, bugged, (tree / path).read_text()),
            "bug_patch": c.patch,
            "FAIL_TO_PASS": failing,
        }
        with ScriptedLM(offline_responder) as server:
            out = write_statement(
                task, settings=LMSettings(server.url), failing_output=run.stdout + run.stderr
            )
        assert out["problem_statement"] is not None, (c.meta["entity"], out["rejected"])
        assert leaks(out["problem_statement"], patch=task["patch"], tests=failing) == []
        checked += 1
        if checked == 2:
            break
    assert checked >= 2


def test_prompt_files_are_package_data():
    text = Path(__file__).resolve().parents[2].joinpath("pyproject.toml").read_text()
    assert '"smith/prompts/*.md"' in text
