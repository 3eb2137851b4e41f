"""The asset graph of the lineage: every asset and check, loaded from the asset modules.

The code location (`definitions`), the runs of `mascot demo` (`pipeline`) and the sensors'
fallback graph (`automation`) all build on these lists; only this module imports the asset
modules together, so none of them imports another.
"""

from __future__ import annotations

import dagster as dg

from mascot_dag.assets import (
    alignment,
    collaboration,
    contexts,
    director_eval,
    evaluation,
    feedback,
    human,
    personas,
    probe,
    reward_model,
)

ASSET_MODULES = [contexts, personas, feedback, reward_model, alignment, probe, collaboration,
                 director_eval, evaluation, human]

all_assets = dg.load_assets_from_modules(ASSET_MODULES)
all_checks = dg.load_asset_checks_from_modules(ASSET_MODULES)
