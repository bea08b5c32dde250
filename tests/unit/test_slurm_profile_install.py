"""`sweflow slurm-profile`: profiles/slurm installed where Snakemake finds the named profile `slurm`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sweflow.cli import main
from sweflow.errors import ConfigError
from sweflow.profiles import SOURCE, install_slurm_profile, user_profile_dir

ROOT = Path(__file__).resolve().parents[2]


def test_the_profile_lands_where_snakemake_looks_with_the_site_values(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    from snakemake.cli import get_profile_dir

    rc = main(["slurm-profile", "--account", "lab-7", "--cpu-partition", "short", "--gpu-partition", "a100"])
    assert rc == 0
    target = tmp_path / "xdg" / "snakemake" / "slurm" / "config.yaml"
    assert user_profile_dir() / "config.yaml" == target and str(target) in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)  # not the repository: only the user folder has it
    found = get_profile_dir("slurm")
    assert found is not None and Path(found[1]) == target
    got = yaml.safe_load(target.read_text())
    want = yaml.safe_load(SOURCE.read_text())
    assert got["default-resources"]["slurm_account"] == "lab-7"
    assert got["default-resources"]["slurm_partition"] == "short"
    for rule in ("train_grpo", "train_sft", "megatron_checkpoint"):
        assert got["set-resources"][rule]["slurm_partition"] == "a100"
    # nothing else changed: the same keys and values as profiles/slurm apart from the three marked ones
    for section in ("default-resources", "set-resources"):
        for d in (got, want):
            d[section].pop("slurm_account", None)
            d[section].pop("slurm_partition", None)
            for v in d[section].values():
                if isinstance(v, dict):
                    v.pop("slurm_partition", None)
    assert got == want


def test_a_different_installed_profile_is_kept_unless_forced_and_bad_names_are_refused(tmp_path):
    dest = tmp_path / "p"
    first = install_slurm_profile(account="a", cpu_partition="c", gpu_partition="g", dest=dest)
    assert install_slurm_profile(account="a", cpu_partition="c", gpu_partition="g", dest=dest) == first
    with pytest.raises(ConfigError, match="already installed"):
        install_slurm_profile(account="b", cpu_partition="c", gpu_partition="g", dest=dest)
    install_slurm_profile(account="b", cpu_partition="c", gpu_partition="g", dest=dest, force=True)
    assert 'slurm_account: "b"' in first.read_text()
    with pytest.raises(ConfigError) as err:
        install_slurm_profile(account='x" ; rm', cpu_partition="c", gpu_partition="g", dest=tmp_path / "q")
    assert err.value.field == "account" and not (tmp_path / "q").exists()
    assert os.listdir(dest) == ["config.yaml"]  # no temp file left beside it
