"""The text form of SWE-smith's published SFT data, and the converter rules that produce it.

SWE-smith (github.com/SWE-bench/SWE-smith) turns a SWE-agent `.traj` into one JSONL row; its converter's
rules (xml style) are reimplemented here (`swesmith_text_messages`, the rules above it; `legacy=True` for
the release before the ``tool`` style). SWE-smith's ``ticks`` and ``tool`` styles are not implemented.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import DatasetError
from .types import Trajectory

__all__ = [
    "SWESMITH_SYSTEM_PROMPT",
    "swesmith_text_messages",
    "text_messages",
    "text_row",
    "text_row_line",
    "xml_function_call",
]

# `agent/swesmith_infer.yaml` -> agent.templates.system_template (SWE-smith, MIT); sha256 e7395479...
SWESMITH_SYSTEM_PROMPT = """You are a helpful assistant that can interact with a computer to solve tasks.
<IMPORTANT>
* If user provides a path, you should NOT assume it's relative to the current working directory. Instead, you should explore the file system to find the file before working on it.
</IMPORTANT>

You have access to the following functions:

---- BEGIN FUNCTION #1: bash ----
Description: Execute a bash command in the terminal.

Parameters:
  (1) command (string, required): The bash command to execute. Can be empty to view additional logs when previous exit code is `-1`. Can be `ctrl+c` to interrupt the currently running process.
---- END FUNCTION #1 ----

---- BEGIN FUNCTION #2: submit ----
Description: Finish the interaction when the task is complete OR if the assistant cannot proceed further with the task.
No parameters are required for this function.
---- END FUNCTION #2 ----

---- BEGIN FUNCTION #3: str_replace_editor ----
Description: Custom editing tool for viewing, creating and editing files
* State is persistent across command calls and discussions with the user
* If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a directory, `view` lists non-hidden files and directories up to 2 levels deep
* The `create` command cannot be used if the specified `path` already exists as a file
* If a `command` generates a long output, it will be truncated and marked with `<response clipped>`
* The `undo_edit` command will revert the last edit made to the file at `path`

Notes for using the `str_replace` command:
* The `old_str` parameter should match EXACTLY one or more consecutive lines from the original file. Be mindful of whitespaces!
* If the `old_str` parameter is not unique in the file, the replacement will not be performed. Make sure to include enough context in `old_str` to make it unique
* The `new_str` parameter should contain the edited lines that should replace the `old_str`

Parameters:
  (1) command (string, required): The commands to run. Allowed options are: `view`, `create`, `str_replace`, `insert`, `undo_edit`.
Allowed values: [`view`, `create`, `str_replace`, `insert`, `undo_edit`]
  (2) path (string, required): Absolute path to file or directory, e.g. `/repo/file.py` or `/repo`.
  (3) file_text (string, optional): Required parameter of `create` command, with the content of the file to be created.
  (4) old_str (string, optional): Required parameter of `str_replace` command containing the string in `path` to replace.
  (5) new_str (string, optional): Optional parameter of `str_replace` command containing the new string (if not given, no string will be added). Required parameter of `insert` command containing the string to insert.
  (6) insert_line (integer, optional): Required parameter of `insert` command. The `new_str` will be inserted AFTER the line `insert_line` of `path`.
  (7) view_range (array, optional): Optional parameter of `view` command when `path` points to a file. If none is given, the full file is shown. If provided, the file will be shown in the indicated line number range, e.g. [11, 12] will show lines 11 and 12. Indexing at 1 to start. Setting `[start_line, -1]` shows all lines from `start_line` to the end of the file.
---- END FUNCTION #3 ----


If you choose to call a function ONLY reply in the following format with NO suffix:

Provide any reasoning for the function call here.
<function=example_function_name>
<parameter=example_parameter_1>value_1</parameter>
<parameter=example_parameter_2>
This is the value for the second parameter
that can span
multiple lines
</parameter>
</function>

