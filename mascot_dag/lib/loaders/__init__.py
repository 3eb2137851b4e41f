"""Loaders of human-grounded contexts (EmpatheticDialogues, QMSum) into `Context` records."""

from mascot_dag.lib.loaders.common import DataFileError, LoadResult
from mascot_dag.lib.loaders.empathetic import load_empathetic_dialogues
from mascot_dag.lib.loaders.qmsum import load_qmsum

__all__ = ["DataFileError", "LoadResult", "load_empathetic_dialogues", "load_qmsum"]
