"""The production recipe (config/swegym-e2b.yaml) converts rows of all eleven SWE-Gym repositories.

The rows are SkyRL-shaped like the recipe's parquet (SWE-Gym columns inside `instance`, lists as parquet
lists), the harness is a package laid out and keyed like the SWE-Gym fork (lower-cased spec table,
mixed-case parser table), and every stage function the data rules call runs on them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sweflow.config import load_config
from sweflow.dataset.image_names import ImageNaming
from sweflow.sample.tasks import DATA_SOURCE, ENV_CLASS, write_parquet
from sweflow.stages.data import convert, convert_options, harness_from_config, list_images, validate_split
from sweflow.util import read_json
from tests.fixtures.harness_swegym import SWEGYM_REPOS, swegym_rows, write_swegym_harness

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "config" / "swegym-e2b.yaml"
SITE = ROOT / "tests" / "fixtures" / "site.yaml"  # the proxy URL a site sets


def skyrl(row: dict) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": row["problem_statement"]}],
        "env_class": ENV_CLASS,
        "instance": row,
    }


DOCKER = ROOT / "config" / "swegym-docker.yaml"  # the one-machine rung: the same rows, Docker, no training


def test_the_docker_rung_writes_the_recipes_rows_and_trains_nothing():
    e2b, docker = load_config(RECIPE, SITE), load_config(DOCKER)
    for section in ("dataset", "images", "harness", "agent"):
        assert docker[section] == e2b[section], section
    assert docker["sandbox"]["provider"] == "docker" and e2b["sandbox"]["provider"] == "e2b"
    assert not docker["train"]["enabled"] and not docker["sft"]["enabled"] and not docker["smith"]["enabled"]
    assert docker["e2e"]["instance"] is None


@pytest.mark.parametrize("recipe", [(RECIPE, SITE), (DOCKER,)], ids=["e2b", "docker"])
def test_the_recipe_converts_one_row_of_every_swegym_repository(tmp_path, monkeypatch, recipe):
    monkeypatch.setenv("E2B_API_KEY", "e2b_test_key_not_real")
    cfg = load_config(*recipe)
    assert cfg["harness"]["package"] == "swegym" and cfg["dataset"]["row_shape"] == "skyrl"
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    assert write_swegym_harness(tmp_path / "pkgs", "swegym") == "swegym"
    for name in [m for m in sys.modules if m == "swegym" or m.startswith("swegym.")]:
        monkeypatch.delitem(sys.modules, name)

    rows = swegym_rows()
    parquet = write_parquet([skyrl(r) for r in rows], tmp_path / "train.parquet")
    ds = cfg["dataset"]
    report = validate_split(
        parquet,
        tmp_path / "rows.report.json",
        split="train",
        expected_rows=len(rows),
        shape=ds["row_shape"],
        max_problem_statement_chars=ds["max_problem_statement_chars"],
    )
    assert report["rows"] == len(rows)
    naming = ImageNaming.from_config(dict(cfg["images"]))
    images = list_images(
        tmp_path / "images", tmp_path / "images.txt", parquets={"train": str(parquet)}, naming=naming,
        shape=ds["row_shape"],
    )  # fmt: skip
    assert len(images) == len(SWEGYM_REPOS)
    template_map = {img: f"sweflow-{i:02d}" for i, img in enumerate(sorted(images))}
    (tmp_path / "map.json").write_text(json.dumps(template_map))
    (tmp_path / "failures.json").write_text("{}")

    h = cfg["harness"]
    harness = harness_from_config(h["package"], h["extra_repos"], h["extra_parsers"])
    opts = convert_options(
        dataset=ds["name"],
        split="train",
        provider=cfg["sandbox"]["provider"],
        harness_cfg=h,
        agent_cfg=cfg["agent"],
        naming_cfg=cfg["images"],
        sandbox_timeout_sec=cfg["sandbox"]["timeout_sec"],
        harness=harness,
    )
    out = convert(
        parquet, tmp_path / "map.json", tmp_path / "failures.json", tmp_path / "train.jsonl",
        tmp_path / "train.convert.json", opts=opts, harness=harness, shape=ds["row_shape"],
        max_problem_statement_chars=ds["max_problem_statement_chars"],
    )  # fmt: skip
    assert out["rows"] == len(SWEGYM_REPOS) and out["skipped"] == []

    converted = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [r["metadata"]["repo"] for r in converted] == list(SWEGYM_REPOS)  # exact spelling kept
    for row, src in zip(converted, rows, strict=True):
        meta = row["metadata"]
        assert meta["docker_image"] == naming.image_for(src["instance_id"], src["repo"])
        assert (
            meta["docker_image"].startswith("xingyaoww/sweb.eval.x86_64.") and meta["docker_image"].islower()
        )
        assert meta["sandbox_image"] == template_map[meta["docker_image"]]
        assert meta["harness"]["package"] == "swegym"
        assert meta["harness"]["parser"] == SWEGYM_REPOS[src["repo"]][3]
        assert (meta["FAIL_TO_PASS"], meta["PASS_TO_PASS"]) == (src["FAIL_TO_PASS"], src["PASS_TO_PASS"])
        opts_row = meta["backend_options"]
        assert opts_row["setting_sources"] == ["user"] and opts_row["system_prompt_mode"] == "append"
        assert (opts_row["prompt_caching"], opts_row["subagents"]) == (False,) * 2
        # the recipe's converter compacts at context - response / 2 (a compaction is a new lineage)
        t = cfg["train"]
        assert opts_row["auto_compact"] is True
        assert (
            opts_row["compact_at_tokens"] == t["max_context_tokens"] - t["max_response_tokens"] // 2 == 57_536
        )
        assert opts_row["disable_nonessential_traffic"] is True and opts_row["max_turns"] == 80
        assert src["patch"].strip() not in json.dumps(row)  # no gold patch
        evaluator = meta["blackbox_execute_cmds"]["after_agent"][0]["cmd"]
        assert evaluator and meta["blackbox_execute_cmds"]["before_agent"][0]["name"] == "git_sanitizer"
    assert read_json(tmp_path / "train.convert.json")["rows"] == len(SWEGYM_REPOS)


def test_the_recipe_checks_offline_and_a_typo_in_it_is_one_line(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}

    def check(*paths):
        return subprocess.run(
            [sys.executable, "-m", "sweflow.config", *map(str, paths)], capture_output=True, text=True,
            env=env, cwd=tmp_path, timeout=60,
        )  # fmt: skip

    ok = check(RECIPE, SITE)
    assert ok.returncode == 0 and ok.stdout.startswith("ok: "), ok.stderr
    # as shipped (public_url: null) it stops before any job, naming the key and the line that set it
    (unset,) = check(RECIPE).stderr.strip().splitlines()
    line_no = RECIPE.read_text().splitlines().index("    public_url: null") + 1
    assert f"swegym-e2b.yaml:{line_no}:" in unset and "train.proxy.public_url" in unset
    text = RECIPE.read_text()
    assert "    cpu_count: 2\n" in text
    typo = tmp_path / "mine.yaml"
    typo.write_text(text.replace("    cpu_count: 2\n", "    cpu_cont: 2\n"))
    bad = check(typo, SITE)
    line_no = text.splitlines().index("    cpu_count: 2") + 1
    (line,) = bad.stderr.strip().splitlines()
    assert bad.returncode == 1 and f"mine.yaml:{line_no}:" in line
    assert "sandbox.e2b.cpu_cont" in line and "sandbox.e2b.cpu_count" in line


def test_the_recipe_caps_each_call_not_the_trajectory_and_whitens():
    """The launcher's lengths: a 65,536-token context (16,384 x CP 4) per trajectory, 16,000 tokens per call
    (the proxy's cap, which verl's rollout spec carries as `sampling.max_new_tokens`), and its advantages:
    group normalisation, then whitening over the batch."""
    from sweflow.train.recipe import Recipe

    r = Recipe.from_config(load_config(RECIPE, SITE)["train"])
    assert (r.max_context_tokens, r.max_response_tokens) == (65_536, 16_000)
    assert r.max_context_tokens == 16_384 * r.parallel.context
    assert r.norm_adv_by_std and r.batch_whiten and r.engine == "verl"