<IMPORTANT>
Reminder:
- Function calls MUST follow the specified format, start with <function= and end with </function>
- Required parameters MUST be specified
- Only call one function at a time
- Always provide reasoning for your function call in natural language BEFORE the function call (not after)
</IMPORTANT>"""

_BLOCK_PARAMS = frozenset({"old_str", "new_str", "file_text"})
_COST_EXIT = "Exit due to cost limit"
_LIMIT_EXITS = (_COST_EXIT, "Exit due to context window")
_COST_EXIT_TURN = (
    "Since we have successfully fixed the issue and verified it works, "
    "let's submit the changes:\n\n<function=submit>\n</function>"
)


def xml_function_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One tool call as SWE-smith renders it: ``<function=NAME>``, a parameter line per argument, ``</function>``."""
    lines = [f"<function={name}>"]
    for key, value in arguments.items():
        if key in _BLOCK_PARAMS:
            lines.append(f"<parameter={key}>\n{value}\n</parameter>")
        else:
            lines.append(f"<parameter={key}>{value}</parameter>")
    lines.append("</function>")
    return "\n".join(lines)


def _arguments(raw: Any, file: str, field: str) -> dict[str, Any]:
    """A call's arguments as a dict: a JSON object string (an empty string counts as no arguments) or a dict."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str) and raw.strip() == "":
        return {}
    if not isinstance(raw, str):
        raise DatasetError(
            f"tool call arguments must be a JSON string, got {type(raw).__name__}", file=file, field=field
        )
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise DatasetError(
            f"tool call arguments are not valid JSON ({exc})", file=file, field=field
        ) from None
    if not isinstance(value, dict):
        raise DatasetError(
            f"tool call arguments must be a JSON object, got {type(value).__name__}", file=file, field=field
        )
    return value


def _calls_text(tool_calls: Any, file: str, field: str) -> list[str]:
    if tool_calls is None:
        return []
    if not isinstance(tool_calls, Sequence) or isinstance(tool_calls, str):
        raise DatasetError(
            f"tool_calls must be a list, got {type(tool_calls).__name__}", file=file, field=field
        )
    out = []
    for j, call in enumerate(tool_calls):
        where = f"{field}[{j}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise DatasetError("tool call without function.name", file=file, field=f"{where}.function.name")
        arguments = _arguments(function.get("arguments"), file, f"{where}.function.arguments")
        out.append(xml_function_call(function["name"], arguments))
    return out


def _assistant_text(content: Any, thought: str, calls: list[str], *, legacy: bool = False) -> str:
    if content == _COST_EXIT:
        return _COST_EXIT_TURN
    text = f"{thought}\n\n" + "\n".join(calls)
    return text if legacy else text.strip()


def message_role(message: Any, file: str, field: str) -> str:
    """The message's role; DatasetError naming the file and field when it is not an object with a string role."""
    if not isinstance(message, Mapping):
        raise DatasetError(
            f"a message must be an object, got {type(message).__name__}", file=file, field=field
        )
    role = message.get("role")
    if not isinstance(role, str):
        raise DatasetError("message without role", file=file, field=f"{field}.role")
    return role


