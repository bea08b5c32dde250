"""sweflow.config: whose config applies, one-line errors naming file, line, key path and nearest key, and the
checks that can be made before the first job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sweflow.config import (
    DEFAULT_CONFIG,
    OVERRIDES,
    check_environment,
    layers,
    load_config,
    merge,
    workflow_config,
)
from sweflow.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "tests" / "fixtures" / "site.yaml"  # the proxy URL a site sets


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


ONE_SPLIT = """\
dataset:
  name: mine
  repo_id: me/tasks
  hub:
    offline_dir: /data/mine
  splits:
    dev:
      file: dev.parquet
harness:
  extra_repos: sample
"""


def test_embedded_default_applies_only_without_a_config_file(tmp_path):
    default = load_config()
    assert list(default["dataset"]["splits"]) == ["train", "validation"]
    assert default["e2e"]["instance"] == "sweflow__calclib-3"
    assert default["images"]["prefix"] == "sweflow-sample/sweb.eval.x86_64."

    mine = load_config(write(tmp_path, "mine.yaml", ONE_SPLIT))
    assert list(mine["dataset"]["splits"]) == ["dev"]  # the sample's splits do not leak in
    assert mine["e2e"]["instance"] is None
    assert mine["images"]["prefix"] == "xingyaoww/sweb.eval.x86_64."  # schema default, not the sample's
    assert mine["agent"]["backend_options"]["max_turns"] == 80
    assert mine["sandbox"]["docker"]["cpus"] == 2  # nested defaults filled


def test_files_merge_in_order_and_overrides_go_on_top(tmp_path):
    mine = write(tmp_path, "mine.yaml", ONE_SPLIT)
    more = write(tmp_path, "more.yaml", "dataset:\n  splits:\n    test: {file: test.parquet, rows: 3}\n")
    cfg = load_config(mine, more, overrides={"sandbox": {"provider": "docker"}})
    assert list(cfg["dataset"]["splits"]) == ["dev", "test"] and cfg["sandbox"]["provider"] == "docker"
    layered = load_config(DEFAULT_CONFIG, mine)  # building on the sample, on purpose
    assert list(layered["dataset"]["splits"]) == ["train", "validation", "dev"]
    only_override = load_config(overrides={"validation": {"repeats": 5}})
    assert only_override["validation"]["repeats"] == 5 and only_override["e2e"]["instance"]


@pytest.mark.parametrize(
    "text, path, line, hint",
    [
        ("sandbox:\n  docker:\n    netwrok: none\n", "sandbox.docker.netwrok", 3, None),
        ("sandbox:\n  docker:\n    mem_mbb: 10\n", "sandbox.docker.mem_mbb", 3, "'sandbox.docker.mem_mb'"),
        ("sandbox:\n  local:\n    template_root: x\n", "sandbox.local.template_root", 3, "templates_root"),
        ("sandbox:\n  e2b:\n    cpu_cnt: 4\n", "sandbox.e2b.cpu_cnt", 3, "'sandbox.e2b.cpu_count'"),
        ("agent:\n  backend_options:\n    max_turn: 5\n", "agent.backend_options.max_turn", 3, "max_turns"),
        ("dataset:\n  hub:\n    endpont: local\n", "dataset.hub.endpont", 3, "'dataset.hub.endpoint'"),
        ("dataset:\n  splits:\n    dev: {file: d.parquet, row: 3}\n", "dataset.splits.dev.row", 3, "rows"),
        ("harness:\n  packge: swebench\n", "harness.packge", 2, "'harness.package'"),
        ("sandbox:\n  cpus: 3\n", "sandbox.cpus", 2, "'sandbox.docker.cpus'"),  # right key, wrong section
        ("datasett:\n  name: x\n", "datasett", 1, "'dataset'"),
    ],
)
def test_unknown_keys_are_rejected_at_every_level(tmp_path, text, path, line, hint):
    f = write(tmp_path, "user.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_config(f)
    msg = str(err.value)
    assert "\n" not in msg and len(msg) < 300, msg
    assert msg.startswith(f"{f}:{line}: field '{path}': unknown key"), msg
    if hint:
        assert "did you mean" in msg and hint in msg, msg


def test_unknown_key_message_says_how_many_more(tmp_path):
    f = write(tmp_path, "u.yaml", "sandbox:\n  docker: {cpuss: 1, memmb: 2}\n")
    with pytest.raises(ConfigError, match=r"u\.yaml:2: field 'sandbox\.docker\.cpuss': unknown key; 1 more"):
        load_config(f)


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    f = write(tmp_path, "broken.yaml", "dataset:\n  name: x\n  splits: [a,\nsandbox: {}\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    msg = str(err.value)
    assert msg.startswith(f"{f}:5: YAML syntax error: did not find expected ',' or ']'"), msg
    assert msg.endswith("(while parsing a flow sequence at line 3)"), msg
    assert "\n" not in msg
    tab = write(tmp_path, "tab.yaml", "dataset:\n\tname: x\n")
    with pytest.raises(ConfigError, match=rf"^{tab}:2: YAML syntax error"):
        load_config(tab)
    top = write(tmp_path, "list.yaml", "- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(top)


def test_schema_error_is_one_short_line_naming_the_file_that_set_the_key(tmp_path):
    first = write(tmp_path, "first.yaml", ONE_SPLIT)
    second = write(tmp_path, "second.yaml", "sandbox:\n  provider: local\n  timeout_sec: soon\n")
    with pytest.raises(ConfigError) as err:
        load_config(first, second)
    msg = str(err.value)
    assert msg.startswith(f"{second}:3: field 'sandbox.timeout_sec': 'soon' is not of type"), msg
    assert "properties" not in msg and "\n" not in msg  # no schema dump
    third = write(tmp_path, "third.yaml", "dataset: {splits: {dev: {file: 3}}}\n")
    with pytest.raises(ConfigError, match=rf"^{third}:1: field 'dataset.splits.dev.file': 3 is not of type"):
        load_config(first, third)
    # a key set on the command line is named as such
    with pytest.raises(ConfigError, match=rf"^{OVERRIDES}: field 'sandbox.provider': 'e2bb' is not one of"):
        load_config(first, overrides={"sandbox": {"provider": "e2bb"}})


def test_origins_follow_the_merge(tmp_path):
    a = write(tmp_path, "a.yaml", "sandbox:\n  docker:\n    cpus: 1\n    mem_mb: 100\n")
    b = write(tmp_path, "b.yaml", "sandbox:\n  docker:\n    cpus: 4\n")
    cfg, origins = merge(layers([a, b]))
    assert cfg["sandbox"]["docker"] == {"cpus": 4, "mem_mb": 100}
    assert origins[("sandbox", "docker", "cpus")] == f"{b}:3"
    assert origins[("sandbox", "docker", "mem_mb")] == f"{a}:4"
    c = write(tmp_path, "c.yaml", "sandbox:\n  docker: null\n")
    _, origins = merge(layers([a, c]))  # replaced by a scalar: the old children are gone
    assert ("sandbox", "docker", "cpus") not in origins and origins[("sandbox", "docker")] == f"{c}:2"


def test_select_splits_and_extra_repos_are_checked_with_nearest_names(tmp_path):
    f = write(tmp_path, "s.yaml", ONE_SPLIT + "  select_splits: [deb]\n")
    f.write_text(ONE_SPLIT.replace("harness:", "  select_splits: [deb]\nharness:"))
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert str(err.value).startswith(f"{f}:9: field 'dataset.select_splits': 'deb' is not a configured split")
    assert "did you mean 'dev'?" in str(err.value)
    g = write(tmp_path, "r.yaml", ONE_SPLIT.replace("extra_repos: sample", "extra_repos: sampel"))
    with pytest.raises(
        ConfigError,
        match=r"r\.yaml:10: field 'harness\.extra_repos': 'sampel' is not a known set.*did you mean 'sample'",
    ):
        load_config(g)
    h = write(tmp_path, "d.yaml", ONE_SPLIT.replace("extra_repos: sample", "extra_repos: {acme/w: '1.0'}"))
    with pytest.raises(ConfigError, match=r"field 'harness\.extra_repos\.acme/w': must map versions"):
        load_config(h)
    ok = write(
        tmp_path, "ok.yaml", ONE_SPLIT.replace("extra_repos: sample", "extra_repos: {acme/w: {'1.0': {}}}")
    )
    assert load_config(ok)["harness"]["extra_repos"] == {"acme/w": {"1.0": {}}}


def test_environment_checks_before_the_first_job(tmp_path):
    f = write(tmp_path, "e.yaml", ONE_SPLIT + "sandbox:\n  provider: e2b\n")
    cfg, origins = merge(layers([f]))
    load_config(f)  # the config itself is fine
    from sweflow.config import check

    check(cfg, origins)
    secret = "e2b_" + "k" * 30
    check_environment(cfg, origins, env={"E2B_API_KEY": secret})
    with pytest.raises(ConfigError) as err:
        check_environment(cfg, origins, env={})
    assert str(err.value).startswith(f"{f}:12: field 'sandbox.provider': the e2b provider needs E2B_API_KEY")
    cfg["harness"]["package"] = "sweflow_no_such_harness"
    with pytest.raises(
        ConfigError,
        match=r"field 'harness.package': harness package 'sweflow_no_such_harness' is not installed",
    ):
        check_environment(cfg, origins, env={"E2B_API_KEY": secret})
    # with conda envs the harness need not be installed here, but one of them must pin it
    with pytest.raises(ConfigError, match=r"'sweflow_no_such_harness' is pinned in no conda env"):
        check_environment(cfg, origins, conda=True, env={"E2B_API_KEY": secret})
    cfg["harness"]["package"] = "swegym"  # pinned (envs/harness.txt), not installed here
    check_environment(cfg, origins, conda=True, env={"E2B_API_KEY": secret})


def test_workflow_config_checks_snakemakes_config_in_place(tmp_path):
    f = write(tmp_path, "w.yaml", ONE_SPLIT)
    config = yaml.safe_load(f.read_text()) | {"validation": {"repeats": 3}}
    out = workflow_config(config, configfiles=[f], overrides={"validation": {"repeats": 3}})
    assert out is config and config["validation"]["repeats"] == 3 and config["validation"]["parallel"] == 2
    assert config["sandbox"]["provider"] == "local"
    bad = {"sandbox": {"docker": {"netwrok": "none"}}}
    with pytest.raises(ConfigError, match=rf"^{OVERRIDES}: field 'sandbox.docker.netwrok': unknown key"):
        workflow_config(bad, configfiles=[], overrides=bad)


def test_error_messages_redact_url_credentials():
    err = ConfigError("cannot reach http://alice:s3cret-pass@hub.example/x", field="dataset.hub.endpoint")
    assert "s3cret" not in str(err) and "alice" not in str(err) and "hub.example/x" in str(err)


def test_module_entry_point_checks_files_offline(tmp_path):
    bad = write(tmp_path, "bad.yaml", "sandbox:\n  docker:\n    netwrok: none\n")
    res = subprocess.run(
        [sys.executable, "-m", "sweflow.config", str(bad)], capture_output=True, text=True, cwd=ROOT
    )
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and f"{bad}:3: field 'sandbox.docker.netwrok'" in res.stderr
    good = subprocess.run([sys.executable, "-m", "sweflow.config"], capture_output=True, text=True, cwd=ROOT)
    assert good.returncode == 0 and "config/config.yaml" in good.stdout


def test_production_config_is_valid():
    cfg = load_config(ROOT / "config" / "swegym-e2b.yaml", SITE)
    assert cfg["e2e"]["instance"] is None and cfg["sandbox"]["provider"] == "e2b"
    assert list(cfg["dataset"]["splits"]) == ["train", "validation"]


def test_sft_recipe_is_valid_on_the_production_config():
    """config/swesmith-sft.yaml as the README runs it: layered on swegym-e2b.yaml, SWE-smith's batch."""
    cfg = load_config(ROOT / "config" / "swegym-e2b.yaml", ROOT / "config" / "swesmith-sft.yaml", SITE)
    tr = cfg["sft"]["train"]
    per_update = (
        tr["per_device_batch"] * tr["grad_accum"] * tr["parallel"]["nodes"] * tr["parallel"]["gpus_per_node"]
    )
    assert per_update == 8 and tr["max_length"] == 32768 and tr["overlong"] == "truncate"
    assert cfg["train"]["enabled"] is False


