"""The MASCOT paper's published scores (`mascot_dag/data/paper/results.csv`, see its README).

Only the reading lives here: the report draws our numbers beside these. Method names are mapped
to ours, so a row of the paper and a row of eval_scores name a method the same way.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import polars as pl

# The paper's method labels -> our eval method names (lib/evaluation/methods.py).
PAPER_METHODS = {
    "MASCOT": "mascot",
    "Zero-Shot": "zero_shot",
    "ZS CoT": "zero_shot_cot",
    "Few-Shot": "few_shot",
    "FS+CoT": "few_shot_cot",
    "SFT": "sft",
    "Self-Consistency": "self_consistency",
    "MultiAgentESC": "multiagent_esc",
}
COLUMNS = ["level", "dataset", "split", "method", "criterion", "score_0_100"]


def results_path() -> Path:
    return Path(str(resources.files("mascot_dag") / "data" / "paper" / "results.csv"))


def published_table(path: Path | None = None) -> pl.DataFrame:
    """The published table with `method` in our names (unknown labels raise: a silent drop would
    hide a method from the comparison)."""
    path = path or results_path()
    df = pl.read_csv(path, infer_schema_length=None)
    missing = set(COLUMNS) - set(df.columns)
    if missing:
        raise ValueError(f"{path}: paper results lack columns {sorted(missing)}")
    unknown = set(df["method"].to_list()) - set(PAPER_METHODS)
    if unknown:
        raise ValueError(f"{path}: paper results name unknown methods {sorted(unknown)}; map them "
                         "in paper.PAPER_METHODS")
    return df.select(COLUMNS).with_columns(
        pl.col("method").replace_strict(PAPER_METHODS),
        pl.col("score_0_100").cast(pl.Float64))