def _single_text(content: Any, file: str, field: str) -> str:
    """User/tool content the way SWE-smith reads it: a string, or a list of exactly one text part."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        part = content[0] if len(content) == 1 else None
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            return part["text"]
        raise DatasetError(
            f"content list with {len(content)} parts; SWE-smith's converter takes exactly one text part",
            file=file,
            field=field,
        )
    raise DatasetError(
        f"content must be a string or a list, got {type(content).__name__}", file=file, field=field
    )


def _convert(
    source: list[Any], file: str, field: str, system_prompt: str, legacy: bool
) -> list[dict[str, str]]:
    out = []
    for i, message in enumerate(source):
        where = f"{field}[{i}]"
        role = message_role(message, file, where)
        if role == "assistant":
            content = message.get("content")
            thought = message["thought"] if "thought" in message else content
            if not isinstance(thought, str) and content != _COST_EXIT:
                key = "thought" if "thought" in message else "content"
                raise DatasetError("assistant message without text", file=file, field=f"{where}.{key}")
            calls = _calls_text(message.get("tool_calls"), file, f"{where}.tool_calls")
            out.append(
                {"role": "assistant", "content": _assistant_text(content, thought, calls, legacy=legacy)}
            )
        elif role == "system":
            out.append({"role": "system", "content": system_prompt})
        else:
            text = _single_text(message.get("content"), file, f"{where}.content")
            out.append({"role": "user" if role == "tool" else role, "content": text})
    return out


# SWE-smith (github.com/SWE-bench/SWE-smith) turns a SWE-agent `.traj` into one JSONL row ``{"messages":
# [...], "instance_id", "resolved", "model", "traj_id", "patch"}`` with
# `swesmith/train/traj_mgr/collect_trajs.py` (row fields; the older `transform_to_ft.py` wrote only
# ``messages`` + ``instance_id``) and `swesmith/train/traj_mgr/utils.py` (`get_messages`,
# `transform_traj_xml`, `tool_call_to_action`; style ``xml`` is the default and what its ``xml`` split holds).
# Reimplemented rules:
#
# - Which messages: the last trajectory step's ``messages`` minus its last entry (SWE-agent 1.0 wrote the
#   history *after* the step there, ending with the submission output); else that step's ``query`` (1.1+: the
#   model input of the step, so the final action and its output are not in it). When the last step's
#   ``response`` is "Exit due to cost limit" or "Exit due to context window", the step before it is used. The
#   query is what the model saw: history processors have run (elided observations, cache_control).
# - Roles: ``tool`` becomes ``user``; everything else keeps its role.
# - System messages: replaced by SWE-smith's inference prompt (`SWESMITH_SYSTEM_PROMPT`, the
#   ``system_template`` of `agent/swesmith_infer.yaml`), not the prompt the run used.
# - Assistant: content exactly "Exit due to cost limit" becomes a fixed submit turn; otherwise ``thought``
#   (else ``content``) + "\n\n" + the tool calls rendered as ``<function=NAME>`` blocks joined by "\n", the
#   whole stripped. A call renders one ``<parameter=KEY>VALUE</parameter>`` line per argument in order (VALUE
#   is Python's ``str`` of the JSON value), with VALUE on its own lines for ``old_str``, ``new_str`` and
#   ``file_text``, then ``</function>``. A 1.x run with text actions (no tool calls) thus keeps only its
#   thoughts, as SWE-smith's xml style does.
# - User/tool content: a string as is; a content list must hold exactly one part, whose ``text`` is used
#   (cache_control marks are dropped).
#
# `legacy=True` reproduces the SWE-smith release before the ``tool`` style (commit cf2e649, June 2025, whose
# `tests/test_logs/ft_xml_example.jsonl` it matches): no strip, no cost/context-window fallback.
def swesmith_text_messages(
    data: Mapping[str, Any],
    *,
    file: str | None = None,
    system_prompt: str = SWESMITH_SYSTEM_PROMPT,
    legacy: bool = False,
) -> list[dict[str, str]]:
    """The ``messages`` SWE-smith's xml converter writes for a parsed SWE-agent 1.x `.traj` (comment above).

    `file` names the source in errors; `system_prompt` replaces every system message (SWE-smith's own by
    default); `legacy` selects the June 2025 rules. Raises DatasetError where SWE-smith's converter fails.
    """
    where = file or "<traj>"
    steps = data.get("trajectory") if isinstance(data, Mapping) else None
    if not isinstance(steps, list) or not steps:
        raise DatasetError(
            "SWE-smith's converter needs at least one trajectory step", file=where, field="trajectory"
        )
    last = steps[-1]
    if not isinstance(last, Mapping):
        raise DatasetError(
            "a trajectory step must be an object", file=where, field=f"trajectory[{len(steps) - 1}]"
        )
    if "messages" in last:
        field = f"trajectory[{len(steps) - 1}].messages"
        source = last["messages"]
        if not isinstance(source, list):
            raise DatasetError(f"must be a list, got {type(source).__name__}", file=where, field=field)
        source = source[:-1]
    else:
        index = len(steps) - 1
        if not legacy and last.get("response") in _LIMIT_EXITS:
            if len(steps) < 2:
                raise DatasetError(
                    f"the run ended at its first step ({last.get('response')}); SWE-smith converts the step before",
                    file=where,
                    field="trajectory",
                )
            index -= 1
        step = steps[index]
        field = f"trajectory[{index}].query"
        source = step.get("query") if isinstance(step, Mapping) else None
        if not isinstance(source, list):
            raise DatasetError(
                "step without query (the model input SWE-smith converts)", file=where, field=field
            )
    return _convert(source, where, field, system_prompt, legacy)


def _plain(content: Any) -> str:
    """Message content as one string: a string as is, the text parts of a list joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(
        str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type", "text") == "text"
    )


