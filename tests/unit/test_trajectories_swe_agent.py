"""SWE-agent `.traj` reader and SWE-smith's text form (sweflow.trajectories.swe_agent / text_form).

The expected text turns below were worked out by hand from SWE-smith's converter rules
(swesmith/train/traj_mgr/utils.py: last step's query, tool -> user, system -> its inference prompt,
thought + "\\n\\n" + <function=...> blocks, stripped; old_str/new_str/file_text on their own lines).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from sweflow.errors import DatasetError
from sweflow.trajectories.swe_agent import read_traj
from sweflow.trajectories.text_form import (
    SWESMITH_SYSTEM_PROMPT,
    swesmith_text_messages,
    text_messages,
    text_row,
    text_row_line,
)
from sweflow.trajectories.types import Trajectory

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "trajectories"
IID = "textkit__textkit.5d1f2c3a.pr_17"
V1 = FIXTURES / f"{IID}.traj"
V0 = FIXTURES / "textkit__textkit-17.traj"

SLUG_OLD = '    return re.sub(r"[^a-z]+", "-", text.lower()).strip("-")'
SLUG_NEW = '    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")'
PR = '`slugify` drops digits\n\n`slugify("Version 2 Release")` returns `version-release`; expected `version-2-release`.\n'
INSTANCE = (
    "<uploaded_files>\n/testbed\n</uploaded_files>\n"
    "I've uploaded a python code repository in the directory /testbed. Consider the following PR description:\n\n"
    f"<pr_description>\n{PR}\n</pr_description>\n\n"
    "Can you help me implement the necessary changes to the repository so that the requirements specified in the "
    "<pr_description> are met?\nYour task is to make the minimal changes to non-tests files in the /testbed directory "
    "to ensure the <pr_description> is satisfied."
)
VIEW_OBS = (
    "OBSERVATION:\nHere's the result of running `cat -n` on /testbed/src/textkit/slug.py:\n"
    f"     1\timport re\n     2\t\n     3\t\n     4\tdef slugify(text):\n     5\t{SLUG_OLD}\n"
)
EDIT_OBS = (
    "OBSERVATION:\nThe file /testbed/src/textkit/slug.py has been edited. Here's the result of running `cat -n` on a "
    f"snippet of /testbed/src/textkit/slug.py:\n     2\t\n     3\t\n     4\tdef slugify(text):\n     5\t{SLUG_NEW}\n"
    "Review the changes and make sure they are as expected. Edit the file again if necessary."
)
RUN = "<function=bash>\n<parameter=command>cd /testbed && python reproduce.py</parameter>\n</function>"
SUBMIT_TURN = (
    "Since we have successfully fixed the issue and verified it works, let's submit the changes:\n\n"
    "<function=submit>\n</function>"
)

# What SWE-smith's xml converter writes for the 1.x fixture (the last step's query: no final submit turn).
EXPECTED_TEXT = [
    {"role": "user", "content": INSTANCE},
    {
        "role": "assistant",
        "content": "I'll start by looking at the slug helper.\n\n<function=str_replace_editor>\n"
        "<parameter=command>view</parameter>\n<parameter=path>/testbed/src/textkit/slug.py</parameter>\n"
        "<parameter=view_range>[1, 5]</parameter>\n</function>",
    },
    {"role": "user", "content": VIEW_OBS},
    {
        "role": "assistant",
        "content": "The character class `[^a-z]` also replaces digits. Let me confirm with a script.\n\n"
        "<function=str_replace_editor>\n<parameter=command>create</parameter>\n"
        "<parameter=path>/testbed/reproduce.py</parameter>\n<parameter=file_text>\n"
        'from textkit.slug import slugify\n\nprint(slugify("Version 2 Release"))\n\n</parameter>\n</function>',
    },
    {"role": "user", "content": "OBSERVATION:\nFile created successfully at: /testbed/reproduce.py"},
    {"role": "assistant", "content": RUN},
    {"role": "user", "content": "OBSERVATION:\nversion-release"},
    {
        "role": "assistant",
        "content": "The digit is dropped. I'll allow digits in the pattern.\n\n<function=str_replace_editor>\n"
        "<parameter=command>str_replace</parameter>\n<parameter=path>/testbed/src/textkit/slug.py</parameter>\n"
        '<parameter=old_str>\nre.sub("[^a-z]+", "-", text)\n</parameter>\n'
        '<parameter=new_str>\nre.sub("[^a-z0-9]+", "-", text)\n</parameter>\n</function>',
    },
    {
        "role": "user",
        "content": 'OBSERVATION:\nNo replacement was performed, old_str `re.sub("[^a-z]+", "-", text)` did not '
        "appear verbatim in /testbed/src/textkit/slug.py.",
    },
    {
        "role": "assistant",
        "content": "The line uses a raw string and `text.lower()`; I'll match it exactly.\n\n"
        "<function=str_replace_editor>\n<parameter=command>str_replace</parameter>\n"
        "<parameter=path>/testbed/src/textkit/slug.py</parameter>\n"
        f"<parameter=old_str>\n{SLUG_OLD}\n</parameter>\n<parameter=new_str>\n{SLUG_NEW}\n</parameter>\n</function>",
    },
    {"role": "user", "content": EDIT_OBS},
    {"role": "assistant", "content": f"Running the script again.\n\n{RUN}"},
    {"role": "user", "content": "OBSERVATION:\nversion-2-release"},
]


def _data() -> dict:
    return json.loads(V1.read_text())


def _write(tmp_path: Path, data, name: str = "bad.traj") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# ---- read_traj: 1.x function calling ----


def test_read_1x_ids_system_patch_meta():
    traj = read_traj(V1)
    data = _data()
    assert traj.id == f"claude-3-7-sonnet-20250219__{IID}"
    assert traj.instance_id == IID
    assert traj.source == "swe_agent"
    assert traj.system == "You are a helpful assistant that can interact with a computer to solve tasks."
    assert traj.patch == data["info"]["submission"]
    assert (
        traj.patch.startswith("diff --git a/reproduce.py b/reproduce.py\n") and f"+{SLUG_NEW}\n" in traj.patch
    )
    assert traj.tools == []
    assert traj.meta["model"] == "claude-3-7-sonnet-20250219"
    assert traj.meta["exit_status"] == "submitted"
    assert traj.meta["swe_agent_version"] == "1.1.0"
    assert traj.meta["format"] == "1.x" and traj.meta["text_form"] == "swesmith"
    assert traj.meta["n_steps"] == 8 and traj.meta["model_stats"]["api_calls"] == 8
    assert read_traj(V1, traj_id="run-7").id == "run-7"
    assert read_traj(data).instance_id == IID  # a dict: from replay_config.problem_statement.id


def test_read_1x_messages_tool_calls_and_results():
    traj = read_traj(V1)
    assert [m["role"] for m in traj.messages] == ["user"] + ["assistant", "tool"] * 7
    assert traj.messages[0] == {"role": "user", "content": INSTANCE}  # content list -> its text
    first = traj.messages[1]
    assert first["content"] == "I'll start by looking at the slug helper."
    assert first["tool_calls"] == [
        {
            "id": "toolu_01VbAqXh3k",
            "type": "function",
            "function": {
                "name": "str_replace_editor",
                "arguments": '{"command": "view", "path": "/testbed/src/textkit/slug.py", "view_range": [1, 5]}',
            },
        }
    ]
    assert traj.messages[2] == {
        "role": "tool",
        "tool_call_id": "toolu_01VbAqXh3k",
        "name": "str_replace_editor",
        "content": VIEW_OBS,
    }
    for call_msg, result in zip(traj.messages[1::2], traj.messages[2::2], strict=True):
        (call,) = call_msg["tool_calls"]
        assert isinstance(call["function"]["arguments"], str)
        assert result["tool_call_id"] == call["id"] and result["name"] == call["function"]["name"]
    assert json.loads(traj.messages[7]["tool_calls"][0]["function"]["arguments"])["old_str"] == (
        're.sub("[^a-z]+", "-", text)'
    )
    assert traj.messages[8]["content"].startswith("OBSERVATION:\nNo replacement was performed")  # the error
    assert traj.messages[5] == {
        "role": "assistant",
        "content": "",
        "tool_calls": traj.messages[5]["tool_calls"],
    }
    assert traj.messages[-2]["tool_calls"][0]["function"] == {"name": "submit", "arguments": "{}"}
    assert traj.messages[-1]["content"] == "OBSERVATION:\n" + traj.patch


def test_read_history_with_two_calls_in_one_turn():
    data = _data()
    history = data["history"]
    history[2]["tool_calls"].append(
        {
            "index": 2,
            "function": {"arguments": '{"command": "ls /testbed/src"}', "name": "bash"},
            "id": "toolu_02X",
        }
    )
    history.insert(4, {"role": "tool", "content": "OBSERVATION:\ntextkit", "tool_call_ids": ["toolu_02X"]})
    traj = read_traj(data)
    ids = [c["id"] for c in traj.messages[1]["tool_calls"]]
    assert ids == ["toolu_01VbAqXh3k", "toolu_02X"]
    assert traj.messages[1]["tool_calls"][1]["type"] == "function"
    assert [(m["tool_call_id"], m["name"]) for m in traj.messages[2:4]] == [
        ("toolu_01VbAqXh3k", "str_replace_editor"),
        ("toolu_02X", "bash"),
    ]
    rendered = text_messages(replace(traj, text_messages=None))
    assert rendered[2]["content"].endswith(
        "<parameter=view_range>[1, 5]</parameter>\n</function>\n"
        "<function=bash>\n<parameter=command>ls /testbed/src</parameter>\n</function>"
    )
    assert rendered[3:5] == [
        {"role": "user", "content": VIEW_OBS},
        {"role": "user", "content": "OBSERVATION:\ntextkit"},
    ]


# ---- read_traj: 0.x text actions ----


def test_read_0x():
    traj = read_traj(V0)
    assert traj.id == traj.instance_id == "textkit__textkit-17"
    assert traj.system.startswith("SETTING: You are an autonomous programmer, and you're working directly")
    assert traj.system.endswith(
        "DISCUSSION\nFirst I'll start by using ls to see what files are in the current directory.\n```\nls -a\n```"
    )
    assert [m["role"] for m in traj.messages] == [
        "user",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert all("tool_calls" not in m for m in traj.messages)
    assert traj.messages[2]["content"] == (
        "DISCUSSION\nLet's open the helper that builds slugs.\n```\nopen src/textkit/slug.py\n```"
    )
    assert (
        traj.messages[-1]["content"] == "DISCUSSION\nDigits are kept now, so let's submit.\n```\nsubmit\n```"
    )
    assert traj.messages[3]["content"].endswith(
        "(Open file: /textkit__textkit/src/textkit/slug.py)\n(Current directory: /textkit__textkit)\nbash-$"
    )
    assert (
        traj.patch.startswith("\ndiff --git a/src/textkit/slug.py")
        and traj.meta["exit_status"] == "submitted"
    )
    assert traj.meta["format"] == "0.x" and traj.meta["model"] is None and traj.meta["n_demo_messages"] == 1
    # no SWE-smith rule for 0.x: the history's own text, raw (no strip, no prompt swap)
    assert traj.meta["text_form"] == "history"
    assert traj.text_messages == [{"role": "system", "content": traj.system}, *traj.messages]


def test_0x_model_from_run_folder(tmp_path):
    run = tmp_path / "gpt4__textkit_dev__default__t-0.00__p-0.95__c-2.00__install-1"
    run.mkdir()
    path = run / V0.name
    path.write_text(V0.read_text())
    traj = read_traj(path)
    assert traj.meta["model"] == "gpt4"
    assert traj.id == "gpt4__textkit__textkit-17"


# ---- SWE-smith text form ----


def test_swesmith_text_of_1x_fixture():
    traj = read_traj(V1)
    system, *rest = traj.text_messages
    assert system["role"] == "system"
    assert hashlib.sha256(system["content"].encode()).hexdigest() == (
        "e739547942cb602c5eddedcdf40890851f4f42d4994dc53acc7cc81ce8318912"  # agent/swesmith_infer.yaml
    )
    assert system["content"].startswith(
        "You are a helpful assistant that can interact with a computer to solve tasks.\n<IMPORTANT>"
    )
    assert rest == EXPECTED_TEXT
    assert text_messages(traj) == traj.text_messages
    # the pre-`tool`-style SWE-smith did not strip: only the turn with an empty thought differs
    legacy = swesmith_text_messages(_data(), legacy=True)
    assert [i for i, (a, b) in enumerate(zip(legacy, traj.text_messages, strict=True)) if a != b] == [6]
    assert legacy[6]["content"] == f"\n\n{RUN}"


def test_round_trip_1_1_query_form():
    traj = read_traj(V1)
    rendered = text_messages(replace(traj, text_messages=None), system_prompt=SWESMITH_SYSTEM_PROMPT)
    # SWE-smith converts the final step's input, so the submit turn and its output come only from `messages`
    assert rendered[: len(traj.text_messages)] == traj.text_messages
    assert rendered[len(traj.text_messages) :] == [
        {"role": "assistant", "content": "The fix works, so I'll submit.\n\n<function=submit>\n</function>"},
        {"role": "user", "content": "OBSERVATION:\n" + traj.patch},
    ]
    plain = text_messages(replace(traj, text_messages=None))
    assert plain[0] == {"role": "system", "content": traj.system} and plain[1:] == rendered[1:]


def test_round_trip_1_0_messages_form():
    data = _data()
    for step in data["trajectory"]:
        del step["query"]
    data["trajectory"][-1]["messages"] = copy.deepcopy(data["history"])  # 1.0: history after the step
    traj = read_traj(data)
    rendered = text_messages(replace(traj, text_messages=None), system_prompt=SWESMITH_SYSTEM_PROMPT)
    assert traj.text_messages == rendered[:-1]  # all but the submission output
    assert (
        traj.text_messages[-1]["content"]
        == "The fix works, so I'll submit.\n\n<function=submit>\n</function>"
    )
    assert traj.text_messages[1:14] == EXPECTED_TEXT


def test_cost_limit_exit_turns():
    data = _data()
    data["trajectory"].append(
        {"action": "", "observation": "Exited (autosubmitted)", "response": "Exit due to cost limit",
         "thought": "Exit due to cost limit", "execution_time": 0.0, "state": {}, "query": [{}], "extra_info": {}}
    )  # fmt: skip
    assert read_traj(data).text_messages == read_traj(V1).text_messages  # SWE-smith uses the step before
    with pytest.raises(DatasetError, match=r"field 'trajectory\[8\]\.query\[0\]\.role'"):
        swesmith_text_messages(data, legacy=True)  # the June 2025 rules had no fallback

    data = _data()
    history = data["history"][:-2] + [
        {"role": "assistant", "content": "Exit due to cost limit", "thought": "Exit due to cost limit",
         "action": "", "agent": "main", "tool_calls": None, "message_type": "action"},
        {"role": "user", "content": "Exited (autosubmitted)", "agent": "main", "message_type": "observation"},
    ]  # fmt: skip
    data["history"] = history
    for step in data["trajectory"]:
        del step["query"]
    data["trajectory"][-1]["messages"] = copy.deepcopy(history)
    traj = read_traj(data)
    assert traj.messages[-2] == {"role": "assistant", "content": "Exit due to cost limit"}
    assert traj.text_messages[-1] == {"role": "assistant", "content": SUBMIT_TURN}
    rendered = text_messages(replace(traj, text_messages=None), system_prompt=SWESMITH_SYSTEM_PROMPT)
    assert rendered[:-1] == traj.text_messages


def test_render_any_tool_and_arguments():
    calls = [
        ("toolu_a", "Read", {"file_path": "/repo/a.py", "offset": 10, "limit": 5}),
        ("toolu_b", "Grep", {"pattern": "def f", "-n": True, "glob": ["*.py"], "opts": {"x": None}}),
    ]
    edit = {
        "file_path": "/repo/a.py",
        "old_string": "def f():",
        "new_string": "def f(x):\n    pass",
        "replace_all": False,
    }
    traj = Trajectory(
        id="cc-1",
        instance_id="repo__a-1",
        source="claude_code",
        system="You are Claude Code.",
        messages=[
            {"role": "user", "content": "Fix the bug."},
            {
                "role": "assistant",
                "content": "Reading both files.",
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                    for i, n, a in calls
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_a", "name": "Read", "content": "    10\tdef f():"},
            {"role": "tool", "tool_call_id": "toolu_b", "name": "Grep", "content": "a.py:10:def f():"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "toolu_c",
                        "type": "function",
                        "function": {"name": "Edit", "arguments": json.dumps(edit)},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "toolu_c",
                "name": "Edit",
                "content": "The file /repo/a.py has been updated.",
            },
            {"role": "assistant", "content": "  Done.\n"},
        ],
        patch="diff --git a/a.py b/a.py\n",
    )
    expected = [
        {"role": "system", "content": "You are Claude Code."},
        {"role": "user", "content": "Fix the bug."},
        {
            "role": "assistant",
            "content": "Reading both files.\n\n<function=Read>\n<parameter=file_path>/repo/a.py</parameter>\n"
            "<parameter=offset>10</parameter>\n<parameter=limit>5</parameter>\n</function>\n"
            "<function=Grep>\n<parameter=pattern>def f</parameter>\n<parameter=-n>True</parameter>\n"
            "<parameter=glob>['*.py']</parameter>\n<parameter=opts>{'x': None}</parameter>\n</function>",
        },
        {"role": "user", "content": "    10\tdef f():"},
        {"role": "user", "content": "a.py:10:def f():"},
        {
            "role": "assistant",
            "content": "<function=Edit>\n<parameter=file_path>/repo/a.py</parameter>\n"
            "<parameter=old_string>def f():</parameter>\n<parameter=new_string>def f(x):\n    pass</parameter>\n"
            "<parameter=replace_all>False</parameter>\n</function>",
        },
        {"role": "user", "content": "The file /repo/a.py has been updated."},
        {"role": "assistant", "content": "Done."},
    ]
    assert text_messages(traj) == expected
    assert text_messages(traj, system_prompt="S")[0] == {"role": "system", "content": "S"}
    row = text_row(traj)
    assert list(row) == ["messages", "instance_id", "traj_id", "patch", "id"]
    assert (
        row["messages"] == expected and row["traj_id"] == row["id"] == "cc-1" and row["patch"] == traj.patch
    )


def test_text_row_fields():
    traj = read_traj(V1)
    row = text_row(traj)
    assert list(row) == ["messages", "instance_id", "model", "traj_id", "patch", "id"]
    assert row["instance_id"] == IID and row["model"] == "claude-3-7-sonnet-20250219"
    assert row["traj_id"] == row["id"] == traj.id and row["patch"] == traj.patch
    assert row["messages"][1:] == EXPECTED_TEXT
    graded = replace(traj, meta={**traj.meta, "resolved": True, "traj_id": f"{IID}.a1b2c3d4"})
    row = text_row(graded)
    assert list(row) == ["messages", "instance_id", "resolved", "model", "traj_id", "patch", "id"]
    assert row["resolved"] is True and row["traj_id"] == f"{IID}.a1b2c3d4"
    line = text_row_line(graded)
    assert line.endswith("}\n") and line.startswith(
        '{"messages": [{"role": "system", "content": "You are a helpful'
    )
    assert json.loads(line) == row


# ---- bad input ----


def test_missing_history(tmp_path):
    data = _data()
    del data["history"]
    path = _write(tmp_path, data)
    with pytest.raises(DatasetError) as err:
        read_traj(path)
    assert str(path) in str(err.value) and "field 'history'" in str(err.value)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.update(history={"role": "system"}), "history"),
        (lambda d: d["history"][2].pop("role"), "history[2].role"),
        (lambda d: d["history"][1].update(content=7), "history[1].content"),
        (lambda d: d["history"][3].update(tool_call_ids=["toolu_nope"]), "history[3].tool_call_ids"),
        (lambda d: d["history"][3].pop("tool_call_ids"), "history[3].tool_call_ids"),
        (lambda d: d["history"][2]["tool_calls"][0].pop("id"), "history[2].tool_calls[0].id"),
        (lambda d: d["history"][2]["tool_calls"][0]["function"].update(arguments="{oops"), "history[2].tool_calls[0].function.arguments"),
        (lambda d: d["history"][2].update(tool_calls="bash"), "history[2].tool_calls"),
        (lambda d: d.update(info=[1]), "info"),
        (lambda d: d.update(trajectory={}), "trajectory"),
        (lambda d: d.update(replay_config="{not json"), "replay_config"),
        (lambda d: d["trajectory"][-1]["query"][1].update(content=[{"type": "text", "text": "a"}] * 2), "trajectory[7].query[1].content"),
        (lambda d: d["trajectory"][-1]["query"][3].pop("role"), "trajectory[7].query[3].role"),
    ],
)  # fmt: skip
def test_bad_fields(tmp_path, edit, field):
    data = _data()
    edit(data)
    path = _write(tmp_path, data)
    with pytest.raises(DatasetError) as err:
        read_traj(path)
    message = str(err.value)
    assert message.startswith(f"{path}: field {field!r}: "), message
    assert "\n" not in message


def test_unreadable_files(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        read_traj(tmp_path / "missing.traj")
    path = _write(tmp_path, '{"history": [')
    with pytest.raises(DatasetError, match=r"bad\.traj: not valid JSON"):
        read_traj(path)
    with pytest.raises(DatasetError, match="holds one JSON object"):
        read_traj(_write(tmp_path, "[]"))
    data = _data()
    data.pop("replay_config")
    data.pop("environment")
    with pytest.raises(DatasetError, match="cannot tell the instance id"):
        read_traj(data)


def test_render_errors_name_the_message():
    traj = Trajectory(id="t1", instance_id="i", source="claude_code", system="", messages=[{"content": "x"}])
    with pytest.raises(DatasetError, match=r"t1: field 'messages\[0\]\.role': message without role"):
        text_messages(traj)
    bad_args = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "a", "function": {"name": "Bash", "arguments": "[1]"}}],
    }
    with pytest.raises(DatasetError, match=r"field 'messages\[0\]\.tool_calls\[0\]\.function\.arguments'"):
        text_messages(replace(traj, messages=[bad_args]))
