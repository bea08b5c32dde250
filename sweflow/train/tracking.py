"""Experiment tracking: the `train.tracking` section as one typed setting, and sweflow's metrics as scalars.

`MetricsWriter` mirrors each `metrics.jsonl` row to TensorBoard as `sweflow/<name>` (W&B when it is on).
"""

# Both engines write the same `metrics.jsonl` names, so a TRL run and a verl run show the same tags. The
# engine's own names go beside them: TRL's `report_to` (its TensorBoard callback under `<run>/tensorboard/trl`),
# verl's `trainer.logger` (under `<run>/tensorboard/verl`, through $TENSORBOARD_DIR). Tracking is operational:
# it never changes the weights (config/keys.yaml). W&B is off unless enabled; its default mode is offline
# (files under `<run>/wandb/`, nothing sent, no key needed).

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..schema import defaults
from ..util import environ

log = logging.getLogger("sweflow.train")

TAG_PREFIX = "sweflow/"
SWEFLOW_DIR = "sweflow"  # <run>/tensorboard/sweflow: sweflow's own tags, both engines


@dataclass(frozen=True)
class Tracking:
    """Where a run's metrics go besides metrics.jsonl (`train.tracking`, schema defaults filled)."""

    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "sweflow"
    wandb_entity: str | None = None
    wandb_mode: str = "offline"

    @classmethod
    def from_config(cls, train: Mapping[str, Any] | None) -> Tracking:
        """From the `train` section (or None: the defaults)."""
        t = defaults("train.tracking", (train or {}).get("tracking"))
        w = t["wandb"]
        return cls(
            tensorboard="tensorboard" in t["backends"],
            wandb=bool(w["enabled"]),
            wandb_project=str(w["project"]),
            wandb_entity=w["entity"],
            wandb_mode=str(w["mode"]),
        )

    def checked(self) -> Tracking:
        """This setting, less TensorBoard when its package is missing (one warning line); a ConfigError when
        W&B is on without the wandb package (the user asked for it)."""
        if self.wandb and importlib.util.find_spec("wandb") is None:
            raise ConfigError(
                "W&B tracking is on but the wandb package is not installed",
                field="train.tracking.wandb.enabled",
                hint="pip install wandb, or set train.tracking.wandb.enabled: false",
            )
        if self.tensorboard and importlib.util.find_spec("tensorboard") is None:
            log.warning("TensorBoard is not installed: no event files (pip install tensorboard, or set "
                        "train.tracking.backends: [] to silence this)")  # fmt: skip
            return Tracking(False, self.wandb, self.wandb_project, self.wandb_entity, self.wandb_mode)
        return self

    def report_to(self) -> list[str]:
        """Hugging Face Trainer's `report_to` ([] - none)."""
        return [*(["tensorboard"] if self.tensorboard else []), *(["wandb"] if self.wandb else [])]

    def verl_loggers(self) -> list[str]:
        """verl's `trainer.logger`: the console and the file logger (sweflow converts its JSONL) first."""
        return ["console", "file", *self.report_to()]

    def env(self, run_dir: str | os.PathLike, engine: str) -> dict[str, str]:
        """The variables the engine's own loggers read: the TensorBoard folder (HF's TENSORBOARD_LOGGING_DIR,
        verl's TENSORBOARD_DIR) and W&B's mode, folder and project."""
        run = Path(run_dir).resolve()
        out: dict[str, str] = {}
        if self.tensorboard:
            tb = str(run / "tensorboard" / engine)
            out["TENSORBOARD_DIR" if engine == "verl" else "TENSORBOARD_LOGGING_DIR"] = tb
        if self.wandb:
            out.update(WANDB_MODE=self.wandb_mode, WANDB_DIR=str(run), WANDB_PROJECT=self.wandb_project,
                       WANDB_SILENT="true")  # fmt: skip
            if self.wandb_entity:
                out["WANDB_ENTITY"] = self.wandb_entity
        return out


