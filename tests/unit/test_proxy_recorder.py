"""Linearisation of recorded turns into training samples: append, drift re-align, divergence."""

from __future__ import annotations

from sweflow.proxy.recorder import LinearizeConfig, SessionRecord, Turn, linearize


def turn(index, prompt, output, finish="stop", aborted=False):
    return Turn(
        index=index,
        prompt_ids=list(prompt),
        output_ids=list(output),
        logprobs=[-0.1 * (k + 1) for k in range(len(output))],
        finish_reason=finish,
        aborted=aborted,
    )


def check_shapes(sample):
    n = len(sample["token_ids"])
    assert len(sample["loss_mask"]) == n and len(sample["rollout_logprobs"]) == n
    for m, lp in zip(sample["loss_mask"], sample["rollout_logprobs"], strict=True):
        if m == 0:
            assert lp == 0.0


def test_single_turn():
    [s] = linearize([turn(0, [1, 2, 3], [7, 8])])
    assert s["token_ids"] == [1, 2, 3, 7, 8]
    assert s["loss_mask"] == [0, 0, 0, 1, 1]
    assert s["rollout_logprobs"] == [0.0, 0.0, 0.0, -0.1, -0.2]
    assert s["prompt_length"] == 3 and s["num_turns"] == 1 and s["finish_reason"] == "stop"


def test_append_when_prompt_extends_sample():
    t0 = turn(0, [1, 2, 3], [7, 8])
    t1 = turn(1, [1, 2, 3, 7, 8, 20, 21], [9], finish="length")
    [s] = linearize([t1, t0])  # order comes from the turn index, not the list
    assert s["token_ids"] == [1, 2, 3, 7, 8, 20, 21, 9]
    assert s["loss_mask"] == [0, 0, 0, 1, 1, 0, 0, 1]
    assert s["rollout_logprobs"][-1] == -0.1
    assert s["num_turns"] == 2 and s["finish_reason"] == "length" and s["prompt_length"] == 3
    assert s["drift_realignments"] == 0
    check_shapes(s)


def test_small_drift_realigns_and_masks_differing_tokens():
    t0 = turn(0, [1, 2, 3], [7, 8, 9])
    # the template re-tokenised the previous output: 8, 9 became 80
    t1 = turn(1, [1, 2, 3, 7, 80, 20], [5, 6])
    [s] = linearize([t0, t1], LinearizeConfig(max_drift_tokens=2))
    assert s["token_ids"] == [1, 2, 3, 7, 80, 20, 5, 6]
    assert s["loss_mask"] == [0, 0, 0, 1, 0, 0, 1, 1]
    assert s["drift_realignments"] == 1 and s["num_turns"] == 2
    check_shapes(s)


def test_drift_beyond_threshold_starts_new_sample():
    t0 = turn(0, [1, 2, 3], [7, 8, 9])
    t1 = turn(1, [1, 2, 3, 7, 80, 20], [5])
    samples = linearize([t0, t1], LinearizeConfig(max_drift_tokens=1))
    assert len(samples) == 2
    assert samples[1]["token_ids"] == [1, 2, 3, 7, 80, 20, 5]
    assert samples[1]["prompt_length"] == 6


def test_mismatch_inside_first_prompt_is_divergence_even_if_short():
    t0 = turn(0, [1, 2, 3], [7])
    t1 = turn(1, [1, 2, 4, 7, 5], [6])  # compaction rewrote the system prompt
    assert len(linearize([t0, t1], LinearizeConfig(max_drift_tokens=8))) == 2


def test_shorter_prompt_is_a_retry_not_drift():
    t0 = turn(0, [1, 2, 3], [7, 8])
    t1 = turn(1, [1, 2, 3, 7], [9])  # regenerate from inside the previous output
    assert len(linearize([t0, t1], LinearizeConfig(max_drift_tokens=8))) == 2


def test_divergence_then_continue_new_sample():
    t0 = turn(0, [1, 2], [3])
    t1 = turn(1, [50, 51], [52])  # sub-agent
    t2 = turn(2, [50, 51, 52, 60], [61])
    s0, s1 = linearize([t0, t1, t2])
    assert s0["num_turns"] == 1
    assert s1["token_ids"] == [50, 51, 52, 60, 61] and s1["num_turns"] == 2
    assert s1["turn_indices"] == [1, 2]


def test_aborted_turn_skipped_unless_included():
    t0 = turn(0, [1, 2], [3], aborted=True)
    t1 = turn(1, [1, 2], [4])  # the agent retried the same prompt
    assert [s["token_ids"] for s in linearize([t0, t1])] == [[1, 2, 4]]
    assert len(linearize([t0, t1], LinearizeConfig(include_aborted=True))) == 2


def test_session_record_drain_and_indices():
    rec = SessionRecord("s1", {"k": "v"})
    i0, i1 = rec.next_index(), rec.next_index()
    rec.add(turn(i1, [1, 2, 3, 4], [5]))
    rec.add(turn(i0, [1, 2], [3]))
    out = rec.read()
    assert [t["index"] for t in out["turns"]] == [0, 1]
    assert len(out["samples"]) == 1 and out["metadata"] == {"k": "v"}
    assert len(rec.read(drain=True)["turns"]) == 2
    assert rec.read()["turns"] == [] and rec.read()["samples"] == []
