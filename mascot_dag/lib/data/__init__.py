"""Inputs: the context loaders (EmpatheticDialogues, QMSum), splits, persona cards, simulated
users, the inbox.

The loaders of human-grounded contexts (EmpatheticDialogues, QMSum) into `Context` records
are re-exported here."""

from mascot_dag.lib.data.empathetic import load_empathetic_dialogues
from mascot_dag.lib.data.loading import DataFileError, LoadResult
from mascot_dag.lib.data.qmsum import load_qmsum

__all__ = ["DataFileError", "LoadResult", "load_empathetic_dialogues", "load_qmsum"]
