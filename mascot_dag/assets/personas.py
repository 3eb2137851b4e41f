"""`persona_cards` and `persona_prompts`: the validated persona files and their system prompts."""

import dagster as dg
import polars as pl

from mascot_dag.assets.common import (
    DUCKDB_POOL,
    TRANSIENT_RETRY,
    cluster_tags,
    counts,
    input_errors_fail_at_once,
    materialized,
    table_metadata,
)
from mascot_dag.lib.data.personas import (
    PROMPT_STYLES,
    load_personas_with_files,
    persona_dir,
    personas_of_set,
    system_prompt,
)
from mascot_dag.lib.storage.tables import card_from_row, personas_frame
from mascot_dag.resources.store import DuckDBStore


@dg.asset(op_tags=cluster_tags("persona_cards"),
          group_name="personas", kinds={"duckdb", "yaml"},
          pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY)
def persona_cards(store: DuckDBStore) -> dg.MaterializeResult:
    """Every persona card of the persona folder (mascot_dag/personas/*.yaml, or
    $MASCOT_PERSONAS_DIR), validated (errors name file, persona and field). A bad folder fails
    before anything is written: the stored cards stay."""
    with input_errors_fail_at_once():  # a bad persona file fails the same way when retried
        cards, files = load_personas_with_files(persona_dir())
    df = personas_frame(cards, files)
    store.replace("personas", df)
    return materialized(
        metadata=table_metadata(df.select("persona_id", "persona_set", "name", "role"),
                                by_set=counts(df, "persona_set"))
    )

@dg.asset(op_tags=cluster_tags("persona_prompts"),
          group_name="personas", deps=[persona_cards], kinds={"duckdb"},
          pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY)
def persona_prompts(store: DuckDBStore) -> dg.MaterializeResult:
    """The system prompt of each persona for each prompting style (roster = its own set)."""
    cards = [card_from_row(r) for r in store.frame("SELECT * FROM personas").to_dicts()]
    rows = []
    for card in cards:
        roster = personas_of_set(cards, card.persona_set)
        for style in PROMPT_STYLES:
            rows.append(
                {"persona_id": card.persona_id, "style": style,
                 "system_prompt": system_prompt(card, style, roster)}
            )
    df = pl.DataFrame(rows)
    store.replace("persona_prompts", df)
    return materialized(
        metadata=table_metadata(df, by_style=counts(df, "style"),
                                mean_prompt_chars=float(df["system_prompt"].str.len_chars().mean()))
    )
