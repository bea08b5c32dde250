"""The scripted policies of the end-to-end check: assistant turns of a sample task's gold fix, as a model
would write them in the Qwen3-coder tool-call format (what the proxy parses back into tool_use blocks).

`gold_policy` reads the files of the fix, edits them and finishes; `tamper_policy` also writes a test file.
Only tasks of the embedded sample have a known gold fix (`sweflow.sample.taskdefs`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sweflow.errors import DatasetError
from sweflow.proxy.toolcalls import format_qwen_xml

SIDE_REPLY = "OK."
TEST_FILE = "tests/test_sweflow_e2e_probe.py"


@dataclass
class ScriptedPolicy:
    """Assistant turns chosen by how many assistant turns the prompt already holds.

    Picking by position (not by call count) keeps a retried request on the same turn. A request whose
    prompt lists no tools (a side request) gets `SIDE_REPLY`. `produced` records every text returned, in order.
    """

    name: str
    turns: list[str]
    tokenizer: Any
    produced: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, prompt_ids: list[int]) -> str:
        text = self.tokenizer.decode(prompt_ids)
        if "<tools>" not in text:
            reply = SIDE_REPLY
        else:
            k = max(0, text.count("<|im_start|>assistant") - 1)
            reply = self.turns[min(k, len(self.turns) - 1)]
        with self._lock:
            self.produced.append(reply)
        return reply


def gold_edits(instance_id: str) -> list[tuple[str, str, str]]:
    """(path, old, new) edits of a sample task's gold fix; DatasetError for a task outside the sample."""
    from sweflow.sample.taskdefs import TASKS

    for task in TASKS:
        if task.instance_id == instance_id:
            edits = [(p, old, new) for p, old, new in task.gold if old is not None]
            if edits:
                return edits
    raise DatasetError(
        "no scripted gold fix for this task (only the embedded sample's tasks have one)",
        row=instance_id,
        field="instance_id",
    )


def gold_turns(edits: Sequence[tuple[str, str, str]], workdir: str) -> list[str]:
    """Read every file, then edit it (Claude Code's Edit needs a prior Read).

    Written as a model would (no `replace_all`): Claude Code re-sends the Edit with `replace_all: false`
    added, and the proxy restores the session's own calls, so the turns still fold into one sample.
    """
    paths = sorted({p for p, _, _ in edits})
    turns = [
        "I will read the code first.\n" + format_qwen_xml("Read", {"file_path": f"{workdir}/{paths[0]}"})
    ]
    turns += [format_qwen_xml("Read", {"file_path": f"{workdir}/{p}"}) for p in paths[1:]]
    turns += [
        format_qwen_xml(
            "Edit",
            {"file_path": f"{workdir}/{p}", "old_string": old, "new_string": new},
        )
        for p, old, new in edits
    ]
    return turns


def gold_policy(instance_id: str, tokenizer: Any, workdir: str = "/testbed") -> ScriptedPolicy:
    turns = gold_turns(gold_edits(instance_id), workdir) + ["The fix is in place."]
    return ScriptedPolicy("gold", turns, tokenizer)


def tamper_policy(instance_id: str, tokenizer: Any, workdir: str = "/testbed") -> ScriptedPolicy:
    """The gold fix plus a new test file: the tests would pass, the integrity scan must zero the reward."""
    probe = "def test_probe():\n    assert True\n"
    write = format_qwen_xml("Write", {"file_path": f"{workdir}/{TEST_FILE}", "content": probe})
    turns = gold_turns(gold_edits(instance_id), workdir) + [write, "Done, and I added a test."]
    return ScriptedPolicy("test_edit", turns, tokenizer)
