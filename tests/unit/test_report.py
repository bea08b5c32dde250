"""sweflow.report: the page is built from the artifacts as the stages write them, shows what they say
(counts, broken tasks by reason and repository, per-step curves), leaves out what is absent, is
self-contained and byte-stable, and names the file of a malformed artifact."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sweflow.report import ReportError, collect, find_artifacts, write_report
from sweflow.stages.data import template_map
from sweflow.train.rollouts import step_stats


def _w(root: Path, rel: str, data) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(data if isinstance(data, str) else json.dumps(data))


def _sample(i: int, group: int, reward: float, aborted: bool = False, reason: str | None = None) -> dict:
    return {"aborted": aborted, "reward": reward, "group": group, "resolved": reward == 1.0,
            "failure_reason": "sandbox_timeout" if aborted else reason, "integrity_violations": [],
            "prompt_tokens": 10, "response_tokens": 5, "segments": 1}  # fmt: skip


@pytest.fixture
def tree(tmp_path):
    root = tmp_path
    _w(
        root,
        "resources/datasets/ds/revision.json",
        {"repo_id": "org/ds", "revision": "main", "sha": "a" * 40},
    )
    _w(
        root,
        "results/ds/train/rows.report.json",
        {"split": "train", "rows": 5, "repos": {"o/a": 3, "o/b": 2}},
    )
    _w(
        root,
        "results/ds/train.convert.json",
        {
            "split": "train",
            "rows": 4,
            "skipped": [
                {
                    "row": 3,
                    "instance_id": "o__b-2",
                    "field": "version",
                    "reason": "no eval script for o/b 9.9",
                }
            ],
        },
    )
    _w(root, "results/ds/images.txt", "img1\nimg2\nimg3\n")
    recs = []
    for n, ok in enumerate([True, True, False]):
        rec = {"image": f"img{n + 1}", "template": f"t{n + 1}", "ok": ok}
        if not ok:
            rec.update(step="build", error="pip install failed")
        _w(root, f"results/ds/templates/local/k{n}.json", rec)
        recs.append(str(root / f"results/ds/templates/local/k{n}.json"))
    template_map(recs, root / "results/ds/template-map.json", root / "results/ds/template-failures.json")
    rows = [{"metadata": {"instance_id": f"o__{r}-{i}", "repo": f"o/{r}"}} for i, r in enumerate("aaab")]
    _w(root, "results/ds/train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    _w(root, "results/ds/train/validation-summary.json", {
        "split": "train", "tasks": 5, "valid": 2, "verdicts": {"valid": 2, "gold_fails": 1, "flaky": 1, "unguarded": 1},
        "unguarded": [{"instance_id": "o__a-2", "verdict": "unguarded", "reason": "no canary could be planted"}],
        "unguarded_kept": False,
        "broken": [{"instance_id": "o__a-1", "verdict": "gold_fails", "reason": "fail_to_pass_failure"},
                   {"instance_id": "o__b-3", "verdict": "flaky", "reason": None}], "errors": []})  # fmt: skip
    metrics = []
    for step, rewards in enumerate([[0, 0, 1, 0], [1, 0, 1, 1]], 1):
        samples = [_sample(i, i // 2, r) for i, r in enumerate(rewards)] + [_sample(9, 2, 0, aborted=True)]
        if step == 2:  # the canaries caught one forger
            samples[1] = _sample(1, 0, 0, reason="runner_tampered")
        metrics.append({"step": step, **step_stats(samples), "kl": 0.01 * step, "clip_fraction": 0.1,
                        "tis_clipped_share": 0.0, "rollout_s": 3.0, "train_s": 1.5, "weight_sync_s": 0.0})  # fmt: skip
    _w(root, "results/ds/grpo/run1/metrics.jsonl", "".join(json.dumps(m) + "\n" for m in metrics))
    _w(root, "results/ds/grpo/run1/summary.json", {"engine": "trl", "steps": 2})
    return root


def test_sections_say_what_the_artifacts_say(tree):
    paths = find_artifacts(tree, dataset="ds", splits=["train"])
    data = collect(paths, tree)
    d = data["data"]
    assert d["splits"]["train"]["rows"] == 5 and d["splits"]["train"]["converted"] == 4
    assert d["images"] == 3 and d["templates"] == 2
    assert d["failures"] == {"img3": "build: pip install failed"}
    v = data["validation"]["splits"]["train"]
    assert v["broken_by_reason"] == {"gold_fails: fail_to_pass_failure": 1, "flaky": 1}
    assert v["broken_by_repo"] == {"o/a": {"gold_fails": 1}, "o/b": {"flaky": 1}}  # o__b-3 by its id
    assert v["unguarded"] == [["o__a-2", "no canary could be planted"]] and v["unguarded_kept"] is False
    run = data["training"]["runs"]["run1"]
    assert run["steps"] == [1, 2]
    assert run["series"]["reward_mean"] == [0.25, 0.75]
    assert run["series"]["zero_variance_group_share"] == [0.5, 0.5]
    assert run["aborted_by_reason"] == {"sandbox_timeout": 2}
    assert run["series"]["tampered"] == [0, 1]
    assert run["tampered"] == {"codes": ["runner_tampered"], "steps": [[2, 1, 1]]}
    assert data["smith"] == {"profiles": {}}
    assert data["provenance"]["dataset"]["sha"] == "a" * 40
    assert data["provenance"]["unrecorded"] == sum(len(v) for v in paths.values())  # no .provenance here


def test_page_is_self_contained_stable_and_leaves_out_absent_sections(tree, tmp_path):
    paths = find_artifacts(tree, dataset="ds", splits=["train"])
    out1, out2 = tmp_path / "a.html", tmp_path / "b.html"
    seen = []
    write_report(paths, out1, root=tree, on_section=seen.append)
    write_report(paths, out2, root=tree)
    page = out1.read_text()
    assert out1.read_bytes() == out2.read_bytes()
    assert seen == ["data", "validation", "training", "smith", "sft", "evaluation", "provenance"]
    assert re.findall(r'<section id="(\w+)"', page) == ["data", "validation", "training", "provenance"]
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)
    plots = re.findall(r'<figure class="plot" data-plot="([^"]+)"><svg', page)
    for caption in ("rows per split: in the parquet, converted", "validation verdicts per split",
                    "reward mean and resolved share per step", "aborted samples by reason",
                    "samples per step whose verdict was tampering"):  # fmt: skip
        assert caption in plots
    assert "unguarded (no canary)" in page and "<td>o__a-2</td>" in page and "<td>left out</td>" in page
    assert "Steps with tamper verdicts" in page and "<th>runner_tampered</th>" in page
    assert "no eval script for o/b 9.9" in page and "pip install failed" in page
    # nothing to draw, no empty plot: the clip series are all zero or constant but present; SFT is absent
    assert "SFT training loss per step" not in plots


def test_a_malformed_artifact_is_named(tree, tmp_path):
    (tree / "results/ds/grpo/run1/metrics.jsonl").write_text('{"step": 1}\n{not json\n')
    paths = find_artifacts(tree, dataset="ds", splits=["train"])
    with pytest.raises(ReportError, match=r"grpo/run1/metrics\.jsonl: line 2: not JSON"):
        write_report(paths, tmp_path / "r.html", root=tree)
    assert not (tmp_path / "r.html").exists()


def test_the_training_curves_get_their_own_panels_and_no_line_hides_another(tree, tmp_path):
    """Loss, grad norm, entropy and response length each in a panel of its own; two equal series (the
    reward mean and the resolved share of 0/1 rewards) drawn in styles that both show."""
    from sweflow.report import plots

    metrics_file = tree / "results/ds/grpo/run1/metrics.jsonl"
    rows = [json.loads(x) for x in metrics_file.read_text().splitlines()]
    for i, m in enumerate(rows, 1):
        m.update(policy_loss=-0.01 * i, grad_norm=0.5 * i, entropy=2.0 - 0.1 * i, tis_weight_mean=1.0)
    metrics_file.write_text("".join(json.dumps(m) + "\n" for m in rows))
    write_report(find_artifacts(tree, dataset="ds", splits=["train"]), tmp_path / "r.html", root=tree)
    page = (tmp_path / "r.html").read_text()
    figs = dict(re.findall(r'<figure class="plot" data-plot="([^"]+)">(<svg.*?</svg>)', page, re.S))
    curves = figs["policy loss, grad norm, entropy, response length per step"]
    for panel in ("policy loss", "grad norm", "entropy", "response tokens per sample", "TIS weight mean"):
        assert f">{panel}</text>" in curves, panel
    # equal series: a solid wide line and a dashed narrow one with other markers, the second on top
    svg = plots.lines([1, 2, 3], {"reward mean": [0, 1, 1], "resolved share": [0, 1, 1]}, title="t")
    widths = re.findall(r"stroke-width: ([\d.]+)", svg)
    assert "stroke-dasharray" in svg and len(set(widths)) >= 2, widths
    # a series with no value at all gets no panel; nothing at all, no figure
    assert ">b</text>" not in plots.panels([1, 2], {"a": [1, 2], "b": [None, None]}, title="t")
    assert plots.panels([1, 2], {"b": [None, None]}, title="t") is None
