"""SWE-agent `.traj` files (0.x and 1.x) -> `Trajectory`.

`read_traj` maps the history entries of the main agent (the agent of the first entry) onto a `Trajectory`;
the `.traj` format and the mapping, field by field, are written above `read_traj`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import DatasetError
from .text_form import message_role, swesmith_text_messages
from .types import Trajectory

__all__ = ["read_traj"]

_GENERIC_ENVIRONMENTS = frozenset({"", "main", "swe_main"})


# A `.traj` is one JSON object: ``history`` (every message of the run: role, content, agent; 1.x adds
# message_type, and on assistant turns thought/action/tool_calls, on tool results tool_call_ids),
# ``trajectory`` (one step per model call: action, observation, response, thought, state, execution_time; 1.x
# adds query, the model input of that step, which 1.0 called messages and held the history after the step),
# ``info`` (submission, exit_status, model_stats, swe_agent_version ...) and ``environment``; 1.x adds
# ``replay_config`` (the run config as a JSON string).
#
# Mapping (history entries of the main agent only, i.e. the agent of the first entry):
#
# - ``system``: the first system message, exactly; later system messages stay in `messages`.
# - user -> ``{"role": "user"}``; assistant -> ``{"role": "assistant", "content"}`` (the raw model output: for
#   0.x / text-action runs the action sits in it), plus ``tool_calls`` (id, type, function name, arguments as
#   the JSON string) when the turn has calls; tool -> ``{"role": "tool", "tool_call_id", "name", "content"}``
#   with the name of the call it answers. Content lists (1.x cache marks) become their text. Demonstrations
#   (``is_demo``) stay in, counted in meta.
# - ``text_messages``: 1.x with a query / messages in the last step: what SWE-smith's converter writes
#   (`text_form.swesmith_text_messages`); 0.x (SWE-smith cannot convert it): the system prompt and the history
#   as is, observations as user turns; 1.x without one: None (`text_form.text_messages` renders).
# - ``instance_id``: the file name (SWE-agent writes ``<instance_id>.traj``), else
#   replay_config.problem_statement.id, info.instance_id, environment (unless a generic name).
# - ``id``: `traj_id` if given, else ``<model>__<instance_id>`` (the model name with characters outside
#   ``[A-Za-z0-9._-]`` replaced by "-"), or ``<instance_id>`` when the model is unknown. The model comes from
#   replay_config.agent.model.name (1.x) or a 0.x run folder name ``<model>__<data>__<config>__t-...``.
# - ``tools``: the file's top-level ``tools`` list when it records one (SWE-agent does not), else [].
# - ``patch``: info.submission.
def read_traj(source: str | os.PathLike | Mapping[str, Any], *, traj_id: str | None = None) -> Trajectory:
    """Read a SWE-agent `.traj` (a path, or the parsed JSON object) into a `Trajectory` (the comment above).

    Raises DatasetError naming the file and field for unreadable or malformed input.
    """
    path, data = _load(source)
    file = str(path) if path is not None else "<traj dict>"
    if not isinstance(data, Mapping):
        raise DatasetError(f"a .traj file holds one JSON object, got {type(data).__name__}", file=file)
    data = _chosen_attempt(data, file)
    if "history" not in data:
        raise DatasetError("no history (the messages of the run)", file=file, field="history")
    history = data["history"]
    if not isinstance(history, list):
        raise DatasetError(
            f"history must be a list, got {type(history).__name__}", file=file, field="history"
        )
    info = _mapping(data.get("info"), file, "info")
    steps = data.get("trajectory")
    if steps is None:
        steps = []
    if not isinstance(steps, list):
        raise DatasetError(
            f"trajectory must be a list, got {type(steps).__name__}", file=file, field="trajectory"
        )
    replay = _replay_config(data.get("replay_config"), file)
    one_x = (
        bool(info.get("swe_agent_version"))
        or "replay_config" in data
        or any(isinstance(h, Mapping) and "message_type" in h for h in history)
    )

    system, messages, counts = _chat(history, file)
    instance_id = _instance_id(path, data, info, replay, file)
    model = _model(replay, path, one_x)
    patch = info.get("submission")
    if patch is not None and not isinstance(patch, str):
        raise DatasetError(
            f"must be a string, got {type(patch).__name__}", file=file, field="info.submission"
        )

    last = steps[-1] if steps else None
    if one_x and isinstance(last, Mapping) and ("messages" in last or "query" in last):
        text: list[dict[str, Any]] | None = swesmith_text_messages(data, file=file)
        text_form = "swesmith"
    elif not one_x:
        text = [{"role": "system", "content": system}]
        text += [
            {"role": "user" if m["role"] == "tool" else m["role"], "content": m["content"]} for m in messages
        ]
        text_form = "history"
    else:
        text, text_form = None, "rendered"

    meta: dict[str, Any] = {"format": "1.x" if one_x else "0.x", "model": model}
    if path is not None:
        meta["file"] = file
    for key in ("swe_agent_version", "swe_agent_hash", "swe_rex_version"):
        if info.get(key):
            meta[key] = info[key]
    meta["exit_status"] = info.get("exit_status")
    if isinstance(data.get("environment"), str):
        meta["environment"] = data["environment"]
    if isinstance(info.get("model_stats"), Mapping):
        meta["model_stats"] = dict(info["model_stats"])
    meta["n_steps"] = len(steps)
    meta["text_form"] = text_form
    meta.update(counts)

    return Trajectory(
        id=traj_id or _default_id(model, instance_id),
        instance_id=instance_id,
        source="swe_agent",
        system=system,
        messages=messages,
        tools=_tools(data.get("tools")),
        text_messages=text,
        patch=patch,
        meta=meta,
    )


def _load(source: Any) -> tuple[Path | None, Any]:
    if isinstance(source, Mapping):
        return None, source
    if not isinstance(source, str | os.PathLike):
        raise DatasetError(f"read_traj takes a path or a parsed .traj object, got {type(source).__name__}")
    path = Path(source)
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError("no such file", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read the file ({exc})", file=str(path)) from None
    try:
        return path, json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"not valid JSON ({exc.msg} at line {exc.lineno})", file=str(path)) from None


def _mapping(value: Any, file: str, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DatasetError(f"must be an object, got {type(value).__name__}", file=file, field=field)
    return value


# A retry-agent file keeps its runs under ``attempts`` and copies the chosen one to the top level.
def _chosen_attempt(data: Mapping[str, Any], file: str) -> Mapping[str, Any]:
    """A retry-agent file without a chosen attempt at the top level: its best (else first) attempt."""
    attempts = data.get("attempts")
    if "history" in data or not isinstance(attempts, list) or not attempts:
        return data
    index = _mapping(data.get("info"), file, "info").get("best_attempt_idx", 0)
    if (
        not isinstance(index, int)
        or not 0 <= index < len(attempts)
        or not isinstance(attempts[index], Mapping)
    ):
        raise DatasetError("no readable attempt", file=file, field=f"attempts[{index}]")
    return attempts[index]


def _replay_config(raw: Any, file: str) -> Mapping[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"not valid JSON ({exc.msg})", file=file, field="replay_config") from None
    return _mapping(raw, file, "replay_config")


def _content(content: Any, file: str, field: str) -> str:
    """History content as text: a string, or the parts of a content list (text joined by newlines)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DatasetError(
            f"content must be a string or a list, got {type(content).__name__}", file=file, field=field
        )
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise DatasetError("a content part must be an object", file=file, field=f"{field}[{j}]")
        kind = part.get("type", "text")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise DatasetError("text part without text", file=file, field=f"{field}[{j}].text")
            parts.append(part["text"])
        else:
            parts.append(f"[{kind} omitted]")
    return "\n".join(parts)


