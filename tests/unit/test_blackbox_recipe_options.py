"""The recipe's Claude Code options: config/swegym-e2b.yaml -> every converted row -> the adapter's CLI call."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweflow.blackbox.claude_options import ClaudeCodeOptions, build_argv, build_env
from sweflow.config import load_config
from sweflow.dataset.convert import convert_instance
from sweflow.errors import ConfigError
from sweflow.stages import data

ROOT = Path(__file__).resolve().parents[2]
RECIPE = {
    "working_directory": "/testbed",
    "max_turns": 80,
    "permission_mode": "acceptEdits",
    "setting_sources": ["user"],
    "system_prompt": None,
    "system_prompt_mode": "append",
    "auto_compact": True,  # at context - response / 2, as the recipe's converter
    "compact_at_tokens": 57_536,
    "prompt_caching": False,
    "disable_nonessential_traffic": True,
    "subagents": False,
}
DEFAULTS = {**RECIPE, "auto_compact": False, "compact_at_tokens": None}
# Shaped like SWE-Gym rows (two of its eleven repositories).
INSTANCES = [
    {
        "instance_id": "getmoto__moto-5752",
        "repo": "getmoto/moto",
        "version": "4.0",
        "base_commit": "b2300f1eae1323e3e8bc45f97e530ce129dff12e",
        "problem_statement": "Secrets Manager: list_secrets filter by tag-value ignores case\n",
        "hints_text": "",
        "patch": "diff --git a/moto/secretsmanager/list_secrets/filters.py b/moto/secretsmanager/list_secrets/filters.py\n",
        "FAIL_TO_PASS": [
            "tests/test_secretsmanager/test_list_secrets.py::test_with_filter_with_value_with_dash"
        ],
        "PASS_TO_PASS": ["tests/test_secretsmanager/test_list_secrets.py::test_empty"],
    },
    {
        "instance_id": "Project-MONAI__MONAI-4775",
        "repo": "Project-MONAI/MONAI",
        "version": "0.9",
        "base_commit": "83ec15685ead52f5b0c69019d88a160f60866cce",
        "problem_statement": "`ToTensor` fails on a numpy array with negative strides\n",
        "hints_text": "",
        "patch": "diff --git a/monai/transforms/utility/array.py b/monai/transforms/utility/array.py\n",
        "FAIL_TO_PASS": ["tests/test_to_tensor.py::TestToTensor::test_array_input_0"],
        "PASS_TO_PASS": ["tests/test_to_tensor.py::TestToTensor::test_single_input_0"],
    },
]


def _opts(cfg, split="train"):
    return data.convert_options(
        dataset=cfg["dataset"]["name"],
        split=split,
        provider=cfg["sandbox"]["provider"],
        harness_cfg=cfg["harness"],
        agent_cfg=cfg["agent"],
        naming_cfg=cfg["images"],
        sandbox_timeout_sec=cfg["sandbox"]["timeout_sec"],
        harness=None,
    )


def test_every_converted_row_carries_the_recipe_options(tmp_path):
    cfg = load_config(ROOT / "config" / "swegym-e2b.yaml", ROOT / "tests" / "fixtures" / "site.yaml")
    opts = _opts(cfg)
    for inst in INSTANCES:
        row = convert_instance(inst, template="sweflow-tpl", evaluator_cmd="bash /tmp/eval.sh", opts=opts)
        backend = row["metadata"]["backend_options"]
        assert backend == RECIPE, inst["instance_id"]

        # What the blackbox adapter makes of the row's options (the working directory aside).
        parsed = ClaudeCodeOptions.parse({**backend, "working_directory": str(tmp_path)}, default_workdir="/")
        argv = build_argv("claude", parsed, claude_session="u", resume=False, prompt=None)
        env = build_env(parsed, home="/h", router_url="http://r", router_token="t", base={})
        assert argv[argv.index("--setting-sources") + 1] == "user"
        assert {"Agent", "Task"} <= set(argv[argv.index("--disallowedTools") + 1].split(","))
        assert "--system-prompt" not in argv and "--append-system-prompt" not in argv
        assert env["DISABLE_PROMPT_CACHING"] == "1" and "DISABLE_AUTO_COMPACT" not in env
        # 100,000 is the least window the CLI takes; 71.92 % of its 80,000 usable tokens = 57,536
        assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "100000"
        assert env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == "71.9200"
        assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
        assert parsed.settings() == {"autoCompactEnabled": True}


def test_schema_defaults_reach_rows_of_a_config_that_names_none(tmp_path):
    """A config that sets only max_turns still writes every option (the schema's defaults) into its rows."""
    user = tmp_path / "user.yaml"
    user.write_text(
        (ROOT / "config" / "swegym-e2b.yaml").read_text().split("\nagent:")[0]
        + "\nagent:\n  backend_options:\n    max_turns: 12\n"
    )
    cfg = load_config(user)
    row = convert_instance(INSTANCES[0], template="t", evaluator_cmd="true", opts=_opts(cfg))
    assert row["metadata"]["backend_options"] == {**DEFAULTS, "max_turns": 12}


@pytest.mark.parametrize(
    ("backend", "needle"),
    [
        ("    max_turn: 5\n", "max_turn"),
        ("    disable_prompt_caching: true\n", "disable_prompt_caching"),  # older spellings: rows only
        ("    system_prompt_mode: replace\n", "system_prompt"),
        ("    setting_sources: [global]\n", "setting_sources"),
    ],
)
def test_config_rejects_unknown_or_bad_backend_options(tmp_path, backend, needle):
    user = tmp_path / "user.yaml"
    base = (ROOT / "config" / "swegym-e2b.yaml").read_text().split("\nagent:")[0]
    user.write_text(base + "\nagent:\n  backend_options:\n" + backend)
    with pytest.raises(ConfigError) as err:
        load_config(user)
    assert needle in str(err.value)
