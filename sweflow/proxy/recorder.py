"""Per-session turn records and their linearisation into training samples.

A turn is one engine call: prompt ids, output ids, output logprobs, finish reason, timings. `linearize`
folds a session's turns into as few samples as possible (append, drift or divergence: see above `_fold`);
with token-in/token-out (sweflow.proxy.tito) it folds them per lineage.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from sweflow.proxy.tito import LineageBook
from sweflow.util import common_prefix_length


@dataclass
class Turn:
    """One recorded engine call of a session."""

    index: int
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    timings: dict[str, float] = field(default_factory=dict)
    aborted: bool = False
    stop_reason: str = ""
    model: str = ""
    weight_version: int | None = None
    # The tool calls the model made in this turn ({"name", "input"}), as parsed here: the integrity
    # scan reads these, never an account the agent's sandbox gives of them.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    # The whole exchange in Messages form (system, tools, messages sent; content blocks answered), kept in
    # pass-through mode and when ProxyConfig.record_messages is set: what chat-message trajectories use.
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    # Token-in/token-out: the lineage the turn extends or starts (None: built by re-rendering) and how its
    # prompt was built ("append", or why a new lineage started: first, history_rewrite, ...; "render").
    lineage: int | None = None
    token_build: str = "render"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LinearizeConfig:
    """Thresholds for folding turns into samples."""

    max_drift_tokens: int = 8
    include_aborted: bool = False


class _Builder:
    def __init__(self, turn: Turn) -> None:
        self.token_ids = list(turn.prompt_ids)
        self.loss_mask = [0] * len(turn.prompt_ids)
        self.logprobs = [0.0] * len(turn.prompt_ids)
        self.prompt_length = len(turn.prompt_ids)
        self.turns: list[int] = []
        self.finish_reason = ""
        self.drift_events = 0
        self.lineage = turn.lineage
        self.lineage_reason = turn.token_build
        self.add_output(turn)

    def add_output(self, turn: Turn) -> None:
        self.token_ids += turn.output_ids
        self.loss_mask += [1] * len(turn.output_ids)
        self.logprobs += list(turn.logprobs)
        self.turns.append(turn.index)
        self.finish_reason = turn.finish_reason

    def extend_from(self, turn: Turn, keep: int) -> None:
        """Keep the first `keep` tokens, then the rest of the new prompt (masked), then the output."""
        del self.token_ids[keep:], self.loss_mask[keep:], self.logprobs[keep:]
        new = turn.prompt_ids[keep:]
        self.token_ids += new
        self.loss_mask += [0] * len(new)
        self.logprobs += [0.0] * len(new)
        self.add_output(turn)

    def to_dict(self) -> dict[str, Any]:
        return {
            "token_ids": self.token_ids,
            "loss_mask": self.loss_mask,
            "rollout_logprobs": self.logprobs,
            "prompt_length": self.prompt_length,
            "num_turns": len(self.turns),
            "finish_reason": self.finish_reason,
            "turn_indices": self.turns,
            "drift_realignments": self.drift_events,
            "lineage": self.lineage,
            "lineage_reason": self.lineage_reason,
        }


# Aborted turns (the client never saw the answer) are skipped unless asked for.
#
# With token-in/token-out (sweflow.proxy.tito) every turn names its lineage: turns are folded per lineage
# (each lineage's prompts extend each other exactly, so a lineage is one sample and drift never applies) and
# the samples are ordered by their first turn; each sample says its lineage and why the lineage started.
def linearize(turns: list[Turn], config: LinearizeConfig | None = None) -> list[dict[str, Any]]:
    """Fold turns (taken in index order) into samples.

    Each sample: token_ids, loss_mask (1 = model output), rollout_logprobs (0.0 where masked),
    prompt_length (the first turn's prompt), num_turns, finish_reason (of its last turn), turn_indices,
    drift_realignments. The three token lists always have equal length.
    """
    cfg = config or LinearizeConfig()
    kept = [t for t in sorted(turns, key=lambda t: t.index) if cfg.include_aborted or not t.aborted]
    groups: dict[Any, list[Turn]] = {}
    for turn in kept:  # token-in/token-out turns fold per lineage; re-rendered turns form one group
        groups.setdefault(("lineage", turn.lineage) if turn.lineage is not None else "render", []).append(
            turn
        )
    samples: list[_Builder] = []
    for group in groups.values():
        samples += _fold(group, cfg)
    samples.sort(key=lambda b: b.turns[0])
    return [s.to_dict() for s in samples]


# A turn is one engine call: prompt ids, output ids, output logprobs, finish reason, timings. An agent's turns
# usually extend each other (turn k's prompt = turn k-1's prompt + output + new tool results), so `linearize`
# folds them into as few samples as possible:
#
# - append: the new prompt starts with the sample so far -> the new prompt tokens get loss mask 0, the output
#   tokens mask 1 with their logprobs (masked tokens carry logprob 0);
# - drift: the prompt matches the sample except for at most `max_drift_tokens` trailing tokens of it (the chat
#   template re-tokenised the previous output, dropped a stop token, ...), the mismatch lies after the
#   sample's first prompt and the new prompt is at least as long as the sample -> the sample is cut back to
#   the common prefix and continues from the new prompt, so the differing tokens are masked prompt tokens;
# - divergence: anything else (context compaction, a sub-agent, a retry) starts a new sample.
def _fold(turns: list[Turn], cfg: LinearizeConfig) -> list[_Builder]:
    samples: list[_Builder] = []
    current: _Builder | None = None
    for turn in turns:
        if current is not None:
            seq = current.token_ids
            keep = common_prefix_length(seq, turn.prompt_ids)
            if keep == len(seq):
                current.extend_from(turn, keep)
                continue
            # Only the sample's own output may drift (a mismatch inside the first prompt is a new context),
            # and the prompt must reach past the sample (a shorter one is a retry or a fork, not a follow-up).
            drift = len(seq) - keep
            if (
                turn.lineage is None
                and drift <= cfg.max_drift_tokens
                and keep >= current.prompt_length
                and len(turn.prompt_ids) >= len(seq)
            ):
                current.drift_events += 1
                current.extend_from(turn, keep)
                continue
        current = _Builder(turn)
        samples.append(current)
    return samples


class SessionRecord:
    """The turns of one session; thread-safe. Turn indices are given out when a request starts."""

    def __init__(self, session_id: str, metadata: dict | None = None, *, token: str = "") -> None:
        self.session_id = session_id
        self.token = token  # the session's bearer secret (never part of what read() returns)
        self.metadata = dict(metadata or {})
        self.finalized = False
        self._turns: list[Turn] = []
        self._next_index = 0
        self._lock = threading.Lock()
        self._tool_inputs: dict[str, dict] = {}
        self._in_flight = 0
        self.lineages = LineageBook()  # token-in/token-out state (sweflow.proxy.tito)
        self._commits: dict[int, tuple[int, int]] = {}  # turn index -> (lineage, version it committed)

    def enter(self, limit: int | None) -> bool:
        """Count one request in flight unless `limit` are already (None: no limit)."""
        with self._lock:
            if limit is not None and self._in_flight >= limit:
                return False
            self._in_flight += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def remember_tool_inputs(self, blocks: list[dict]) -> None:
        """Keep each tool_use input exactly as the model produced it (keys in the model's order)."""
        with self._lock:
            for block in blocks:
                if block.get("type") == "tool_use":
                    self._tool_inputs[block["id"]] = block["input"]

    def restore_tool_inputs(self, messages: list[dict]) -> list[dict]:
        """The history with this session's own tool calls restored to what the model wrote.

        Agents re-serialise earlier tool calls (Claude Code adds `replace_all: false` to Edit, first), so
        the rendered history would no longer extend the previous prompt + output token for token and every
        turn would start a new training sample. Calls the session did not produce are left as sent."""
        with self._lock:
            known = dict(self._tool_inputs)
        if not known:
            return messages
        out = []
        for msg in messages:
            content = msg.get("content") if isinstance(msg, dict) else None
            if msg.get("role") == "assistant" and isinstance(content, list):
                content = [
                    {**b, "input": known[b["id"]]}
                    if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") in known
                    else b
                    for b in content
                ]
                msg = {**msg, "content": content}
            out.append(msg)
        return out

    def next_index(self) -> int:
        with self._lock:
            index = self._next_index
            self._next_index += 1
            return index

    def add(self, turn: Turn, commit: tuple[int, int] | None = None) -> None:
        """Keep `turn`; `commit` (lineage, version) is the lineage commit its answer made."""
        with self._lock:
            self._turns.append(turn)
            if commit is not None:
                self._commits[turn.index] = commit

    def mark_aborted(self, index: int) -> None:
        """The turn's answer never reached the agent: linearisation skips it and its lineage commit is
        undone, so the agent's retry extends the lineage as it stood before (one sample, not two)."""
        with self._lock:
            for turn in self._turns:
                if turn.index == index:
                    turn.aborted = True
            commit = self._commits.pop(index, None)
        if commit is not None:
            self.lineages.rollback(*commit)

    def num_turns(self) -> int:
        with self._lock:
            return len(self._turns)

    def read(self, drain: bool = False, config: LinearizeConfig | None = None) -> dict[str, Any]:
        """Samples and turns recorded so far; `drain` removes what was returned.

        Draining mid-session breaks the fold: the next turn starts a new sample.
        """
        with self._lock:
            turns = sorted(self._turns, key=lambda t: t.index)
            if drain:
                self._turns = []
        return {
            "session_id": self.session_id,
            "finalized": self.finalized,
            "metadata": self.metadata,
            # pass-through turns carry messages, not tokens: nothing to fold into token samples
            "samples": linearize([t for t in turns if t.prompt_ids], config),
            "turns": [t.to_dict() for t in turns],
        }
