"""verl's v1 trainer and Slurm's time limit (sweflow.train.verl_deadline): a step boundary whose time left is
less than a step and a save saves, leaves stopped.json and makes that step verl's last; installed on verl's
own sync trainer class."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace

from sweflow.train.preempt import STOPPED, StopClock
from sweflow.train.verl_deadline import install_deadline


class FakeTrainer:
    """The attributes and the loop of verl's v1 `PPOTrainer.fit` that the rule reads (see the last test)."""

    def __init__(self, work: Path, total: int, save_freq: int, clock: list[float]) -> None:
        self.config = SimpleNamespace(trainer=SimpleNamespace(save_freq=save_freq,
                                                              default_local_dir=str(work / "checkpoints")))  # fmt: skip
        self.global_steps, self.total_training_steps = 0, total
        self.clock, self.saves, self.logged, self.timing_raw = clock, [], [], {}

    def _save_checkpoint(self) -> None:
        self.saves.append(self.global_steps)
        self.clock[0] += 20.0

    def on_step_end(self) -> None:  # verl's sync trainer pushes the new weights to the rollout replicas here
        return None

    def fit(self) -> None:
        self.global_steps += 1
        while self.global_steps <= self.total_training_steps:
            is_last_step = self.global_steps >= self.total_training_steps
            self.timing_raw = {}
            self.clock[0] += 100.0  # the step's rollouts and update
            freq = self.config.trainer.save_freq
            if freq > 0 and (is_last_step or self.global_steps % freq == 0):
                t0 = self.clock[0]
                self._save_checkpoint()
                self.timing_raw["save_checkpoint"] = self.clock[0] - t0
            self.on_step_end()
            self.logged.append(self.global_steps)
            self.global_steps += 1
            if is_last_step:
                return


def _run(tmp_path: Path, *, total: int, save_freq: int, limit_s: float) -> FakeTrainer:
    clock = [0.0]

    class Trainer(FakeTrainer):
        pass

    Trainer.on_step_end = FakeTrainer.on_step_end  # its own attribute, as verl's subclass has
    install_deadline(Trainer, lambda: StopClock("7", time_left=lambda _: limit_s - clock[0],
                                                clock=lambda: clock[0]))  # fmt: skip
    t = Trainer(tmp_path, total, save_freq, clock)
    t.fit()
    return t


def test_a_step_boundary_too_close_to_the_limit_saves_and_ends_the_loop(tmp_path):
    t = _run(tmp_path, total=20, save_freq=5, limit_s=740.0)
    # steps of 100 s: after step 5 (its own save, 20 s) 520 s are used; after step 6, 620 s: 120 s left,
    # less than 1.25 x (100 + 20) + 5 = 155 s, so step 6 saves (not a save step) and is the last
    assert t.saves == [5, 6] and t.logged == [1, 2, 3, 4, 5, 6] and t.total_training_steps == 6
    stop = json.loads((tmp_path / STOPPED).read_text())
    assert stop["step"] == 6 and "left before Slurm's time limit" in stop["why"]


def test_a_save_step_is_not_saved_twice_and_a_run_that_fits_is_untouched(tmp_path):
    t = _run(tmp_path / "a", total=20, save_freq=2, limit_s=740.0)
    assert t.saves == [2, 4, 6] and t.logged[-1] == 6  # step 6 saved on its own
    t = _run(tmp_path / "b", total=4, save_freq=2, limit_s=10_000.0)
    assert t.saves == [2, 4] and t.logged == [1, 2, 3, 4] and not (tmp_path / "b" / STOPPED).exists()


def test_installed_on_verls_sync_trainer_whose_loop_reads_its_bound_each_step():
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    import sweflow.train.verl_advantage  # noqa: F401  (installs, as $VERL_USE_EXTERNAL_MODULES does)

    assert getattr(PPOTrainerSync.on_step_end, "_sweflow_deadline", False)
    before = PPOTrainerSync.on_step_end
    install_deadline(PPOTrainerSync)
    assert PPOTrainerSync.on_step_end is before  # once
    src = inspect.getsource(trainer_base.PPOTrainer.fit)
    # what the rule relies on: verl saves, then calls on_step_end, inside the step; the loop's bound is read
    # again before each step, and the step's metrics are logged after on_step_end
    loop = src[src.index("while current_epoch") :]
    assert "self.global_steps <= self.total_training_steps" in loop.split("\n", 1)[0]
    assert (
        loop.index("self._save_checkpoint()")
        < loop.index("self.on_step_end()")
        < loop.index("self.logger.log(data=metrics")
    )
