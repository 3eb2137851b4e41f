"""Software-defined assets, one module per lineage stage.

Thin: the logic lives in mascot_dag.lib."""