def _tool_call(call: Any, file: str, field: str) -> dict[str, Any]:
    if not isinstance(call, Mapping):
        raise DatasetError("a tool call must be an object", file=file, field=field)
    if not isinstance(call.get("id"), str) or not call["id"]:
        raise DatasetError("tool call without id", file=file, field=f"{field}.id")
    function = call.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise DatasetError("tool call without function.name", file=file, field=f"{field}.function.name")
    arguments = function.get("arguments")
    if isinstance(arguments, Mapping):
        arguments = json.dumps(arguments)
    elif arguments is None or arguments == "":
        arguments = "{}"
    elif not isinstance(arguments, str):
        raise DatasetError(
            f"must be a JSON string, got {type(arguments).__name__}",
            file=file,
            field=f"{field}.function.arguments",
        )
    else:
        try:
            json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                f"not valid JSON ({exc.msg})", file=file, field=f"{field}.function.arguments"
            ) from None
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def _chat(history: list[Any], file: str) -> tuple[str, list[dict[str, Any]], dict[str, int]]:
    """(system prompt, OpenAI messages, counts) from the main agent's history entries."""
    system: str | None = None
    messages: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    main_agent: Any = None
    counts = {"n_demo_messages": 0, "n_thinking_blocks": 0}
    for i, item in enumerate(history):
        field = f"history[{i}]"
        role = message_role(item, file, field)
        if i == 0:
            main_agent = item.get("agent")
        elif "agent" in item and main_agent is not None and item["agent"] != main_agent:
            continue  # a 0.x subroutine agent's entry
        content = _content(item.get("content"), file, f"{field}.content")
        counts["n_demo_messages"] += bool(item.get("is_demo"))
        if role == "system" and system is None and not messages:
            system = content
        elif role in ("system", "user"):
            messages.append({"role": role, "content": content})
        elif role == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": content}
            calls = item.get("tool_calls")
            if calls is not None and (not isinstance(calls, Sequence) or isinstance(calls, str)):
                raise DatasetError(
                    f"tool_calls must be a list, got {type(calls).__name__}",
                    file=file,
                    field=f"{field}.tool_calls",
                )
            if calls:
                message["tool_calls"] = [
                    _tool_call(c, file, f"{field}.tool_calls[{j}]") for j, c in enumerate(calls)
                ]
                names.update({c["id"]: c["function"]["name"] for c in message["tool_calls"]})
            thinking = item.get("thinking_blocks")
            counts["n_thinking_blocks"] += len(thinking) if isinstance(thinking, list) else 0
            messages.append(message)
        elif role == "tool":
            ids = item.get("tool_call_ids")
            if not isinstance(ids, list) or len(ids) != 1 or not isinstance(ids[0], str):
                raise DatasetError(
                    "a tool result must name exactly one tool call id",
                    file=file,
                    field=f"{field}.tool_call_ids",
                )
            if ids[0] not in names:
                raise DatasetError(
                    f"tool result for unknown tool call id {ids[0]!r}",
                    file=file,
                    field=f"{field}.tool_call_ids",
                )
            messages.append(
                {"role": "tool", "tool_call_id": ids[0], "name": names[ids[0]], "content": content}
            )
        else:
            raise DatasetError(f"unknown role {role!r}", file=file, field=f"{field}.role")
    return system or "", messages, counts


