"""Trainer callbacks shared by the reward-model, GRPO and SFT wrappers.

This module imports transformers at the top (a callback must subclass `TrainerCallback`); only the
training functions import it, inside their bodies, so loading the Definitions stays fast.
"""

from __future__ import annotations

import time

from transformers import TrainerCallback


class StopAfterSteps(TrainerCallback):
    """Stop training after global step `n` and save a checkpoint there: a simulated interruption.

    Example: `train_grpo_adapter(..., callbacks=[StopAfterSteps(1)])` with max_steps=2 stops at
    step 1 with `checkpoints/checkpoint-1` on disk; calling it again without the callback resumes
    from that checkpoint and finishes at step 2.
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"StopAfterSteps(n) needs n >= 1, got {n}")
        self.n = n

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.n:
            control.should_training_stop = True
            # The Trainer saves right after on_step_end when should_save is set, so the checkpoint
            # exists even when n is not a multiple of save_steps.
            control.should_save = True
        return control


class StepTimer(TrainerCallback):
    """Wall time per optimizer step (includes GRPO's generation, which runs inside the step)."""

    def __init__(self) -> None:
        self.durations: list[float] = []
        self._t0: float | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._t0 is not None:
            self.durations.append(time.perf_counter() - self._t0)
            self._t0 = None

    @property
    def seconds_per_step(self) -> float | None:
        return sum(self.durations) / len(self.durations) if self.durations else None


class ProgressLog(StepTimer):
    """A line per optimizer step through `log` (the assets pass Dagster's `context.log.info`):
    step/max, seconds per step (StepTimer's, so a resumed run times only its own steps), time
    left, and the step's loss / reward / KL. A study-size GRPO run trains for 10-45 min on CPU;
    without this its Dagster run log says nothing between "step started" and "step succeeded"."""

    KEYS = ("loss", "reward", "kl", "eval_loss")

    def __init__(self, log, name: str) -> None:
        super().__init__()
        self.log, self.name = log, name
        self._last = -1

    def on_log(self, args, state, control, logs=None, **kwargs):
        # the Trainer logs once more at the end (its train summary) on the same step
        step, total, per = state.global_step, state.max_steps, self.seconds_per_step
        if step == self._last or per is None:
            return
        self._last = step
        values = ", ".join(f"{k} {logs[k]:.4g}" for k in self.KEYS
                           if isinstance((logs or {}).get(k), int | float))
        self.log(f"{self.name}: step {step}/{total}, {per:.1f} s/step, "
                 f"~{per * (total - step) / 60:.1f} min left" + (f"; {values}" if values else ""))
