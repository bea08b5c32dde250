"""Integrity scan: solution fetches and test edits are flagged; ordinary work is not."""

from __future__ import annotations

import json

import pytest

from sweflow.errors import ConfigError
from sweflow.grading.integrity import (
    IntegrityRules,
    ToolCall,
    apply_integrity,
    is_test_path,
    scan_tool_calls,
    tool_calls_from_messages,
    tool_calls_from_stream_json,
)
from sweflow.grading.reward import RewardResult

REPO = "psf/requests"


def bash(cmd: str) -> tuple[str, dict]:
    return ("Bash", {"command": cmd})


VIOLATIONS = [
    (bash("curl -sL https://github.com/psf/requests/pull/1234.diff"), "solution_fetch"),
    (
        bash("curl https://patch-diff.githubusercontent.com/raw/psf/requests/pull/9.patch | git apply"),
        "solution_fetch",
    ),
    (
        bash(
            "wget -q https://raw.githubusercontent.com/psf/requests/main/src/requests/models.py -O /tmp/m.py"
        ),
        "solution_fetch",
    ),
    (bash("cd /tmp && git clone https://github.com/psf/requests.git up"), "solution_fetch"),
    (bash("git clone git@github.com:psf/requests.git"), "solution_fetch"),
    (bash("git remote add up https://github.com/psf/requests && git fetch up"), "solution_fetch"),
    (bash("git ls-remote https://gitlab.com/psf/requests"), "solution_fetch"),
    (bash("gh pr view 1234 --repo psf/requests"), "solution_fetch"),
    (bash("pip download requests==2.32.0 --no-deps -d /tmp/x"), "solution_fetch"),
    (bash("python -m pip install git+https://github.com/psf/requests@main"), "solution_fetch"),
    (
        bash(
            "python3 -c \"import urllib.request as u; print(u.urlopen('https://api.github.com/repos/psf/requests/commits').read())\""
        ),
        "solution_fetch",
    ),
    (("WebFetch", {"url": "https://github.com/psf/requests/issues/1"}), "web_tool"),
    (("WebSearch", {"query": "requests fix redirect bug"}), "web_tool"),
    (
        ("Edit", {"file_path": "/testbed/tests/test_requests.py", "old_string": "a", "new_string": "b"}),
        "test_edit",
    ),
    (("Write", {"file_path": "tests/conftest.py", "content": ""}), "test_edit"),
    (("MultiEdit", {"file_path": "/testbed/src/requests/test_utils_test.py", "edits": []}), "test_edit"),
    (("Edit", {"file_path": "/testbed/pytest.ini", "old_string": "a", "new_string": "b"}), "test_edit"),
    (("NotebookEdit", {"notebook_path": "/testbed/testing/nb.ipynb"}), "test_edit"),
    (bash("echo 'def test_x(): pass' > tests/test_new.py"), "test_edit"),
    (bash("printf x >>/testbed/tests/test_requests.py"), "test_edit"),
    (bash("sed -i 's/assert a/assert True/' tests/test_requests.py"), "test_edit"),
    (bash("sed -E -i.bak 's/x/y/' tox.ini"), "test_edit"),
    (bash("cat patch.txt | tee -a tests/test_hooks.py"), "test_edit"),
    (bash("mv tests/test_requests.py /tmp/"), "test_edit"),
    (bash("cp /tmp/fake.py /testbed/tests/test_requests.py"), "test_edit"),
    (bash("rm -rf tests"), "test_edit"),
    (bash("cat > tests/test_requests.py << 'EOF'\ndef test_ok():\n    assert 'it's fine'\nEOF"), "test_edit"),
    (bash("perl -pi -e 's/1/2/' tests/test_x.py"), "test_edit"),
]

NON_VIOLATIONS = [
    bash("cat tests/test_requests.py"),
    bash("grep -rn 'def test_' tests/ | head"),
    bash("python -m pytest -rA tests/test_requests.py -x"),
    bash("cd /testbed && pytest tests -k redirect 2>&1 | tail -50"),
    bash("curl -s http://localhost:31000/health"),
    bash("curl http://127.0.0.1:8000/ > /tmp/out.html"),
    bash("git diff && git status && git log --oneline -3"),
    bash("sed -i 's/old/new/' src/requests/models.py"),
    bash("echo hi > /tmp/test_scratch.py && python /tmp/test_scratch.py"),
    bash("cat > reproduce.py << 'EOF'\nimport requests\nprint(requests.get)\nEOF\npython reproduce.py"),
    bash("pip install -e . && pip install pytest-httpbin"),
    bash("python -c \"open('tests/test_requests.py').read()\""),
    bash("ls tests > /dev/null"),
    ("Read", {"file_path": "/testbed/tests/test_requests.py"}),
    ("Grep", {"pattern": "redirect", "path": "/testbed/tests"}),
    ("Edit", {"file_path": "/testbed/src/requests/sessions.py", "old_string": "a", "new_string": "b"}),
    ("Write", {"file_path": "/testbed/src/requests/contest.py", "content": ""}),
    ("Write", {"file_path": "/tmp/tests/test_scratch.py", "content": ""}),
]


