"""LoRA training wrappers over TRL 1.16: reward model, GRPO adapters, SFT baseline.

Settings (pure dataclasses) are importable cheaply from here. The training functions import torch,
transformers and TRL inside their bodies; import them from their modules:

    from mascot_dag.lib.training.grpo import train_grpo_adapter
    from mascot_dag.lib.training.reward_model import RewardScorer, train_reward_model
    from mascot_dag.lib.training.sft import train_sft_adapter
    from mascot_dag.lib.training.callbacks import StopAfterSteps   # imports transformers
"""

from mascot_dag.lib.training.config import (
    GRPOSettings,
    LoraSettings,
    RewardModelSettings,
    SFTSettings,
)

__all__ = ["GRPOSettings", "LoraSettings", "RewardModelSettings", "SFTSettings"]
