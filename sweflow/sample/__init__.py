"""The embedded sample: the `sweflow/calclib` repository, its tasks and datasets in both row shapes.

`materialize_repo` builds the repository (deterministic shas), `sample_rows`/`skyrl_rows` give the rows,
`write_parquet` writes byte-stable parquet; a typical use is shown above `__all__`.
"""

from sweflow.sample.repo import HISTORY, REPO_NAME, RepoInfo, apply_patch, clone_at, materialize_repo
from sweflow.sample.tasks import (
    DATA_SOURCE,
    EXTRA_ID,
    HARNESS_EXT,
    HARNESS_PARSERS,
    HARNESS_SPECS,
    RAW_COLUMNS,
    SPLITS,
    extra_task,
    instance_ids,
    load_task,
    numbered_rows,
    parquet_bytes,
    sample_rows,
    skyrl_rows,
    to_skyrl,
    write_parquet,
    write_sample_dataset,
)

# Typical use:
#     info = materialize_repo(tmp / "calclib")        # real git repo, deterministic shas
#     rows = sample_rows("train")                      # raw SWE-Gym rows
#     write_parquet(skyrl_rows("validation"), path)    # byte-stable parquet
__all__ = [
    "DATA_SOURCE",
    "EXTRA_ID",
    "HARNESS_EXT",
    "HARNESS_PARSERS",
    "HARNESS_SPECS",
    "HISTORY",
    "RAW_COLUMNS",
    "REPO_NAME",
    "SPLITS",
    "RepoInfo",
    "apply_patch",
    "clone_at",
    "extra_task",
    "instance_ids",
    "load_task",
    "numbered_rows",
    "materialize_repo",
    "parquet_bytes",
    "sample_rows",
    "skyrl_rows",
    "to_skyrl",
    "write_parquet",
    "write_sample_dataset",
]