def _instance_id(
    path: Path | None, data: Mapping[str, Any], info: Mapping[str, Any], replay: Mapping[str, Any], file: str
) -> str:
    if path is not None and path.suffix == ".traj" and path.stem:
        return path.stem
    statement = replay.get("problem_statement")
    candidates = [
        statement.get("id") if isinstance(statement, Mapping) else None,
        info.get("instance_id"),
        data.get("environment") if data.get("environment") not in _GENERIC_ENVIRONMENTS else None,
    ]
    for candidate in candidates:
        if isinstance(candidate, str) and candidate:
            return candidate
    raise DatasetError(
        "cannot tell the instance id",
        file=file,
        field="replay_config.problem_statement.id",
        hint="name the file <instance_id>.traj",
    )


def _model(replay: Mapping[str, Any], path: Path | None, one_x: bool) -> str | None:
    agent = replay.get("agent")
    model = agent.get("model") if isinstance(agent, Mapping) else None
    name = model.get("name") if isinstance(model, Mapping) else None
    if isinstance(name, str) and name:
        return name
    if not one_x and path is not None:
        parts = path.parent.name.split("__")
        if len(parts) >= 3 and parts[0] and any(p.startswith("t-") for p in parts[1:]):
            return parts[0]
    return None


def _default_id(model: str | None, instance_id: str) -> str:
    if not model:
        return instance_id
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-")
    return f"{slug}__{instance_id}" if slug else instance_id


def _tools(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, list) and all(
        isinstance(t, Mapping) and isinstance(t.get("function"), Mapping) for t in raw
    ):
        return [dict(t) for t in raw]
    return []
