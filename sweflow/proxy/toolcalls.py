"""Tool-call parsing for model output text: Qwen3-coder XML and Hermes JSON, plus renderers for scripts.

`parse_tool_calls` accepts both in one output (the two forms are shown above `TOOL_CALL_RE`). A block
that cannot be parsed is left in the text (so the agent sees what the model wrote) and reported in
`errors`; it never raises.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# Qwen3-coder:  <tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>
# Hermes:       <tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
FUNCTION_RE = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
PARAMETER_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


@dataclass
class ToolCall:
    """One parsed call: the tool name and its JSON-object arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedOutput:
    """Text outside the parsed calls (stripped), the calls in order, and one message per bad block."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _schema_types(tools: list[dict] | None, name: str) -> dict[str, Any]:
    """Map parameter name -> JSON-schema type for tool `name` (Anthropic or OpenAI tool shape)."""
    for tool in tools or []:
        spec = tool.get("function", tool)
        if spec.get("name") == name:
            schema = spec.get("input_schema") or spec.get("parameters") or {}
            return {
                k: v.get("type") for k, v in (schema.get("properties") or {}).items() if isinstance(v, dict)
            }
    return {}


def _convert_value(raw: str, type_: Any) -> Any:
    """Qwen3-coder parameters are text; convert by the schema type, falling back to the string."""
    types = type_ if isinstance(type_, list) else [type_]
    if "string" in types or type_ is None:
        if type_ is None:
            # Unknown schema: keep strings, but accept JSON objects/arrays/numbers the model clearly meant.
            try:
                val = json.loads(raw)
            except (ValueError, TypeError):
                return raw
            return val if isinstance(val, dict | list) else raw
        return raw
    try:
        if "integer" in types:
            return int(raw.strip())
        if "number" in types:
            num = float(raw.strip())
            return int(num) if num.is_integer() and "." not in raw else num
        if "boolean" in types:
            low = raw.strip().lower()
            if low in ("true", "false"):
                return low == "true"
            return raw
        if "object" in types or "array" in types or "null" in types:
            return json.loads(raw)
    except (ValueError, TypeError):
        return raw
    return raw


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _parse_xml(body: str, tools: list[dict] | None) -> ToolCall:
    fn = FUNCTION_RE.search(body)
    if fn is None:
        raise ValueError("no <function=...> element")
    name = fn.group(1).strip()
    if not name:
        raise ValueError("empty function name")
    types = _schema_types(tools, name)
    args: dict[str, Any] = {}
    for pname, pvalue in PARAMETER_RE.findall(fn.group(2)):
        pname = pname.strip()
        args[pname] = _convert_value(_strip_one_newline(pvalue), types.get(pname))
    return ToolCall(name=name, arguments=args)


def _parse_json(body: str) -> ToolCall:
    obj = json.loads(body)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ValueError("JSON tool call needs a non-empty string 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        raise ValueError("JSON tool call 'arguments' must be an object")
    return ToolCall(name=obj["name"], arguments=args)


def parse_tool_calls(text: str, tools: list[dict] | None = None) -> ParsedOutput:
    """Split model output into plain text and tool calls (either format, any number of blocks).

    `tools` (Anthropic `input_schema` or OpenAI `parameters` shape) types the XML parameter values.
    An unterminated final `<tool_call>` (output cut by max_tokens) is parsed when it is complete enough.
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    kept: list[str] = []
    pos = 0
    for match in TOOL_CALL_RE.finditer(text):
        body = match.group(1).strip()
        try:
            call = _parse_xml(body, tools) if body.startswith("<function=") else _parse_json(body)
        except (ValueError, TypeError) as exc:
            errors.append(f"tool call {len(calls) + len(errors)}: {exc}")
            continue
        kept.append(text[pos : match.start()])
        pos = match.end()
        calls.append(call)
    kept.append(text[pos:])
    return ParsedOutput(text="".join(kept).strip(), tool_calls=calls, errors=errors)


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_reasoning(text: str, opened: bool) -> tuple[str, str]:
    """(reasoning, answer) of one output, as the recipe's `qwen3` reasoning parser splits it.

    Reasoning is on when the prompt's generation prompt opened a `<think>` block (`opened`, Qwen3.5's
    thinking template) or the output opens one itself; it runs to the first `</think>` (all of the output
    when cut before it). Otherwise the whole output is the answer. Both parts are stripped."""
    if not opened and THINK_OPEN not in text:
        return "", text
    body = text.replace(THINK_OPEN, "", 1)
    if THINK_CLOSE not in body:
        return body.strip(), ""
    reasoning, answer = body.split(THINK_CLOSE, 1)
    return reasoning.strip(), answer.strip()


def format_qwen_xml(name: str, arguments: dict[str, Any]) -> str:
    """Render one call in Qwen3-coder XML (non-string values as JSON), as the tiny template does."""
    lines = ["<tool_call>", f"<function={name}>"]
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        lines += [f"<parameter={key}>", text, "</parameter>"]
    lines += ["</function>", "</tool_call>"]
    return "\n".join(lines)


def format_hermes(name: str, arguments: dict[str, Any]) -> str:
    """Render one call in Hermes JSON form."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"