tracking_env = environ  # the Trainer's callbacks read the tracking variables from the process


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """A metrics row's finite numbers as `sweflow/<name>` tags (a dict of counts one level down:
    `sweflow/<name>/<key>`); the step itself is the x axis, not a tag."""
    out: dict[str, float] = {}

    def put(tag: str, v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return
        out[TAG_PREFIX + tag] = float(v)

    for k, v in sorted(row.items()):
        if k == "step":
            continue
        if isinstance(v, Mapping):
            for kk, vv in sorted(v.items()):
                put(f"{k}/{kk}", vv)
        else:
            put(k, v)
    return out


class MetricsWriter:
    """sweflow's metrics rows -> TensorBoard scalars `sweflow/<name>` at each row's step, under
    `<run>/tensorboard/sweflow` (one writer for both engines), and the W&B run when W&B is on.

    `purge_step`: a resumed run's first step (TensorBoard hides the older file's steps from there on);
    `attach`: the run's config and dataset shas, written once as text (and W&B's run config)."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        tracking: Tracking,
        *,
        run_name: str,
        purge_step: int | None = None,
        attach: Mapping[str, Any] | None = None,
    ) -> None:
        self.tracking, self.run_name = tracking, run_name
        self.run_dir = Path(run_dir).resolve()
        self.folder = self.run_dir / "tensorboard" / SWEFLOW_DIR
        self._tb = None
        self._wandb = None
        self._own_wandb = False
        if tracking.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.folder.mkdir(parents=True, exist_ok=True)
            self._tb = SummaryWriter(str(self.folder), purge_step=purge_step)
        if tracking.wandb:
            self._wandb = self._wandb_run()
        if attach:
            self.attach(attach)

    def _wandb_run(self) -> Any:
        import wandb

        if wandb.run is None:  # verl's rows come after its run: a run of sweflow's own in the same folder
            env = self.tracking.env(self.run_dir, "sweflow")
            wandb.init(project=env["WANDB_PROJECT"], entity=self.tracking.wandb_entity, name=self.run_name,
                       dir=env["WANDB_DIR"], mode=self.tracking.wandb_mode, job_type="sweflow-metrics")  # fmt: skip
            self._own_wandb = True
        wandb.run.define_metric("sweflow/step")
        wandb.run.define_metric("sweflow/*", step_metric="sweflow/step")
        return wandb.run

    def attach(self, info: Mapping[str, Any]) -> None:
        """The run's config and dataset shas: TensorBoard text `sweflow/<key>` (JSON) and W&B's run config."""
        for key, value in sorted(info.items()):
            text = json.dumps(value, sort_keys=True, indent=1, default=str)
            if self._tb is not None:
                self._tb.add_text(TAG_PREFIX + key, "    " + text.replace("\n", "\n    "), 0)
        if self._wandb is not None:
            self._wandb.config.update({"sweflow": json.loads(json.dumps(info, default=str))},
                                      allow_val_change=True)  # fmt: skip

    def write(self, row: Mapping[str, Any]) -> None:
        """One metrics.jsonl row (its `step` is the x axis)."""
        step = int(row["step"])
        values = scalars(row)
        if self._tb is not None:
            for tag, v in values.items():
                self._tb.add_scalar(tag, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({**values, "sweflow/step": step})

    def write_all(self, rows: Sequence[Mapping[str, Any]]) -> None:
        for row in rows:
            self.write(row)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None and self._own_wandb:
            self._wandb.finish()
        self._wandb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dataset_shas(tasks: str | os.PathLike) -> list[str]:
    """The dataset commits the tasks file descends from (its provenance record); [] without a record."""
    from ..errors import ProvenanceError
    from ..provenance import load_record

    try:
        rec = load_record(tasks)
    except ProvenanceError:
        return []
    return sorted({d["sha"] for d in rec.get("datasets") or [] if d.get("sha")})


def run_info(recipe: Any, tasks: str | os.PathLike) -> dict[str, Any]:
    """What a run's tracking attaches: the recipe, the tasks file's sha256 and the dataset commits."""
    from ..util import sha256_file

    return {
        "config": recipe.to_dict(),
        "tasks_sha256": sha256_file(tasks) if Path(tasks).is_file() else None,
        "dataset_shas": dataset_shas(tasks),
    }


def write_tracking(
    metrics: str | os.PathLike,
    run_dir: str | os.PathLike,
    tracking: Tracking,
    *,
    run_name: str,
    attach: Mapping[str, Any] | None = None,
) -> int:
    """Every row of a finished metrics.jsonl through a fresh `MetricsWriter` (verl's rows exist only after
    its run: the sweflow tags are rewritten whole). Returns the rows written."""
    import shutil

    if not (tracking.tensorboard or tracking.wandb):
        return 0
    path = Path(metrics)
    rows = (
        [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
        if path.exists()
        else []
    )
    shutil.rmtree(Path(run_dir) / "tensorboard" / SWEFLOW_DIR, ignore_errors=True)
    with MetricsWriter(run_dir, tracking, run_name=run_name, attach=attach) as writer:
        writer.write_all(rows)
    return len(rows)
