"""The conda envs: every rule that builds eval scripts or grades installs the harness pin (envs/harness.txt),
and a harness no env pins is refused at config time when the run deploys conda envs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sweflow.config import check_environment, harness_pins, load_config
from sweflow.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
# the rules that build an eval script or run the harness's grader (convert writes the official eval script
# and parser into every row; the rest evaluate patches)
GRADING_RULES = {"convert", "validate_task", "e2e_check", "evaluate_predictions", "collect_trajectories",
                 "repo_env", "validate_candidates", "train_grpo", "evaluate_checkpoint", "grade_predictions"}  # fmt: skip


def rule_envs() -> dict[str, list[str]]:
    """rule -> the env files its `conda:` directive can name (both sides of a conditional)."""
    out: dict[str, list[str]] = {}
    for smk in (ROOT / "rules").glob("*.smk"):
        for block in re.split(r"\n(?=rule )", smk.read_text()):
            m = re.match(r"rule (\w+):", block)
            conda = re.search(r"conda:\n\s+(.+)\n", block)
            if m and conda:
                out[m.group(1)] = re.findall(r'"\.\./(envs/[\w.-]+\.yaml)"', conda.group(1))
    return out


def pip_lines(env_file: str) -> list[str]:
    deps = yaml.safe_load((ROOT / env_file).read_text())["dependencies"]
    return next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)


def test_every_grading_rule_runs_in_an_env_that_installs_the_harness_pin():
    envs = rule_envs()
    assert GRADING_RULES <= set(envs), GRADING_RULES - set(envs)
    for rule in sorted(GRADING_RULES):
        assert envs[rule], rule
        for env_file in envs[rule]:
            lines = pip_lines(env_file)
            assert "-r harness.txt" in lines, (rule, env_file)
            # the pin lives in one place: no env names a harness package of its own
            assert not [x for x in lines if re.match(r"(swebench|swegym)\b", x)], (rule, env_file)
    docker = (ROOT / "envs" / "train-verl.Dockerfile").read_text()
    assert "COPY envs/harness.txt" in docker and "-r /tmp/harness.txt" in docker


def test_the_pin_file_pins_both_harnesses_exactly():
    pins = harness_pins()
    assert set(pins) == {"swebench", "swegym"}
    assert pins["swebench"] == "swebench==4.1.0"
    assert re.search(r"@[0-9a-f]{40}$", pins["swegym"]), "a git pin names a commit"


def test_a_harness_no_env_pins_is_refused_before_any_job_when_envs_are_conda():
    from sweflow.config import schema

    # the schema's choices are exactly the pinned packages
    assert set(schema()["properties"]["harness"]["properties"]["package"]["enum"]) == set(harness_pins())
    cfg = load_config()
    cfg["harness"]["package"] = "swebench_fork"  # a schema that drifted from the pins
    with pytest.raises(ConfigError) as err:
        check_environment(cfg, {}, conda=True)
    assert err.value.field == "harness.package" and "envs/harness.txt" in str(err.value)
    check_environment(load_config(), {}, conda=True)  # swebench: pinned
