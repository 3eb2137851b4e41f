"""Library console noise, silenced at its source (for `mascot demo`; runs in the UI log the same).

What a lineage run printed besides our own lines (measured on the tiny profile): progress bars of
datasets' `map` ("Tokenizing train dataset"), of transformers' weight loading, of MLflow's artifact
downloads and of the embedded model's first GGUF conversion; transformers' load reports (the reward
model's new `score.weight`, expected); transformers' FutureWarning that `is_gradient_checkpointing`
is deprecated (raised inside transformers, not by our calls); MLflow's INFO lines about creating
its tables. Each is turned off by its own switch; warnings of other categories and from our own
code still show. Call it before the libraries are imported: they read these variables at import
time.
"""

from __future__ import annotations

import os
import warnings

ENV = {
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",  # datasets' map/filter bars
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" bar follows this
    "TRANSFORMERS_VERBOSITY": "error",  # load reports are logged as warnings
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    # transformers' one-time GGUF conversion bar (a bare tqdm, deaf to the HF switches above)
    "TQDM_DISABLE": "1",
}


def quiet_libraries() -> None:
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    # Deprecations inside transformers' own code paths (our calls use the new names already).
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
