"""Tool-call parsing: Qwen3-coder XML, Hermes JSON, mixed, typed, malformed."""

from __future__ import annotations

import pytest

from sweflow.proxy.toolcalls import format_hermes, format_qwen_xml, parse_tool_calls

TOOLS = [
    {
        "name": "Edit",
        "input_schema": {
            "type": "object",
            "properties": {
                "file_path": {"type": "string"},
                "replace_all": {"type": "boolean"},
                "limit": {"type": "integer"},
                "ratio": {"type": "number"},
                "edits": {"type": "array"},
            },
        },
    }
]


def test_xml_call_with_text_before_it():
    text = "Let me list.\n<tool_call>\n<function=Bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>"
    out = parse_tool_calls(text)
    assert out.text == "Let me list."
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("Bash", {"command": "ls -la"})]
    assert out.errors == []


def test_xml_multiline_value_keeps_inner_newlines():
    code = "def f():\n    return 1\n"
    out = parse_tool_calls(format_qwen_xml("Write", {"file_path": "/a.py", "content": code}))
    assert out.tool_calls[0].arguments == {"file_path": "/a.py", "content": code}


def test_xml_values_typed_by_schema():
    args = {"file_path": "/x", "replace_all": True, "limit": 7, "ratio": 0.5, "edits": [{"a": 1}]}
    out = parse_tool_calls(format_qwen_xml("Edit", args), TOOLS)
    assert out.tool_calls[0].arguments == args


def test_xml_untyped_numbers_stay_strings_but_objects_parse():
    body = '<tool_call>\n<function=X>\n<parameter=n>\n5\n</parameter>\n<parameter=o>\n{"k": 1}\n</parameter>\n</function>\n</tool_call>'
    assert parse_tool_calls(body).tool_calls[0].arguments == {"n": "5", "o": {"k": 1}}


def test_hermes_call_and_string_arguments():
    out = parse_tool_calls(
        'ok <tool_call>{"name": "Read", "arguments": "{\\"file_path\\": \\"/a\\"}"}</tool_call>'
    )
    assert out.text == "ok"
    assert out.tool_calls[0].name == "Read" and out.tool_calls[0].arguments == {"file_path": "/a"}


def test_mixed_formats_in_order():
    text = format_hermes("A", {"x": 1}) + "\n" + format_qwen_xml("B", {"y": "z"})
    out = parse_tool_calls(text)
    assert [c.name for c in out.tool_calls] == ["A", "B"]
    assert out.text == ""


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "A", "arguments": [1]}</tool_call>',
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        "<tool_call>just words</tool_call>",
    ],
)
def test_malformed_block_stays_in_text_and_is_reported(bad):
    out = parse_tool_calls("before " + bad)
    assert out.tool_calls == []
    assert len(out.errors) == 1
    assert bad in out.text


def test_truncated_final_call_is_recovered():
    text = "<tool_call>\n<function=Bash>\n<parameter=command>\necho hi\n</parameter>\n"
    out = parse_tool_calls(text)
    assert out.tool_calls[0].arguments == {"command": "echo hi"}


def test_plain_text_untouched():
    out = parse_tool_calls("  no calls here \n")
    assert out.text == "no calls here" and out.tool_calls == [] and out.errors == []