@pytest.mark.parametrize(
    "text, expected",
    [
        ("http://user:hf_xxx@host/x", "http://***REDACTED***@host/x"),
        (
            "fetch https://tok3n@hub.example:8443/api?q=1 failed",
            "fetch https://***REDACTED***@hub.example:8443/api?q=1 failed",
        ),
        ("http://hub.example/a@b and git@github.com:o/r", "http://hub.example/a@b and git@github.com:o/r"),
    ],
)
def test_url_credentials_are_redacted_wherever_redact_runs(text, expected):
    from sweflow.provenance import redact_value
    from sweflow.util import redact

    assert redact(text, []) == expected
    assert redact_value({"endpoint": text}, [])["endpoint"] == expected  # provenance params


def test_the_production_recipe_without_a_proxy_url_stops_at_config_time_naming_the_key():
    """E2B sandboxes reach the proxy over the internet: with public_url null the recipe is refused before the
    first job (not inside train_grpo after the validation), and so is the SFT branch's."""
    recipe = ROOT / "config" / "swegym-e2b.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(recipe)
    assert err.value.field == "train.proxy.public_url" and "swegym-e2b.yaml:" in err.value.one_line()
    with pytest.raises(ConfigError) as err:
        load_config(recipe, ROOT / "config" / "swesmith-sft.yaml",
                    overrides={"train": {"proxy": {"public_url": "https://p.example"}}})  # fmt: skip
    assert err.value.field == "sft.collect.proxy.public_url"
    load_config(recipe, ROOT / "config" / "swesmith-sft.yaml", SITE)
    # off E2B the proxy is reached directly: nothing to set
    load_config(recipe, overrides={"sandbox": {"provider": "docker"}})


