"""Human evaluation (group `evaluation`): the blind ratings people gave through `mascot rate`.

The rows are written by the rating page, not by this asset (people rate whenever they like); the
asset reads them so the lineage records how many there were and what they say when the report
was built. No ratings is a normal state: it materialises with `ratings: 0`, never fails.
"""

import dagster as dg
import polars as pl

from mascot_dag.assets.common import cluster_tags, materialized, table_metadata
from mascot_dag.resources.store import DuckDBStore


@dg.asset(op_tags=cluster_tags("human_ratings"),
          group_name="evaluation", deps=["three_way_comparisons"], kinds={"duckdb"})
def human_ratings(store: DuckDBStore) -> dg.MaterializeResult:
    """Blind three-way human ratings (`human_ratings`, `human_choices`): counts, per-method means,
    Krippendorff's alpha per criterion."""
    from mascot_dag.lib.evaluation.human_stats import method_means, rater_agreement

    ratings = store.frame("SELECT * FROM human_ratings ORDER BY item_id, rater, shown_position")
    choices = store.frame("SELECT * FROM human_choices")
    if ratings.is_empty():
        return materialized(metadata={
            "dagster/row_count": 0, "ratings": 0, "raters": 0, "items": 0,
            "note": "nobody rated yet: run `mascot rate` and share http://127.0.0.1:8020/"})
    means = method_means(ratings, n_boot=200)
    overall = means.filter(pl.col("criterion") == "all")
    alpha = rater_agreement(ratings)
    return materialized(metadata=table_metadata(
        ratings.drop("submitted_at", strict=False),
        ratings=len(ratings), raters=ratings["rater"].n_unique(),
        items=ratings["item_id"].n_unique(), best_picks=len(choices),
        mean_1_5_by_method={m: round(v, 3) for m, v in overall.select("method", "mean").rows()},
        best_picked=dict(sorted(choices["best_method"].value_counts().rows())),
        krippendorff_alpha_ordinal={c: (None if a is None else round(a, 3))
                                    for c, a in alpha.select("criterion", "alpha").rows()}))