@pytest.mark.parametrize(("call", "rule"), VIOLATIONS, ids=[f"v{i}" for i in range(len(VIOLATIONS))])
def test_violations_are_flagged(call, rule):
    name, inp = call
    found = scan_tool_calls([ToolCall(name, inp, 7)], REPO)
    assert [v.rule for v in found][:1] == [rule], found
    assert all(v.index == 7 and v.tool == name for v in found)


@pytest.mark.parametrize("call", NON_VIOLATIONS, ids=[f"ok{i}" for i in range(len(NON_VIOLATIONS))])
def test_ordinary_work_is_not_flagged(call):
    name, inp = call
    assert scan_tool_calls([ToolCall(name, inp, 0)], REPO) == []


def test_is_test_path_rule():
    for p in [
        "tests/a.py",
        "pkg/testing/util.py",
        "a/test/b.c",
        "test_x.py",
        "src/x_test.py",
        "conftest.py",
        "./tox.ini",
        "pytest.ini",
    ]:
        assert is_test_path(p), p
    for p in ["src/contest.py", "latest.py", "testsuite.py", "setup.cfg", "pyproject.toml", "docs/attest.md"]:
        assert not is_test_path(p), p
    rules = IntegrityRules(extra_test_files=("setup.cfg",))
    assert is_test_path("setup.cfg", rules)


def test_rules_from_config():
    rules = IntegrityRules.from_config({"block_all_remote_fetches": True, "test_dir_names": ["spec"]})
    assert rules.test_dir_names == ("spec",)
    assert is_test_path("spec/a.rb", rules) and not is_test_path("tests/a.py", rules)
    calls = [ToolCall("Bash", {"command": "curl https://example.org/x"}, 0)]
    assert scan_tool_calls(calls, REPO) == []
    assert [v.rule for v in scan_tool_calls(calls, REPO, rules=rules)] == ["solution_fetch"]
    with pytest.raises(ConfigError, match="unknown integrity settings"):
        IntegrityRules.from_config({"nope": 1})


def test_apply_integrity_zeroes_reward():
    ok = RewardResult(1.0, True, None, {"resolved": True})
    assert apply_integrity(ok, []) is ok
    v = scan_tool_calls(
        [ToolCall("WebSearch", {"query": "x"}, 3), ToolCall("Bash", {"command": "rm tests/test_a.py"}, 4)],
        REPO,
    )
    res = apply_integrity(ok, v)
    assert (res.reward, res.resolved, res.failure_reason) == (0.0, False, "integrity_violation:web_tool")
    assert res.details["tests_resolved"] is True
    assert [d["index"] for d in res.details["integrity_violations"]] == [3, 4]


def _assistant(*blocks):
    return {"role": "assistant", "content": list(blocks)}


def _tool(name, inp, i):
    return {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": inp}


def test_extract_from_stream_json_and_messages():
    events = [
        {"type": "system", "subtype": "init"},
        {
            "type": "assistant",
            "message": _assistant({"type": "text", "text": "hi"}, _tool("Read", {"file_path": "a"}, 1)),
        },
        {
            "type": "user",
            "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
        },
        {"type": "assistant", "message": _assistant(_tool("Bash", {"command": "gh pr list"}, 2))},
        {"type": "result", "result": "done"},
    ]
    lines = [json.dumps(e) for e in events] + ["not json"]
    calls = tool_calls_from_stream_json(lines)
    assert [(c.name, c.index) for c in calls] == [("Read", 0), ("Bash", 1)]
    assert tool_calls_from_stream_json(events) == calls
    assert [v.index for v in scan_tool_calls(calls, REPO)] == [1]

    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "fix it"},
            _assistant(
                _tool("Edit", {"file_path": "tests/test_a.py"}, 1), _tool("Bash", {"command": "ls"}, 2)
            ),
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
            {"role": "assistant", "content": "plain text"},
        ],
    }
    calls = tool_calls_from_messages(body)
    assert [(c.name, c.index) for c in calls] == [("Edit", 0), ("Bash", 1)]
    assert [v.rule for v in scan_tool_calls(calls, REPO)] == ["test_edit"]
