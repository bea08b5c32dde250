"""Qwen3.5-4B's megatron-core config at the recipe's TP 2 x CP 4: the pinned megatron-core builds it, 0.16.x
refuses it ("Gated delta net does not support context parallel for now").

The megatron-core checks run `python -m sweflow.models.megatron_qwen35` on each megatron-core found: the one
this interpreter imports (the GPU environment, envs/train-verl.yaml) and every `pip install --target` folder
named `<venv>/megatron-core-<version>/` (`pip install --no-deps --target .venv/megatron-core-0.16.1
megatron-core==0.16.1` works from the package index;
`make test` installs it, so CI runs the refusal). The pin itself (0.19.0) is not on the package index and
declares Python >= 3.12: `make megatron-core-src MEGATRON_LM=<a Megatron-LM clone>` builds it from its release
commit 5d4cf1d00bcc (and 0.18.2 from its tag) and installs each, with triton (0.18+ imports it), as such a
folder. A version that is not installed skips its test.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sweflow.models.megatron_qwen35 import (
    QWEN35_4B,
    gdn_cp_problem,
    layer_kinds,
    transformer_config_kwargs,
    version_tuple,
)

ROOT = Path(__file__).resolve().parents[2]
ENV_FILE = ROOT / "envs" / "train-verl.yaml"
DOCKERFILE = ROOT / "envs" / "train-verl.Dockerfile"
GDN_CP_REFUSAL = (
    "Gated delta net does not support context parallel for now, but got self.context_parallel_size=4."
)


def pins(text: str) -> dict[str, str]:
    """The megatron-core version and the megatron-bridge / mbridge sources a requirements text names."""
    found = {
        "megatron-core": re.findall(r"megatron-core==([0-9][\w.]*)", text),
        "megatron-bridge": re.findall(r"megatron-bridge @ (\S+?)\"?\s", text),
        "mbridge": re.findall(r"mbridge(?:==| @ )(\S+?)\"?\s", text),
    }
    assert all(len(v) == 1 for v in found.values()), found
    return {k: v[0] for k, v in found.items()}


PIN = pins(ENV_FILE.read_text())["megatron-core"]


def installations() -> dict[str, str]:
    """megatron-core version -> the PYTHONPATH prefix that imports it ("" for this interpreter's own)."""
    found: dict[str, str] = {}
    for folder in sorted(Path(sys.prefix).glob("megatron-core-*")):
        for dist in importlib.metadata.distributions(name="megatron-core", path=[str(folder)]):
            found.setdefault(dist.version, str(folder))
    try:
        found[importlib.metadata.version("megatron-core")] = ""
    except importlib.metadata.PackageNotFoundError:
        pass
    return found


def installed(match, wanted: str) -> tuple[str, str]:
    """(version, PYTHONPATH prefix) of an installed megatron-core whose version satisfies `match`, or skip."""
    found = installations()
    for version, prefix in sorted(found.items()):
        if match(version):
            return version, prefix
    pytest.skip(
        f"megatron-core {wanted} not installed (found: {', '.join(sorted(found)) or 'none'}): a --target folder "
        f"{Path(sys.prefix) / ('megatron-core-' + wanted)} runs it (how: this test module's docstring)"
    )


def run_check(prefix: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (prefix, str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONWARNINGS"] = "ignore"
    return subprocess.run(
        [sys.executable, "-m", "sweflow.models.megatron_qwen35", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_the_hybrid_is_24_gdn_and_8_full_attention_layers_where_transformers_puts_them():
    kinds = layer_kinds()
    assert (kinds.count("gdn"), kinds.count("attention")) == (24, 8)
    assert [i for i, k in enumerate(kinds) if k == "attention"] == [3, 7, 11, 15, 19, 23, 27, 31]
    qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.configuration_qwen3_5")
    hf = qwen3_5.Qwen3_5TextConfig(num_hidden_layers=32, full_attention_interval=4)
    assert [{"linear_attention": "gdn", "full_attention": "attention"}[t] for t in hf.layer_types] == kinds


def test_the_gpu_checks_transformers_model_is_the_same_architecture_as_megatrons():
    pytest.importorskip("transformers.models.qwen3_5")
    from sweflow.models.megatron_qwen35 import QWEN35_4B, hf_text_config

    hf, mc = hf_text_config(), transformer_config_kwargs(tp=1, cp=1)
    assert [
        {"linear_attention": "gdn", "full_attention": "attention"}[t] for t in hf.layer_types
    ] == layer_kinds()
    pairs = {"hidden_size": "hidden_size", "intermediate_size": "ffn_hidden_size",
             "num_hidden_layers": "num_layers", "num_attention_heads": "num_attention_heads",
             "num_key_value_heads": "num_query_groups", "head_dim": "kv_channels",
             "linear_key_head_dim": "linear_key_head_dim", "linear_value_head_dim": "linear_value_head_dim",
             "linear_num_key_heads": "linear_num_key_heads", "linear_num_value_heads": "linear_num_value_heads",
             "linear_conv_kernel_dim": "linear_conv_kernel_dim", "rms_norm_eps": "layernorm_epsilon"}  # fmt: skip
    assert {h: getattr(hf, h) for h in pairs} == {h: mc[m] for h, m in pairs.items()}
    assert hf.vocab_size == QWEN35_4B.vocab_size == 248320
    rope = hf.rope_parameters
    assert rope["rope_theta"] == 1e7 and rope["partial_rotary_factor"] == 0.25
    assert rope["mrope_section"] == [11, 11, 10]  # 32 = a quarter of the 256-dim head, in pairs


def test_the_config_carries_the_published_sizes_and_splits_over_tp_times_cp():
    kw = transformer_config_kwargs(tp=2, cp=4)
    assert (kw["num_layers"], kw["hidden_size"], kw["ffn_hidden_size"]) == (32, 2560, 9216)
    assert (kw["num_attention_heads"], kw["num_query_groups"], kw["kv_channels"]) == (16, 4, 256)
    assert (kw["linear_num_key_heads"], kw["linear_num_value_heads"]) == (16, 32)
    assert (kw["linear_key_head_dim"], kw["linear_value_head_dim"], kw["linear_conv_kernel_dim"]) == (
        128,
        128,
        4,
    )
    assert kw["experimental_attention_variant"] == "gated_delta_net" and kw["linear_attention_freq"] == 4
    assert kw["qk_layernorm"] and kw["attention_output_gate"] and kw["gated_linear_unit"]
    assert not kw["add_bias_linear"] and not kw["add_qkv_bias"]
    assert (kw["tensor_model_parallel_size"], kw["context_parallel_size"], kw["sequence_parallel"]) == (
        2,
        4,
        True,
    )
    # GDN context parallelism moves heads across the CP group: every TP x CP rank needs whole GDN heads
    assert QWEN35_4B.linear_num_key_heads % (2 * 4) == 0 and QWEN35_4B.linear_num_value_heads % (2 * 4) == 0


def test_only_megatron_core_0_19_and_later_trains_gdn_with_context_parallelism():
    assert "refuses Gated DeltaNet with context parallelism" in gdn_cp_problem("0.16.1")
    assert "refuses" in gdn_cp_problem("0.17.1")
    assert "cp_comm_type" in gdn_cp_problem("0.18.2")
    assert gdn_cp_problem("0.19.0") is None and gdn_cp_problem("0.20.0rc1") is None
    assert version_tuple("0.18.0rc3") == (0, 18, 0)


def test_the_gpu_env_and_its_container_pin_the_same_megatron_that_trains_gdn_with_cp():
    env, image = pins(ENV_FILE.read_text()), pins(DOCKERFILE.read_text())
    assert env == image
    assert gdn_cp_problem(env["megatron-core"]) is None, env


@pytest.mark.slow
def test_megatron_core_0_16_refuses_gdn_with_context_parallel():
    version, prefix = installed(lambda v: v.startswith("0.16."), "0.16.1")
    res = run_check(prefix, "--tp", "2", "--cp", "4")
    assert res.returncode == 1, (version, res.stdout, res.stderr[-2000:])
    assert GDN_CP_REFUSAL in res.stderr
    # the same megatron-core builds it without context parallelism: the refusal is about CP, not the model
    res = run_check(prefix, "--tp", "2", "--cp", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["layers"] == {"gdn": 24, "attention": 8}


def test_megatron_core_0_18_builds_the_config_but_its_gdn_layer_rejects_cp_comm_type():
    version, prefix = installed(lambda v: v.startswith("0.18."), "0.18.2")
    res = run_check(prefix, "--tp", "2", "--cp", "4", "--cp-comm-type", "p2p")
    assert res.returncode == 1, (version, res.stderr[-2000:])
    report = json.loads(res.stdout)
    assert report["context_parallel_size"] == 4
    assert "unexpected keyword argument 'cp_comm_type'" in report["gdn_layer_kwargs_problem"]


def test_the_pinned_megatron_core_builds_qwen35_at_tp2_cp4_with_sequence_parallel():
    version, prefix = installed(lambda v: v == PIN, PIN)
    res = run_check(prefix, "--tp", "2", "--cp", "4", "--cp-comm-type", "p2p")
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout)
    assert report["megatron_core"] == PIN
    assert (report["tensor_model_parallel_size"], report["context_parallel_size"]) == (2, 4)
    assert (
        report["sequence_parallel"] is True and report["experimental_attention_variant"] == "gated_delta_net"
    )
    assert report["gdn_layer_kwargs_problem"] is None
    # its validation is live: CP 16 would leave a TP x CP rank without a whole GDN key head
    res = run_check(prefix, "--tp", "2", "--cp", "16")
    assert res.returncode == 1 and "linear_num_key_heads=16 must be a multiple of" in res.stderr, res.stderr[
        -2000:
    ]


def test_without_megatron_core_the_check_says_where_it_lives_in_one_line():
    if "" in installations().values():
        pytest.skip("this interpreter has megatron-core")
    res = run_check("", "--tp", "2", "--cp", "4")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "envs/train-verl.yaml" in res.stderr, res.stderr