def test_cloud_sandboxes_need_one_declared_proxy_endpoint():
    """E2B cannot reach a random port, nor one port per verl worker: port 0 and a "{port}" URL on verl stop
    the recipe at config time, each naming its key; the site's single URL on the declared port passes."""
    recipe = ROOT / "config" / "swegym-e2b.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(recipe, SITE, overrides={"train": {"proxy": {"port": 0}}})
    assert err.value.field == "train.proxy.port" and "port 0" in err.value.one_line()
    with pytest.raises(ConfigError) as err:
        load_config(recipe, SITE, overrides={"train": {"proxy": {"public_url": "https://p.example:{port}"}}})
    assert err.value.field == "train.proxy.public_url" and "one proxy endpoint" in err.value.one_line()
    cfg = load_config(recipe, SITE)
    assert cfg["train"]["proxy"]["port"] == 8800 and "{port}" not in cfg["train"]["proxy"]["public_url"]
    # the TRL engine's processes on one machine may publish a declared port range
    trl = {
        "engine": "trl",
        "parallel": {"tensor": 1, "context": 1},
        "proxy": {"public_url": "https://p:{port}"},
    }
    load_config(recipe, SITE, overrides={"train": trl})


def test_a_verl_launch_the_engine_would_refuse_is_refused_at_config_time():
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "config" / "swegym-e2b.yaml", SITE,
                    overrides={"train": {"optim": {"grad_clip": float("inf")}}})  # fmt: skip
    assert "is not a finite number" in str(err.value) and "swegym-e2b.yaml" not in str(err.value)
