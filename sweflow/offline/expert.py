"""The scripted expert: a local Anthropic endpoint that plays a strong model for tests and the embedded default.

Expert trajectories come from a real model behind the proxy's pass-through mode (`sweflow.proxy.passthrough`).
Offline, `scripted_expert(...)` serves the same Messages API on 127.0.0.1 (through `ScriptedLM`) and answers
Claude Code like an expert would, from each task's gold patch, which only this endpoint knows (`BEHAVIOURS`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError

# The behaviours, each a list of assistant turns replayed from the task's gold patch:
# - ``gold``: Read every file the fix touches, then one Edit per hunk (old lines -> new lines, with the hunk's
#   context so the old string is unique), new files with Write, then a closing text;
# - ``give_up``: Read the first file, then say it could not find the bug (an empty patch: not resolved);
# - ``test_edit``: the gold fix plus a new test file (resolves, but the integrity check must reject it);
# - ``wrong_fix``: Read, then an Edit that only adds a comment after the first hunk's lines (a patch that
#   applies and leaves the bug: tests fail).
# Which behaviour an attempt gets: ``plan[(attempt + offset(instance)) % len(plan)]``, with the attempt and the
# instance read from the proxy session id the pass-through puts in ``metadata.user_id``
# (``<prefix><instance>:<attempt>:<hex>``). The turn is chosen by how many assistant messages the request
# already holds, so a retried request gets the same answer. A request without tools (Claude Code's side
# requests: titles, summaries) gets a short text.
BEHAVIOURS = ("gold", "give_up", "test_edit", "wrong_fix")
DEFAULT_PLAN = ("gold", "wrong_fix", "gold", "test_edit", "gold", "give_up")
PROBE_TEST = "tests/test_expert_probe.py"
SIDE_REPLY = "OK."

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


def patch_edits(patch: str) -> list[tuple[str, str | None, str]]:
    """(path, old text or None for a new file, new text) per hunk of a unified git diff."""
    edits: list[tuple[str, str | None, str]] = []
    path: str | None = None
    new_file = False
    old: list[str] = []
    new: list[str] = []
    in_hunk = False

    def flush() -> None:
        if path is not None and in_hunk and (old or new):
            if new_file:
                edits.append((path, None, "".join(new)))
            else:
                edits.append((path, "".join(old).removesuffix("\n"), "".join(new).removesuffix("\n")))

    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git "):
            flush()
            path, new_file, in_hunk, old, new = None, False, False, [], []
        elif line.startswith("--- ") and not in_hunk:
            new_file = line.strip() == "--- /dev/null"
        elif line.startswith("+++ ") and not in_hunk:
            target = line[4:].strip()
            path = None if target == "/dev/null" else target.removeprefix("b/")
        elif _HUNK.match(line):
            flush()
            in_hunk, old, new = True, [], []
        elif in_hunk and line.startswith("\\"):
            continue  # "\ No newline at end of file"
        elif in_hunk and line[:1] in (" ", "-", "+"):
            if line[:1] != "+":
                old.append(line[1:])
            if line[:1] != "-":
                new.append(line[1:])
    flush()
    return edits


Turn = tuple[str, list[tuple[str, dict[str, Any]]]]  # (text, [(tool name, input)])


def expert_turns(patch: str, behaviour: str, workdir: str = "/testbed") -> list[Turn]:
    """The assistant turns of one behaviour for a task whose gold fix is `patch`."""
    if behaviour not in BEHAVIOURS:
        raise ConfigError(f"unknown scripted expert behaviour {behaviour!r} (one of {', '.join(BEHAVIOURS)})")
    edits = patch_edits(patch)
    if not edits:
        raise ConfigError("the task's gold patch has no hunk to replay")
    existing = sorted({p for p, old, _ in edits if old is not None})
    first = existing[0] if existing else edits[0][0]
    if behaviour == "give_up":
        return [
            ("Let me look at the code.", [("Read", {"file_path": f"{workdir}/{first}"})]),
            ("I could not find the cause of this bug, so I am leaving the code unchanged.", []),
        ]
    if behaviour == "wrong_fix":
        path, old, _ = next(e for e in edits if e[1] is not None) if existing else (first, None, "")
        if old is None:
            return [("I am not sure what to change.", [])]
        note = "\n# checked: this branch looks right"
        return [
            ("Let me look at the code.", [("Read", {"file_path": f"{workdir}/{path}"})]),
            (
                "I will note what I checked.",
                [("Edit", {"file_path": f"{workdir}/{path}", "old_string": old, "new_string": old + note})],
            ),  # fmt: skip
            ("Done.", []),
        ]
    turns: list[Turn] = [("I will read the relevant code first.", [("Read", {"file_path": f"{workdir}/{p}"})
                                                                 for p in existing])]  # fmt: skip
    if not existing:
        turns = []
    for path, old, new in edits:
        if old is None:
            turns.append(("", [("Write", {"file_path": f"{workdir}/{path}", "content": new})]))
        else:
            turns.append(
                (
                    f"Fixing {path}.",
                    [("Edit", {"file_path": f"{workdir}/{path}", "old_string": old, "new_string": new})],
                )
            )
    if behaviour == "test_edit":
        probe = "def test_probe():\n    assert True\n"
        turns.append(("I will add a test too.", [("Write", {"file_path": f"{workdir}/{PROBE_TEST}", "content": probe})]))  # fmt: skip
    turns.append(("The fix is in place.", []))
    return turns


def _offset(instance_id: str, n: int) -> int:
    return int(hashlib.sha256(instance_id.encode()).hexdigest()[:8], 16) % n


def behaviour_for(plan: Sequence[str], instance_id: str, attempt: int) -> str:
    return plan[(attempt + _offset(instance_id, len(plan))) % len(plan)]


class ExpertResponder:
    """The ScriptedLM responder answering Claude Code's Messages requests (see above `BEHAVIOURS`)."""

    def __init__(
        self,
        patches: Mapping[str, str],
        plan: Sequence[str] = DEFAULT_PLAN,
        *,
        workdir: str = "/testbed",
        statements: Mapping[str, str] | None = None,
    ) -> None:
        if not plan or any(b not in BEHAVIOURS for b in plan):
            raise ConfigError(f"scripted expert plan must list behaviours from {', '.join(BEHAVIOURS)}")
        self.patches = dict(patches)
        self.plan = tuple(plan)
        self.workdir = workdir
        self.statements = dict(statements or {})

    def locate(self, body: Mapping[str, Any]) -> tuple[str | None, int]:
        """(instance id, attempt) from metadata.user_id, else by the problem statement in the prompt."""
        user_id = str((body.get("metadata") or {}).get("user_id") or "")
        parts = user_id.rsplit(":", 2)
        if len(parts) == 3 and parts[1].isdigit():
            matches = [i for i in self.patches if parts[0].endswith(i)]
            if matches:
                return max(matches, key=len), int(parts[1])
        first = next((m for m in body.get("messages") or [] if m.get("role") == "user"), None)
        text = _text_of(first.get("content") if first else "")
        for iid, statement in self.statements.items():
            if statement and statement.strip() in text:
                return iid, 0
        return None, 0

    def __call__(self, request: dict) -> str | dict:
        body = request.get("body") or {}
        if not body.get("tools"):
            return SIDE_REPLY
        instance_id, attempt = self.locate(body)
        if instance_id is None:
            return "I do not know this task."
        turns = expert_turns(self.patches[instance_id], behaviour_for(self.plan, instance_id, attempt),
                             self.workdir)  # fmt: skip
        k = sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")
        text, calls = turns[min(k, len(turns) - 1)]
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        for j, (name, args) in enumerate(calls):
            seed = f"{instance_id}:{attempt}:{k}:{j}".encode()
            tid = "toolu_" + hashlib.sha256(seed).hexdigest()[:24]
            blocks.append({"type": "tool_use", "id": tid, "name": name, "input": args})
        return {
            "content": blocks or [{"type": "text", "text": ""}],
            "stop_reason": "tool_use" if calls else "end_turn",
            "usage": {"input_tokens": len(str(body.get("messages"))) // 4, "output_tokens": 20},
        }


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text"
    )


def scripted_expert(
    patches: Mapping[str, str],
    plan: Sequence[str] = DEFAULT_PLAN,
    *,
    api_key: str | None = None,
    statements: Mapping[str, str] | None = None,
) -> Any:
    """A started-on-enter ScriptedLM serving the expert; its `url` ends in /v1 (the Upstream wants the
    part before it: `base_url(server)`)."""
    from .scripted_lm import ScriptedLM

    return ScriptedLM(ExpertResponder(patches, plan, statements=statements), api_key=api_key)


def base_url(server: Any) -> str:
    return str(server.url).removesuffix("/v1")
