"""Install the project's Slurm profile as the user's named Snakemake profile `slurm`.

`install_slurm_profile` writes profiles/slurm/config.yaml into the user's Snakemake config folder with the
three site values (account, CPU partition, GPU partition) filled in, so `snakemake --profile slurm` runs
from the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import ConfigError
from .util import atomic_write

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "profiles" / "slurm" / "config.yaml"
# the marked lines of profiles/slurm/config.yaml: `key: "value"   # <- your <what>`
MARKS = {"account": "# <- your account", "cpu_partition": "# <- your CPU partition",
         "gpu_partition": "# <- your GPU partition"}  # fmt: skip
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# Snakemake finds a named profile (`--profile slurm`) in the working folder, then the user's and the site's
# config folders (platformdirs' `snakemake` app dirs; `$XDG_CONFIG_HOME/snakemake` on Linux), never in
# `profiles/`. `install_slurm_profile` writes profiles/slurm/config.yaml there with the three site values
# (account, CPU partition, GPU partition) filled in, so `snakemake --profile slurm` runs from the repository.
def user_profile_dir(name: str = "slurm") -> Path:
    """Where Snakemake looks for the user's named profile `name`."""
    from platformdirs import AppDirs

    return Path(AppDirs("snakemake", "snakemake").user_config_dir) / name


def fill_profile(text: str, *, account: str, cpu_partition: str, gpu_partition: str) -> str:
    """profiles/slurm/config.yaml's text with the marked values replaced (comments and layout kept)."""
    values = {"account": account, "cpu_partition": cpu_partition, "gpu_partition": gpu_partition}
    for what, value in values.items():
        if not isinstance(value, str) or not NAME.fullmatch(value):
            raise ConfigError(f"{value!r} is not a Slurm name", field=what, hint="letters, digits, _ . -")
    out, seen = [], set()
    for line in text.splitlines(keepends=True):
        for what, mark in MARKS.items():
            if mark in line:
                line = re.sub(r':\s*"[^"]*"', f': "{values[what]}"', line, count=1)
                seen.add(what)
        out.append(line)
    missing = sorted(set(MARKS) - seen)
    if missing:
        raise ConfigError(f"the profile has no marked line for {', '.join(missing)}", file=str(SOURCE))
    return "".join(out)


def install_slurm_profile(
    *,
    account: str,
    cpu_partition: str,
    gpu_partition: str,
    dest: str | Path | None = None,
    force: bool = False,
) -> Path:
    """Write the filled-in profile to `dest` (default: the user's named profile `slurm`); returns the
    config file. An existing profile that differs is kept unless `force`."""
    folder = Path(dest) if dest is not None else user_profile_dir()
    target = folder / "config.yaml"
    header = f"# Installed by `sweflow slurm-profile` from {SOURCE}; rerun it to change the values.\n"
    text = header + fill_profile(
        SOURCE.read_text(encoding="utf-8"),
        account=account,
        cpu_partition=cpu_partition,
        gpu_partition=gpu_partition,
    )
    if target.exists() and target.read_text(encoding="utf-8") != text and not force:
        raise ConfigError(
            "a different Snakemake profile is already installed there",
            file=str(target),
            hint="pass --force to replace it",
        )
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(target, text)
    return target
