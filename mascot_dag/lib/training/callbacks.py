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
