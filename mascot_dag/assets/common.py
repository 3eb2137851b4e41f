"""Small helpers shared by the asset modules: metadata that is measured, never decorative."""

import dagster as dg
import pandas as pd

from mascot_dag.lib.personas import load_personas, personas_of_set

# Stage 1 trains the emotional-support set; its persona ids are the partitions of the per-persona
# assets. Read from the packaged persona files when the code location loads (cheap YAML parsing).
SUPPORT_PERSONAS = [c.persona_id for c in personas_of_set(load_personas(), "support")]
persona_partitions = dg.StaticPartitionsDefinition(SUPPORT_PERSONAS)

def preview(df: pd.DataFrame, n: int = 5, width: int = 80) -> dg.MetadataValue:
    """A short markdown preview with long cells cut, so the UI stays readable."""
    short = df.head(n).copy()
    for col in short.columns:
        if short[col].dtype == object:
            short[col] = short[col].map(
                lambda v: (str(v)[: width - 1] + "…") if len(str(v)) > width else v
            )
    return dg.MetadataValue.md(short.to_markdown(index=False))

def table_metadata(df: pd.DataFrame, **extra) -> dict:
    schema = dg.TableSchema(
        columns=[dg.TableColumn(name=c, type=str(df[c].dtype)) for c in df.columns]
    )
    return {
        "dagster/row_count": len(df),
        "dagster/column_schema": schema,
        "preview": preview(df),
        **extra,
    }

def counts(df: pd.DataFrame, col: str) -> dict:
    return {str(k): int(v) for k, v in df[col].fillna("n/a").value_counts().sort_index().items()}


def base_model_path(chat) -> str:
    """The base policy that training starts from: the chat resource's model, converted if needed."""
    from mascot_dag.lib.home import Home
    from mascot_dag.lib.models import resolve_model

    models_dir = getattr(chat, "models_dir", "") or str(Home.from_env().models)
    return resolve_model(chat.model, models_dir)


def fingerprint(*parts) -> str:
    """Short stable hash of training inputs: a checkpoint folder is reused (resumed) only when the
    data and settings that produced it are the same."""
    import hashlib
    import json

    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def registered_name(prefix: str, persona_id: str) -> str:
    return f"{prefix}-{persona_id.replace('_', '-')}"
