"""Issue 46: a trained checkpoint pushed to the bundled Hub (real `huggingface_hub`, authenticated writes) with
a model card that names the recipe, the dataset commit, the evaluation figures and the manifest hash."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from huggingface_hub import HfApi, snapshot_download

from sweflow.errors import ConfigError
from sweflow.offline.local_hub import HubStore, serve
from sweflow.offline.tiny_model import tiny_model_path
from sweflow.stages.publish import publish_step


def _inputs(tmp: Path) -> tuple[Path, list[Path], Path]:
    model = tmp / "results/sample/grpo/tiny/final"
    shutil.copytree(tiny_model_path(), model)
    evals = []
    for cp, p1 in (("base", 0.0), ("grpo", 0.25)):
        f = tmp / f"results/sample/eval/validation/{cp}/summary.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps({"checkpoint": cp, "pass@1": p1, "pass@1_interval": [0.0, 0.5], "k": 2,
                                 "pass@2": p1 * 2, "tasks": 2, "attempts": 4}))  # fmt: skip
        evals.append(f)
    rev = tmp / "resources/datasets/sample/revision.json"
    rev.parent.mkdir(parents=True)
    rev.write_text(json.dumps({"repo_id": "sweflow/calclib-sample", "revision": "main", "sha": "ab" * 20}))
    return model, evals, rev


def test_the_checkpoint_and_its_card_reach_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, evals, rev = _inputs(tmp_path)
    out = tmp_path / "results/sample/publish/grpo.json"
    record = publish_step(model, evals, rev, out, out.with_suffix(".manifest.json"), checkpoint="grpo",
                          publish={"repo_id": "me/tiny-grpo", "endpoint": "local", "private": True},
                          recipe={"optim": {"lr": 1e-5}, "total_steps": 2}, base_model="sweflow/tiny-qwen3")  # fmt: skip
    assert json.loads(out.read_text()) == record and record["dataset_sha"] == "ab" * 20
    store = HubStore(tmp_path / "resources/hub")
    with serve(store) as url:  # read back through a read-only endpoint
        got = Path(snapshot_download("me/tiny-grpo", endpoint=url, cache_dir=str(tmp_path / "cache")))
        assert HfApi(endpoint=url).model_info("me/tiny-grpo").sha == record["commit"]
    for f in model.rglob("*"):
        if f.is_file():
            assert (got / f.relative_to(model)).read_bytes() == f.read_bytes(), f
    card = (got / "README.md").read_text()
    assert "ab" * 20 in card and record["manifest_sha256"] in card
    assert "| grpo | validation | 0.250 | [0.000, 0.500] | pass@2 0.500 | 2 | 4 |" in card
    assert '"lr": 1e-05' in card and "base_model: sweflow/tiny-qwen3" in card
    assert record["manifest_sha256"] == __import__("hashlib").sha256(
        out.with_suffix(".manifest.json").read_bytes()).hexdigest()  # fmt: skip


def test_writes_need_the_endpoints_token_and_a_repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, evals, rev = _inputs(tmp_path)
    out = tmp_path / "p.json"
    with pytest.raises(ConfigError, match="publish.repo_id"):
        publish_step(model, evals, rev, out, tmp_path / "m.json", checkpoint="grpo", publish={"endpoint": "local"},
                     recipe={}, base_model=None)  # fmt: skip
    with serve(HubStore(tmp_path / "store"), write_token="right") as url:
        for token in ("wrong", None):
            with pytest.raises(Exception, match="40[13]"):
                HfApi(endpoint=url, token=token).create_repo("me/x")
        monkeypatch.delenv("NO_SUCH_TOKEN", raising=False)
        with pytest.raises(ConfigError, match="NO_SUCH_TOKEN"):
            publish_step(model, evals, rev, out, tmp_path / "m.json", checkpoint="grpo",
                         publish={"repo_id": "me/x", "endpoint": url, "token_env": "NO_SUCH_TOKEN"},
                         recipe={}, base_model=None)  # fmt: skip