def text_messages(traj: Trajectory, *, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The SWE-smith text form of `traj`: ``traj.text_messages`` when the source defined it (a copy), else
    rendered from ``traj.system`` + ``traj.messages`` by SWE-smith's xml rules, for any tool name and
    arguments: tool calls become ``<function=...>`` blocks after the assistant text, tool results become
    user turns, "Exit due to cost limit" becomes the submit turn. The system turn is ``traj.system`` (the
    prompt the run used; SWE-smith would put its own there) unless `system_prompt` is given, e.g.
    `SWESMITH_SYSTEM_PROMPT`; `system_prompt` does not change a source-defined ``text_messages``.
    """
    if traj.text_messages is not None:
        return [dict(m) for m in traj.text_messages]
    file = str(traj.meta.get("file") or traj.id)
    system = traj.system if system_prompt is None else system_prompt
    out = [{"role": "system", "content": system}]
    for i, message in enumerate(traj.messages):
        where = f"messages[{i}]"
        role = message_role(message, file, where)
        if role == "assistant":
            text = _plain(message.get("content"))
            calls = _calls_text(message.get("tool_calls"), file, f"{where}.tool_calls")
            out.append({"role": "assistant", "content": _assistant_text(text, text, calls)})
        elif role == "system":
            out.append({"role": "system", "content": system})
        else:
            out.append(
                {"role": "user" if role == "tool" else role, "content": _plain(message.get("content"))}
            )
    return out


def text_row(traj: Trajectory, *, system_prompt: str | None = None) -> dict[str, Any]:
    """The row SWE-smith's collect_trajs writes, plus our id, in this key order: ``messages``,
    ``instance_id``, ``resolved`` (only when ``meta["resolved"]`` is set: SWE-smith takes it from the
    evaluation report), ``model`` (when known), ``traj_id`` (``meta["traj_id"]``, else our id; SWE-smith's
    is ``<instance_id>.<hash of its trajectory folder>``), ``patch`` (the submission, "" when none), ``id``.
    """
    row: dict[str, Any] = {
        "messages": text_messages(traj, system_prompt=system_prompt),
        "instance_id": traj.instance_id,
    }
    if traj.meta.get("resolved") is not None:
        row["resolved"] = bool(traj.meta["resolved"])
    if traj.meta.get("model"):
        row["model"] = traj.meta["model"]
    row["traj_id"] = str(traj.meta.get("traj_id") or traj.id)
    row["patch"] = traj.patch or ""
    row["id"] = traj.id
    return row


# The row is written as ``json.dumps(row) + "\n"`` (ASCII escapes, ", " / ": " separators): `text_row_line`.
def text_row_line(traj: Trajectory, *, system_prompt: str | None = None) -> str:
    """`text_row` as SWE-smith writes a JSONL line: ``json.dumps(row) + "\\n"``."""
    return json.dumps(text_row(traj, system_prompt=system_prompt)) + "\n"
